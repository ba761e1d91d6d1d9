package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// Sets of locks named in opposite orders, taken again and again by
// concurrent sessions, never deadlock (each call gets its whole set well
// within its wait) and never overlap. Without the server's ordering,
// the first pair of calls that each took one lock would wait for the
// other's until their wait ran out.
func TestLockAllNeverDeadlocks(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	orders := [][]string{{"set/a", "set/b", "set/c"}, {"set/c", "set/b", "set/a"}, {"set/b", "set/c"}, {"set/c", "set/a"}}
	var overlaps, grants atomic.Int32
	held := map[string]*atomic.Int32{"set/a": {}, "set/b": {}, "set/c": {}}
	var wg sync.WaitGroup
	errs := make(chan error, len(orders))
	for i, names := range orders {
		c := newClient(t, d.GRPCAddr())
		s, err := c.NewSession(t.Context(), clientlib.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range 25 {
				ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(5*time.Second))
				set, err := s.LockAll(ctx, names)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("client %d, %v: %w", i, names, err)
					return
				}
				for _, l := range set.Locks() {
					if held[l.Name()].Add(1) > 1 {
						overlaps.Add(1)
					}
				}
				grants.Add(1)
				for _, l := range set.Locks() {
					held[l.Name()].Add(-1)
				}
				if err := set.Release(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() > 0 {
		t.Fatalf("%d times a lock of a set was held by two sets at once", overlaps.Load())
	}
	t.Logf("%d sets granted", grants.Load())
}

// All or nothing: a set with one lock held elsewhere fails when its wait
// runs out, leaving none of its locks held or queued; once free, the set
// is granted with one token per lock, each valid, and released as one.
func TestLockAllIsAllOrNothing(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s1, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s2.Lock(ctx, "aon/b")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s1.LockAll(wctx, []string{"aon/c", "aon/b", "aon/a"})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockAll behind a held lock: %v, want the wait to run out", err)
	}
	for _, n := range []string{"aon/a", "aon/b", "aon/c"} {
		st, err := c.Admin().DescribeLock(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range append(st.Holders, st.Waiters...) {
			if h.SessionID == s1.ID() {
				t.Errorf("%s: the failed set left %+v behind", n, h)
			}
		}
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	set, err := s1.LockAll(ctx, []string{"aon/c", "aon/b", "aon/a"}, clientlib.WithMetadata("batch 7"))
	if err != nil {
		t.Fatal(err)
	}
	locks := set.Locks()
	if len(locks) != 3 || locks[0].Name() != "aon/a" || locks[2].Name() != "aon/c" || set.Lock("aon/b") == nil {
		t.Fatalf("set: %v, want aon/a, aon/b, aon/c", locks)
	}
	for _, l := range locks {
		if err := l.Validate(ctx); err != nil {
			t.Errorf("%s's token %d: %v", l.Name(), l.Token(), err)
		}
	}
	if _, err := s2.TryLock(ctx, "aon/a"); !errors.Is(err, clientlib.ErrLockHeld) {
		t.Errorf("TryLock of a lock in the set: %v, want ErrLockHeld", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if set.Context().Err() == nil {
		t.Error("the set's context lives on after Release")
	}
	l, err := s2.TryLock(ctx, "aon/a")
	if err != nil {
		t.Fatalf("TryLock after the set's release: %v", err)
	}
	_ = l.Release(ctx)

	// Refused at once: a name twice, a semaphore, no names.
	for _, tc := range []struct {
		names []string
		opts  []clientlib.LockOption
	}{{[]string{"aon/x", "aon/x"}, nil}, {[]string{"aon/x"}, []clientlib.LockOption{clientlib.WithLimit(2)}}, {nil, nil}} {
		if _, err := s1.LockAll(ctx, tc.names, tc.opts...); !errors.Is(err, clientlib.ErrInvalidArgument) {
			t.Errorf("LockAll(%v): %v, want ErrInvalidArgument", tc.names, err)
		}
	}
}

// Over REST: one call, grants sorted by name with a token each; retried
// with the same request id, the same grants.
func TestLockAllOverREST(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	sess := restSession(t, base)
	body := `{"sessionId":"` + sess + `","names":["rest/z","rest/a"],"requestId":"job-1","wait":"5s"}`
	r := call(t, "POST", base+"/v1/locks:acquireAll", body)
	if r.status != 200 {
		t.Fatalf("acquireAll = %d %v", r.status, r.body)
	}
	grants := r.body["grants"].([]any)
	if len(grants) != 2 || grants[0].(map[string]any)["name"] != "rest/a" || grants[1].(map[string]any)["name"] != "rest/z" {
		t.Fatalf("grants %v, want rest/a then rest/z", grants)
	}
	again := call(t, "POST", base+"/v1/locks:acquireAll", body)
	if again.status != 200 || fmt.Sprint(again.body["grants"]) != fmt.Sprint(grants) {
		t.Fatalf("a retry with the same request id = %d %v, want the same grants %v", again.status, again.body, grants)
	}
	bad := call(t, "POST", base+"/v1/locks:acquireAll", `{"sessionId":"`+sess+`","names":["rest/a","rest/a"]}`)
	if bad.status != 400 || !strings.Contains(fmt.Sprint(bad.body), "named twice") {
		t.Fatalf("a name twice = %d %v, want 400 saying so", bad.status, bad.body)
	}
}
