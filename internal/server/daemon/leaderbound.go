package daemon

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/server/api"
)

// Requests to etcd are bound to this member's view of its etcd leader.
//
// A member forwards proposals (writes, lease grants and renewals) and
// linearizable reads to the leader it knows. When that leader dies, the
// member keeps forwarding to it until its election timeout passes, and a
// request forwarded to the dead leader is not answered: etcd gives up on it
// only after its request timeout (5 s + two election timeouts, 7 s by
// default). Every lock, session and config call made in that window would
// hang for 7 s, although a new leader serves after one or two election
// timeouts.
//
// So the daemon's etcd client cancels each KV and Lease request that is in
// flight when the member's leader changes (to none, or to another member),
// and reports it as api.ErrLeaderChanged (Unavailable): the caller retries
// at once. Such a request may still take effect (a proposal the old leader
// replicated can commit under the new one), as with any Unavailable; the
// SDK's retries are idempotent (request ids, tokens) for that reason.
// Watches are not bound: they survive leader changes.
func bindToLeader(cli *clientv3.Client, w *leaderWatch) {
	if w.etcd == nil {
		return // an external etcd cluster: its own client handles leader loss
	}
	cli.KV = boundKV{KV: cli.KV, w: w}
	cli.Lease = boundLease{Lease: cli.Lease, w: w}
}

// bind returns ctx, cancelled with errLeaderChanged when the member's
// leader changes, and a function that releases it.
func (w *leaderWatch) bind(ctx context.Context) (context.Context, func()) {
	w.mu.Lock()
	changed := w.changed
	w.mu.Unlock()
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(changed, func() { cancel(errLeaderChanged) })
	return bctx, func() { stop(); cancel(nil) }
}

var errLeaderChanged = errors.New("leader changed")

// leaderErr turns the error of a request cancelled by a leader change into
// api.ErrLeaderChanged (not wrapping the context's error, which would read
// as the caller's own cancel); other errors are returned as they are.
func leaderErr(bctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(bctx), errLeaderChanged) {
		return fmt.Errorf("%w: %s", api.ErrLeaderChanged, err.Error())
	}
	return err
}

type boundKV struct {
	clientv3.KV
	w *leaderWatch
}

func (k boundKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	bctx, done := k.w.bind(ctx)
	defer done()
	resp, err := k.KV.Put(bctx, key, val, opts...)
	return resp, leaderErr(bctx, err)
}

func (k boundKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	bctx, done := k.w.bind(ctx)
	defer done()
	resp, err := k.KV.Get(bctx, key, opts...)
	return resp, leaderErr(bctx, err)
}

func (k boundKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	bctx, done := k.w.bind(ctx)
	defer done()
	resp, err := k.KV.Delete(bctx, key, opts...)
	return resp, leaderErr(bctx, err)
}

func (k boundKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	bctx, done := k.w.bind(ctx)
	defer done()
	resp, err := k.KV.Do(bctx, op)
	return resp, leaderErr(bctx, err)
}

// Txn binds the transaction when it is built; Commit releases it.
func (k boundKV) Txn(ctx context.Context) clientv3.Txn {
	bctx, done := k.w.bind(ctx)
	return &boundTxn{Txn: k.KV.Txn(bctx), ctx: bctx, done: done}
}

type boundTxn struct {
	clientv3.Txn
	ctx  context.Context
	done func()
}

func (t *boundTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *boundTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *boundTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *boundTxn) Commit() (*clientv3.TxnResponse, error) {
	defer t.done()
	resp, err := t.Txn.Commit()
	return resp, leaderErr(t.ctx, err)
}

type boundLease struct {
	clientv3.Lease
	w *leaderWatch
}

func (l boundLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	bctx, done := l.w.bind(ctx)
	defer done()
	resp, err := l.Lease.Grant(bctx, ttl)
	return resp, leaderErr(bctx, err)
}

func (l boundLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	bctx, done := l.w.bind(ctx)
	defer done()
	resp, err := l.Lease.Revoke(bctx, id)
	return resp, leaderErr(bctx, err)
}

func (l boundLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	bctx, done := l.w.bind(ctx)
	defer done()
	resp, err := l.Lease.TimeToLive(bctx, id, opts...)
	return resp, leaderErr(bctx, err)
}

func (l boundLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	bctx, done := l.w.bind(ctx)
	defer done()
	resp, err := l.Lease.KeepAliveOnce(bctx, id)
	return resp, leaderErr(bctx, err)
}
