package daemon_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// What fenced writes wrote reads back through the SDK and REST: Get at
// the latest or an older revision, List in pages of one snapshot, Watch
// from a revision with every put and delete in order and nothing a stale
// token tried; bad input and a compacted revision get clear errors.
func TestFencedKVReads(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "kv/owner")
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) int64 {
		t.Helper()
		rev, err := l.Put(ctx, key, []byte(value))
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	r1 := put("app/a", "1")
	w := c.KV().Watch(ctx, "app/", r1) // from the first write: a replay, then live
	r2 := put("app/a", "2")
	put("app/b", "x")
	put("app/c", "y")
	put("other/z", "z")

	kv, rev, err := c.KV().Get(ctx, "app/a", 0)
	if err != nil || string(kv.Value) != "2" || kv.ModRevision != r2 || kv.CreateRevision != r1 || kv.Version != 2 || rev < r2 {
		t.Fatalf("Get app/a = %+v at %d, %v; want value 2, created at %d, written at %d, version 2", kv, rev, err, r1, r2)
	}
	if old, _, err := c.KV().Get(ctx, "app/a", r1); err != nil || string(old.Value) != "1" {
		t.Fatalf("Get app/a at revision %d = %+v, %v; want value 1", r1, old, err)
	}
	if _, _, err := c.KV().Get(ctx, "app/none", 0); !errors.Is(err, clientlib.ErrKeyNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrKeyNotFound", err)
	}
	if _, _, err := c.KV().Get(ctx, "bad\x01key", 0); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Fatalf("Get of a key with a control character: %v, want ErrInvalidArgument", err)
	}

	// Pages of one: one snapshot, in key order, even with a write between
	// pages.
	var keys []string
	o := clientlib.ListOptions{PageSize: 1}
	for {
		p, err := c.KV().List(ctx, "app/", o)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range p.KVs {
			keys = append(keys, kv.Key+"="+string(kv.Value))
		}
		if p.Next == "" {
			break
		}
		if o.Revision == 0 {
			put("app/b", "changed after the first page")
		}
		o.PageToken, o.Revision = p.Next, p.Revision
	}
	if fmt.Sprint(keys) != "[app/a=2 app/b=x app/c=y]" {
		t.Fatalf("List app/ in pages of one = %v", keys)
	}
	if _, err := c.KV().List(ctx, "other/", clientlib.ListOptions{PageToken: o.PageToken}); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Fatalf("a page token of another prefix: %v, want ErrInvalidArgument", err)
	}

	// A stale token writes nothing; a delete is seen.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin().FencedPut(ctx, l.Fence(), "app/a", []byte("stale")); !errors.Is(err, clientlib.ErrStaleToken) && !errors.Is(err, clientlib.ErrNotHolder) {
		t.Fatalf("a put with a released token: %v", err)
	}
	l2, err := s.Lock(ctx, "kv/owner")
	if err != nil {
		t.Fatal(err)
	}
	rDel, err := c.Admin().FencedDelete(ctx, l2.Fence(), "app/c")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PUT app/a=1", "PUT app/a=2", "PUT app/b=x", "PUT app/c=y", "PUT app/b=changed after the first page", "DELETE app/c"}
	var got []string
	var last int64
	for len(got) < len(want) {
		select {
		case ev := <-w.Events():
			if ev.KV.ModRevision <= last {
				t.Fatalf("watch went back: revision %d after %d", ev.KV.ModRevision, last)
			}
			last = ev.KV.ModRevision
			if ev.Deleted {
				got = append(got, "DELETE "+ev.KV.Key)
			} else {
				got = append(got, "PUT "+ev.KV.Key+"="+string(ev.KV.Value))
			}
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatalf("watch: %v after 10s, want %v (%v)", got, want, w.Err())
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || last != rDel {
		t.Fatalf("watch app/ from %d = %v (last at %d), want %v (the delete at %d)", r1, got, last, want, rDel)
	}

	// REST: the same reads, 64-bit numbers as strings, values in base64.
	code, body := get(t, base+"/v1/kv/app/a")
	var one struct {
		KV struct {
			Key, Value, ModRevision string
		} `json:"kv"`
	}
	if err := json.Unmarshal([]byte(body), &one); code != http.StatusOK || err != nil || one.KV.Key != "app/a" || one.KV.Value != base64.StdEncoding.EncodeToString([]byte("2")) || one.KV.ModRevision != strconv.FormatInt(r2, 10) {
		t.Fatalf("GET /v1/kv/app/a: %d %s", code, body)
	}
	if code, body := get(t, base+"/v1/kv/app/none"); code != http.StatusNotFound {
		t.Fatalf("GET of a missing key: %d %s, want 404", code, body)
	}
	code, body = get(t, base+"/v1/kv?prefix=app/&pageSize=2")
	var page struct {
		KVs  []struct{ Key string } `json:"kvs"`
		Next string                 `json:"nextPageToken"`
	}
	if err := json.Unmarshal([]byte(body), &page); code != http.StatusOK || err != nil || len(page.KVs) != 2 || page.KVs[0].Key != "app/a" || page.Next != "" {
		t.Fatalf("GET /v1/kv?prefix=app/&pageSize=2 (two keys left): %d %s", code, body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/kv:watch?prefix=app/&fromRevision=%d", base, rDel), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	// The first line says where the watch starts; the second is the delete.
	type watchLine struct {
		Result struct {
			Events []struct {
				Type string
				KV   struct{ Key, ModRevision string }
			}
			Revision string
		}
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []watchLine
	for len(lines) < 2 && sc.Scan() {
		var l watchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("GET /v1/kv:watch: line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	del := strconv.FormatInt(rDel, 10)
	if len(lines) != 2 || len(lines[0].Result.Events) != 0 || len(lines[1].Result.Events) != 1 ||
		lines[1].Result.Events[0].Type != "KV_EVENT_TYPE_DELETE" || lines[1].Result.Events[0].KV.Key != "app/c" ||
		lines[1].Result.Events[0].KV.ModRevision != del || lines[1].Result.Revision != del {
		t.Fatalf("GET /v1/kv:watch from the delete (revision %s): %+v (%v)", del, lines, sc.Err())
	}

	// A compacted revision: the watch says so, and does not retry.
	compact(t, cfg.EtcdClientURL, strconv.FormatInt(rDel, 10))
	old := c.KV().Watch(ctx, "app/", r1)
	for range old.Events() {
		t.Fatal("an event from a compacted revision")
	}
	if !errors.Is(old.Err(), clientlib.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %v, want ErrCompacted", old.Err())
	}
	if code, body := get(t, fmt.Sprintf("%s/v1/kv/app/a?revision=%d", base, r1)); code != http.StatusGone {
		t.Fatalf("GET at a compacted revision: %d %s, want 410", code, body)
	}
}
