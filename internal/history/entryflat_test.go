package history_test

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/history"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// What the lock and election packages write (every field they set: a
// lock-delay, metadata, a limit, a read grant, a grant after a wait, a
// priority, a proclamation's id) is decoded without encoding/json: the
// recorder decodes every entry etcd commits.
func TestEntriesAsWrittenDecodeFlat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	alice, bob := e.session(t, "alice"), e.session(t, "bob")
	for _, req := range []lock.Request{
		{Name: "flat/delay", Session: alice, RequestID: "r-1", Metadata: "batch job 7", LockDelay: 5 * time.Second},
		{Name: "flat/sem", Session: alice, Limit: 3},
		{Name: "flat/rw", Session: alice, Read: true},
	} {
		if _, err := e.locks.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	first, err := e.locks.Acquire(ctx, lock.Request{Name: "flat/wait", Session: alice})
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		_, err := e.locks.Acquire(ctx, lock.Request{Name: "flat/wait", Session: bob})
		granted <- err
	}()
	wait.For(t, "bob to queue", func() bool {
		d, err := e.locks.Describe(ctx, "flat/wait")
		return err == nil && len(d.Waiters) == 1
	})
	if err := e.locks.Release(ctx, "flat/wait", first.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	l, err := e.elections.Campaign(ctx, election.Request{Name: "flat/e", Session: alice, Value: "10.0.0.1:80", Priority: -2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.elections.Proclaim(ctx, "flat/e", l.Term, "10.0.0.2:80", "p-1"); err != nil {
		t.Fatal(err)
	}

	resp, err := e.cli.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		// The entries the recorder reads: locks' queues, elections' seats.
		lockEntry := strings.HasPrefix(key, root+"lock/flat") && strings.Contains(key, "/q/")
		seat := strings.HasPrefix(key, root+"election/flat") && strings.Contains(key, "/lead/")
		if !lockEntry && !seat {
			continue
		}
		entries++
		if !history.DecodesFlat(kv.Value) {
			t.Errorf("the recorder decodes %s with encoding/json: %s", key, kv.Value)
		}
	}
	if entries != 5 {
		t.Fatalf("found %d lock entries and seats, want 5 (three holders, bob's grant after a wait, the seat)", entries)
	}
}
