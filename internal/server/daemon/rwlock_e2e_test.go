package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// Read/write locks through the SDK and REST: read grants are held
// together, a writer waits for them and holds alone, REST shows each
// entry's mode, and a read grant cannot make fenced writes.
func TestReadWriteLocksThroughSDKAndREST(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	newSession := func() *clientlib.Session {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b, w := newSession(), newSession(), newSession()
	ra, err := a.RLock(ctx, "rw/db")
	if err != nil {
		t.Fatal(err)
	}
	// Over REST, as another reader.
	info, err := c.Admin().CreateSession(ctx, time.Minute, "rest", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := call(t, http.MethodPost, base+"/v1/locks:tryAcquire", fmt.Sprintf(`{"name":"rw/db","sessionId":"%s","read":true}`, info.ID))
	grant, _ := r.body["grant"].(map[string]any)
	if r.status != http.StatusOK || grant["read"] != true {
		t.Fatalf("a REST read try-lock beside an SDK reader: %d %v", r.status, r.body)
	}
	if _, err := ra.Put(ctx, "rw/k", []byte("v")); !errors.Is(err, clientlib.ErrNotHolder) {
		t.Fatalf("a fenced write with a read grant: %v, want ErrNotHolder", err)
	}

	wrote := make(chan error, 1)
	go func() {
		wrote <- clientlib.RunLocked(ctx, w, "rw/db", func(ctx context.Context, l *clientlib.Lock) error {
			if l.Read() {
				return errors.New("RunLocked gave a read grant")
			}
			_, err := l.Put(ctx, "rw/k", []byte("written"))
			return err
		})
	}()
	wait.For(t, "the writer to queue behind the readers", func() bool {
		r := call(t, http.MethodGet, base+"/v1/locks/rw/db", "")
		hs, _ := r.body["holders"].([]any)
		ws, _ := r.body["waiters"].([]any)
		if len(hs) != 2 || len(ws) != 1 {
			return false
		}
		for _, h := range hs {
			if h.(map[string]any)["read"] != true {
				t.Fatalf("a reader holding without read: %v", r.body)
			}
		}
		return ws[0].(map[string]any)["read"] == false
	})
	// A reader after the queued writer waits for it (FIFO across modes).
	read := make(chan error, 1)
	go func() {
		read <- clientlib.RunReadLocked(ctx, b, "rw/db", func(ctx context.Context, l *clientlib.Lock) error {
			if !l.Read() {
				return errors.New("RunReadLocked gave a write grant")
			}
			kv, _, err := c.KV().Get(ctx, "rw/k", 0)
			if err != nil || string(kv.Value) != "written" {
				return fmt.Errorf("the reader after the writer read %q, %w; want the writer's value", kv.Value, err)
			}
			return nil
		})
	}()
	wait.For(t, "the second reader to queue behind the writer", func() bool {
		r := call(t, http.MethodGet, base+"/v1/locks/rw/db", "")
		ws, _ := r.body["waiters"].([]any)
		return len(ws) == 2
	})
	if err := ra.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := call(t, http.MethodPost, base+"/v1/locks:release", fmt.Sprintf(`{"name":"rw/db","token":"%s","sessionId":"%s"}`, grant["token"], info.ID)); r.status != http.StatusOK {
		t.Fatalf("REST release: %d %v", r.status, r.body)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the writer: %v", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the reader after the writer: %v", err)
	}
}
