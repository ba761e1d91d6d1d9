package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// Many waiters on one queue cost the member one read in all, not one
// each, and each deletion grants exactly the next waiter, in queue order,
// at the deletion's revision. (Before the queue mirrors, every waiter read
// the entries ahead of it and walked them at every deletion: O(n²) per
// grant for n waiters.)
func TestManyWaitersShareOneRead(t *testing.T) {
	const n = 300
	keys := make([]string, n+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("e%04d", i)
	}
	cli, revs, w := setup(t, keys...)
	gets := etcdtest.CountGets(cli)
	ws := queue.NewWaiters(cli, w, queue.WaitersOptions{})
	type turn struct {
		i   int
		rev int64
		err error
	}
	turns := make(chan turn, n)
	head := heads(t, cli, 1).Kvs
	for i := 1; i <= n; i++ {
		go func() {
			rev, err := ws.Wait(t.Context(), queue.NewTurn("/q/", "/q/"+keys[i], revs[keys[i]], 1, head))
			turns <- turn{i, rev, err}
		}()
	}
	for i := 0; i < n; i++ {
		del, err := cli.Delete(t.Context(), "/q/"+keys[i])
		if err != nil {
			t.Fatal(err)
		}
		got := <-turns
		if got.err != nil || got.i != i+1 || got.rev != del.Header.Revision {
			t.Fatalf("after deleting %s: waiter %d's turn at %d (%v); want waiter %d's at %d", keys[i], got.i, got.rev, got.err, i+1, del.Header.Revision)
		}
	}
	if reads := gets.Load(); reads > 3 {
		t.Errorf("%d waiters read etcd %d times; want one read (a few if the watch restarted)", n, reads)
	}
}

// Readers wait only for writers ahead, writers for everything ahead; a
// waiter whose entry goes fails with ErrEntryGone without disturbing the
// others.
func TestReadersAndWritersTakeTurns(t *testing.T) {
	cli, revs, w := setup(t, "w1", "r2", "r3", "w4", "gone5", "r6")
	writer := func(kv *mvccpb.KeyValue) bool { return string(kv.Value)[0] != 'r' }
	ws := queue.NewWaiters(cli, w, queue.WaitersOptions{Exclusive: writer})
	results := map[string]chan error{}
	for _, k := range []string{"r2", "r3", "w4", "gone5", "r6"} {
		turn := queue.NewTurn("/q/", "/q/"+k, revs[k], 1, heads(t, cli, 1).Kvs)
		if k[0] == 'r' {
			turn.Blocks = writer
		}
		result := make(chan error, 1)
		results[k] = result
		go func() {
			_, err := ws.Wait(t.Context(), turn)
			result <- err
		}()
	}
	probes := 0
	expect := func(step string, granted ...string) {
		t.Helper()
		for _, k := range granted {
			select {
			case err := <-results[k]:
				if err != nil {
					t.Fatalf("%s: %s: %v", step, k, err)
				}
			case <-time.After(wait.Bound(10 * time.Second)):
				t.Fatalf("%s: %s has no turn", step, k)
			}
		}
		// Nobody else has a turn: checked once the mirror has applied a
		// later change (a probe entry, put and deleted: its wait ends
		// with ErrEntryGone only once the mirror saw the deletion), so
		// that a wrong grant would have been made.
		probes++
		probe := fmt.Sprintf("/q/probe%d", probes)
		put, err := cli.Put(t.Context(), probe, "probe")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(t.Context(), probe); err != nil {
			t.Fatal(err)
		}
		if _, err := ws.Wait(t.Context(), queue.NewTurn("/q/", probe, put.Header.Revision, 1, nil)); !errors.Is(err, queue.ErrEntryGone) {
			t.Fatalf("%s: the probe's wait: %v", step, err)
		}
		for k, ch := range results {
			select {
			case err := <-ch:
				t.Fatalf("%s: %s ended its wait (%v)", step, k, err)
			default:
			}
		}
	}
	del := func(k string) {
		t.Helper()
		if _, err := cli.Delete(t.Context(), "/q/"+k); err != nil {
			t.Fatal(err)
		}
	}
	expect("w1 holds")
	del("w1")
	expect("w1 went", "r2", "r3")
	delete(results, "r2")
	delete(results, "r3")
	del("r2")
	expect("r2 went, r3 holds")
	del("gone5") // a waiter behind a writer goes
	if err := <-results["gone5"]; !errors.Is(err, queue.ErrEntryGone) {
		t.Fatalf("gone5's wait: %v; want ErrEntryGone", err)
	}
	delete(results, "gone5")
	del("r3")
	expect("r3 went", "w4")
	delete(results, "w4")
	del("w4")
	expect("w4 went", "r6")
}

// A parked wait (Park) is told its turn, its entry's end or its context's
// end exactly as a Wait would be, once, and holds nothing after: the
// member forgets the queue's mirror with the last wait, parked or not.
func TestParkedWaitsAreToldOnce(t *testing.T) {
	cli, revs, w := setup(t, "e1", "e2", "e3", "e4")
	ws := queue.NewWaiters(cli, w, queue.WaitersOptions{})
	type told struct {
		rev int64
		err error
	}
	park := func(ctx context.Context, k string) chan told {
		ch := make(chan told, 2) // a second telling would be seen
		ws.Park(ctx, queue.NewTurn("/q/", "/q/"+k, revs[k], 1, heads(t, cli, 1).Kvs), func(rev int64, err error) { ch <- told{rev, err} })
		return ch
	}
	cancelled, cancel := context.WithCancel(t.Context())
	e2, e3, e4 := park(t.Context(), "e2"), park(cancelled, "e3"), park(t.Context(), "e4")
	if ws.Waiting() != 3 {
		t.Fatalf("%d waits registered; want 3", ws.Waiting())
	}
	cancel()
	if got := <-e3; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("e3, its context cancelled: %+v; want context.Canceled", got)
	}
	del, err := cli.Delete(t.Context(), "/q/e1")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-e2; got.err != nil || got.rev != del.Header.Revision {
		t.Fatalf("e2 after e1 went: %+v; want its turn at %d", got, del.Header.Revision)
	}
	if _, err := cli.Delete(t.Context(), "/q/e4"); err != nil {
		t.Fatal(err)
	}
	if got := <-e4; !errors.Is(got.err, queue.ErrEntryGone) {
		t.Fatalf("e4, its entry deleted: %+v; want ErrEntryGone", got)
	}
	for k, ch := range map[string]chan told{"e2": e2, "e3": e3, "e4": e4} {
		select {
		case got := <-ch:
			t.Fatalf("%s was told twice (again: %+v)", k, got)
		default:
		}
	}
	if ws.Waiting() != 0 {
		t.Fatalf("%d waits registered after every one ended; want 0", ws.Waiting())
	}
}
