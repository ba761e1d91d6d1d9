package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// Readers share a lock, a writer holds it alone, and the queue is FIFO
// across modes: a queued writer keeps later readers out, so neither side
// starves. Describe shows each entry's mode; only a write grant may make
// fenced writes.
func TestReadersShareWritersWaitInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	acquire := func(read bool) (lock.Grant, error) {
		return e.m.Acquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 60), Read: read})
	}
	r1, err := acquire(true)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := acquire(true)
	if err != nil {
		t.Fatalf("a second reader beside a reader: %v", err)
	}
	if !r1.Read || !r2.Read {
		t.Fatalf("read grants not marked read: %+v %+v", r1, r2)
	}
	type result struct {
		g   lock.Grant
		err error
	}
	w, r3 := make(chan result, 1), make(chan result, 1)
	go func() { g, err := acquire(false); w <- result{g, err} }()
	wait.For(t, "the writer to queue", func() bool {
		d, err := e.m.Describe(ctx, "rw")
		return err == nil && len(d.Waiters) == 1
	})
	go func() { g, err := acquire(true); r3 <- result{g, err} }()
	wait.For(t, "the reader behind the writer to queue", func() bool {
		d, err := e.m.Describe(ctx, "rw")
		return err == nil && len(d.Waiters) == 2
	})
	d, err := e.m.Describe(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Holders) != 2 || !d.Holders[0].Read || !d.Holders[1].Read || d.Waiters[0].Read || !d.Waiters[1].Read {
		t.Fatalf("describe: holders %+v, waiters %+v; want two readers holding, a writer then a reader waiting", d.Holders, d.Waiters)
	}
	if n, err := e.m.Count(ctx); err != nil || n != (lock.Counts{Locks: 1, Holders: 2, Waiters: 2}) {
		t.Fatalf("Count = %+v, %v; want 1 lock, 2 holders (the readers), 2 waiters", n, err)
	}
	if _, err := e.m.FencedPut(ctx, e.m, "rw", r1.Token, "rw/k", "v"); !errors.Is(err, lock.ErrNotHolder) {
		t.Fatalf("a fenced write with a read grant: %v, want ErrNotHolder", err)
	}

	// notYet checks that the etcd state grants nothing to the waiters (so
	// no Acquire may return) and that none has.
	notYet := func(holders, waiters int, what string) {
		t.Helper()
		d, err := e.m.Describe(ctx, "rw")
		if err != nil || len(d.Holders) != holders || len(d.Waiters) != waiters {
			t.Fatalf("%s: %d holders, %d waiters (%v); want %d, %d", what, len(d.Holders), len(d.Waiters), err, holders, waiters)
		}
		select {
		case r := <-w:
			t.Fatalf("%s: the writer was granted (%+v, %v)", what, r.g, r.err)
		case r := <-r3:
			t.Fatalf("%s: the last reader was granted (%+v, %v)", what, r.g, r.err)
		default:
		}
	}
	if err := e.m.Release(ctx, "rw", r1.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	notYet(1, 2, "one of two readers released")
	if err := e.m.Release(ctx, "rw", r2.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	rw := <-w
	if rw.err != nil || rw.g.Read || rw.g.Token <= r2.Token {
		t.Fatalf("the writer after both readers: %+v, %v; want a write grant with a greater token", rw.g, rw.err)
	}
	if _, err := e.m.FencedPut(ctx, e.m, "rw", rw.g.Token, "rw/k", "v"); err != nil {
		t.Fatalf("a fenced write with the write grant: %v", err)
	}
	w = make(chan result, 1) // its grant is in: nothing more may come
	notYet(1, 1, "the writer holds")
	if err := e.m.Release(ctx, "rw", rw.g.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	if r := <-r3; r.err != nil || !r.g.Read || r.g.Token <= rw.g.Token {
		t.Fatalf("the reader after the writer: %+v, %v", r.g, r.err)
	}

	if _, err := e.m.Acquire(ctx, lock.Request{Name: "sem", Session: e.session(t, 60), Limit: 3, Read: true}); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("a read grant of a semaphore: %v, want ErrInvalid", err)
	}
	if _, err := e.m.TryAcquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 60), Read: true}); err != nil {
		t.Fatalf("a read try-lock beside a reader: %v", err)
	}
	if _, err := e.m.TryAcquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 60)}); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a write try-lock beside readers: %v, want ErrHeld", err)
	}
}

// Under contention of readers and writers, no writer ever holds together
// with anyone, readers do hold together, and every grant of a writer has
// a token greater than every grant before it.
func TestNoWriterOverlapsAnyHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const clients, rounds = 8, 12
	var (
		mu               sync.Mutex
		readers, writers int
		maxReaders       int
		overlaps         []string
		topToken         int64
	)
	var wg sync.WaitGroup
	for c := range clients {
		s := e.session(t, 60)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				read := rand.IntN(4) != 0 // three readers to a writer
				g, err := e.m.Acquire(t.Context(), lock.Request{Name: "rw", Session: s, Read: read, RequestID: fmt.Sprintf("c%d-r%d", c, r)})
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				mu.Lock()
				if read {
					readers++
					maxReaders = max(maxReaders, readers)
				} else {
					writers++
					if int64(g.Token) <= topToken {
						overlaps = append(overlaps, fmt.Sprintf("writer token %d after a grant with %d", g.Token, topToken))
					}
				}
				if writers > 1 || writers == 1 && readers > 0 {
					overlaps = append(overlaps, fmt.Sprintf("%d writers and %d readers hold at once", writers, readers))
				}
				topToken = max(topToken, int64(g.Token))
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // hold it a moment: readers get to overlap
				mu.Lock()
				if read {
					readers--
				} else {
					writers--
				}
				mu.Unlock()
				if err := e.m.Release(context.WithoutCancel(t.Context()), "rw", g.Token, session.Hint{}); err != nil {
					t.Errorf("client %d: release: %v", c, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(overlaps) > 0 {
		t.Fatalf("%d violations, the first: %s", len(overlaps), overlaps[0])
	}
	if maxReaders < 2 {
		t.Errorf("readers never held together (at most %d at once)", maxReaders)
	}
}

// A writer that waited behind several readers sits out the lock-delay of
// any of them that ended without a release, not only the first's.
func TestWriterSitsOutTheLockDelayOfAnyReaderAhead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	r1, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 60), Read: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 1), Read: true, LockDelay: time.Second}); err != nil {
		t.Fatal(err)
	}
	w := make(chan lock.Grant, 1)
	go func() {
		g, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: e.session(t, 60)})
		if err != nil {
			t.Error(err)
		}
		w <- g
	}()
	wait.For(t, "the second reader's session to expire with the writer queued", func() bool {
		d, err := e.m.Describe(ctx, "rw")
		return err == nil && len(d.Holders) == 1 && len(d.Waiters) == 1
	})
	if err := e.m.Release(ctx, "rw", r1.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	if g := <-w; g.DelayWaited <= 0 {
		t.Fatalf("the writer was granted without sitting out the expired reader's lock-delay: %+v", g)
	}
}

// A retried acquisition keeps its mode, and a session never waits for
// its own read grant.
func TestRetriesKeepTheirModeAndNobodyWaitsForItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	other, mine := e.session(t, 60), e.session(t, 60)
	if _, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: other, Read: true}); err != nil {
		t.Fatal(err)
	}
	r, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: mine, Read: true, RequestID: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Acquire(ctx, lock.Request{Name: "rw", Session: mine, RequestID: "r-1"}); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("a retry of a read acquisition asking to write: %v, want ErrInvalid", err)
	}
	if d, err := e.m.Describe(ctx, "rw"); err != nil || len(d.Holders) != 2 || !d.Holders[1].Read || d.Holders[1].Token != r.Token {
		t.Fatalf("after the refused retry: %+v, %v; want both readers holding as before", d, err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
	defer cancel()
	if _, err := e.m.Acquire(wctx, lock.Request{Name: "rw", Session: mine}); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a write behind this session's own read grant (second of two): %v, want ErrHeld at once", err)
	}
}
