package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T, keys ...string) (cli *clientv3.Client, revs map[string]int64, w *grantwatch.Watcher) {
	t.Helper()
	cli = etcdtest.Start(t).Client(t)
	// The member's shared watch, as the daemon runs it.
	w = etcdtest.Watcher(t, cli, "/q/")
	revs = map[string]int64{}
	for _, k := range keys {
		resp, err := cli.Put(t.Context(), "/q/"+k, k)
		if err != nil {
			t.Fatal(err)
		}
		revs[k] = resp.Header.Revision
	}
	return cli, revs, w
}

// waiters waits with every entry notable, so that Gone lists every entry
// that went ahead.
func waiters(cli *clientv3.Client, w *grantwatch.Watcher) *queue.Waiters {
	return queue.NewWaiters(cli, w, queue.WaitersOptions{Notable: func(*mvccpb.KeyValue) bool { return true }})
}

func heads(t *testing.T, cli *clientv3.Client, limit int64) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(t.Context(), "/q/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(limit))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestWaitForTheEntriesAhead(t *testing.T) {
	cli, revs, w := setup(t, "a", "b", "c")
	turn := queue.NewTurn("/q/", "/q/c", revs["c"], 1, heads(t, cli, 1).Kvs)
	done := make(chan int64, 1)
	errc := make(chan error, 1)
	go func() {
		rev, err := waiters(cli, w).Wait(t.Context(), turn)
		errc <- err
		done <- rev
	}()
	if _, err := cli.Delete(t.Context(), "/q/a"); err != nil {
		t.Fatal(err)
	}
	// b is still ahead: no turn yet (checked for a short while).
	select {
	case err := <-errc:
		t.Fatalf("turn came with b still ahead: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	del, err := cli.Delete(t.Context(), "/q/b")
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if rev := <-done; rev != del.Header.Revision {
		t.Fatalf("turn came at revision %d, want the delete of b at %d", rev, del.Header.Revision)
	}
	// a held the lock when it went; then b did.
	if len(turn.Gone) != 2 || string(turn.Gone[0].KV.Key) != "/q/a" || string(turn.Gone[1].KV.Key) != "/q/b" || turn.Gone[1].Rev != del.Header.Revision {
		t.Fatalf("Gone = %+v, want holders a then b with their delete revisions", turn.Gone)
	}
}

func TestWaitFailsWhenTheEntryGoes(t *testing.T) {
	cli, revs, w := setup(t, "a", "b")
	turn := queue.NewTurn("/q/", "/q/b", revs["b"], 1, heads(t, cli, 1).Kvs)
	errc := make(chan error, 1)
	go func() {
		_, err := waiters(cli, w).Wait(t.Context(), turn)
		errc <- err
	}()
	if _, err := cli.Delete(t.Context(), "/q/b"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, queue.ErrEntryGone) {
		t.Fatalf("Wait = %v, want ErrEntryGone", err)
	}
}

func TestWaitEndsWithCtx(t *testing.T) {
	cli, revs, w := setup(t, "a", "b")
	turn := queue.NewTurn("/q/", "/q/b", revs["b"], 1, heads(t, cli, 1).Kvs)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := waiters(cli, w).Wait(ctx, turn); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want DeadlineExceeded", err)
	}
}

func TestRemoveOnlyWhatItWrote(t *testing.T) {
	cli, _, _ := setup(t, "a")
	var bg queue.Background
	defer bg.Close()
	queue.Remove(t.Context(), cli, &bg, "/q/a", "not-a")
	if resp := heads(t, cli, 0); resp.Count != 1 {
		t.Fatal("Remove deleted an entry whose value it did not write")
	}
	queue.Remove(t.Context(), cli, &bg, "/q/a", "a")
	if resp := heads(t, cli, 0); resp.Count != 0 {
		t.Fatal("Remove left its own entry")
	}
}

// A write whose outcome was unknown to its caller and that etcd applies
// only later (a proposal held up in a paused leader) is removed when it
// lands, so it leaves no entry that nobody waits for; an entry with
// another value (a retry that took it over) is kept.
func TestRemoveLateRemovesAWriteThatLandsLater(t *testing.T) {
	cli, _, w := setup(t)
	var bg queue.Background
	defer bg.Close()
	queue.RemoveLate(cli, w, &bg, "/q/late", "mine")
	queue.RemoveLate(cli, w, &bg, "/q/taken", "mine")
	if _, err := cli.Put(t.Context(), "/q/taken", "the retry's"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), "/q/late", "mine"); err != nil { // the late write lands
		t.Fatal(err)
	}
	wait.For(t, "the late write removed", func() bool {
		resp, err := cli.Get(t.Context(), "/q/late")
		return err == nil && resp.Count == 0
	})
	if resp, err := cli.Get(t.Context(), "/q/taken"); err != nil || resp.Count != 1 {
		t.Fatalf("an entry with another value was removed: %v, %v", resp, err)
	}
}
