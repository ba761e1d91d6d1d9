package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// failingKV fails the next fail transactions (as etcd does while its
// leadership moves: "raft proposal dropped").
type failingKV struct {
	clientv3.KV
	fail *atomic.Int32
}

var errDropped = errors.New("raft proposal dropped")

func (k failingKV) Txn(ctx context.Context) clientv3.Txn {
	return failingTxn{Txn: k.KV.Txn(ctx), fail: k.fail}
}

type failingTxn struct {
	clientv3.Txn
	fail *atomic.Int32
}

func (t failingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t failingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t failingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t failingTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.fail.Add(-1) >= 0 {
		return nil, errDropped
	}
	t.fail.Store(0)
	return t.Txn.Commit()
}

// A set that cannot be completed gives back the locks it took, also when
// the first try to give one back fails as the acquisition did (etcd's
// leadership moving refuses both): the release is tried again. Left
// behind, the lock would stay with the session under the set's request
// id, and every later set of that session would wait for itself.
func TestAcquireAllGivesBackWhatItTookWhenReleasesFailAtFirst(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Start(t).Client(t)
	var fail atomic.Int32
	cli.KV = failingKV{KV: cli.KV, fail: &fail}
	w := etcdtest.Watcher(t, cli, "/coordd/lock/")
	txns := groupcommit.Direct(cli)
	m := lock.NewManager(cli, "/coordd/", w, txns)
	t.Cleanup(m.Close)
	e := env{m: m, cli: cli}
	s := e.session(t, 60)
	enqueues := 0
	lock.SetBeforeEnqueue(m, func() {
		if enqueues++; enqueues == 2 { // set-b's: it and the first release of set-a fail
			fail.Store(2)
		}
	})
	ctx := t.Context()
	_, err := m.AcquireAll(ctx, []string{"set-a", "set-b"}, lock.Request{Session: s, RequestID: "set-1"})
	if !errors.Is(err, errDropped) {
		t.Fatalf("AcquireAll = %v, want the dropped proposal", err)
	}
	d, err := m.Describe(ctx, "set-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Holders) != 0 || len(d.Waiters) != 0 {
		t.Fatalf("set-a after the failed set: holders %v, waiters %v; want it given back", d.Holders, d.Waiters)
	}
	if _, err := m.AcquireAll(ctx, []string{"set-a", "set-b"}, lock.Request{Session: s, RequestID: "set-2"}); err != nil {
		t.Fatalf("the session's next set: %v", err)
	}
}
