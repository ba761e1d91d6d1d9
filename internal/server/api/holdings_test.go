package api

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// watchesOnEtcd starts etcd, a grantwatch.Watcher over its lock entries
// and a lock.Manager, and returns a holdingWatches on them; all stop when
// the test ends.
func watchesOnEtcd(t *testing.T) (*clientv3.Client, *lock.Manager, *holdingWatches) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	w := etcdtest.Watcher(t, cli, "/t/lock/")
	locks := lock.NewManager(cli, "/t/", w, nil)
	hw := newHoldingWatches(Holdings{Watcher: w, Locks: locks})
	t.Cleanup(func() {
		hw.Close()
		locks.Close()
	})
	return cli, locks, hw
}

// An entry key written again (a session acquiring a lock again with the
// request id of a released acquisition) is watched again, even while the
// end of its earlier incarnation waits to be sent: each incarnation's end
// is reported.
func TestAnEntryWrittenAgainIsWatchedAgain(t *testing.T) {
	cli, locks, hw := watchesOnEtcd(t)
	ctx := t.Context()

	id := session.ID(0x1234)
	key, err := locks.EntryKey("x", id, "r1")
	if err != nil {
		t.Fatal(err)
	}
	write := func() int64 {
		resp, err := cli.Put(ctx, key, "v")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	remove := func() {
		if _, err := cli.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	watch := func(token int64) {
		h := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "x", Token: token, RequestId: "r1"}
		if _, err := hw.add(ctx, id, h); err != nil {
			t.Fatal(err)
		}
	}
	ready := func() {
		select {
		case <-hw.Ready():
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatal("no end reported within 10s")
		}
	}
	first := write()
	watch(first)
	remove()
	ready() // the first incarnation's end waits to be taken
	second := write()
	watch(second)
	if got := hw.Take(); len(got) != 1 || got[0].GetToken() != first {
		t.Fatalf("ended %v, want token %d", got, first)
	}
	remove()
	ready()
	if got := hw.Take(); len(got) != 1 || got[0].GetToken() != second {
		t.Fatalf("ended %v, want token %d: the key written again was not watched", got, second)
	}
}
