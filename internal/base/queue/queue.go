// Package queue is the FIFO core that locks and elections share: a queue of
// lease-bound entries under one etcd prefix, ordered by create revision,
// whose first few entries are granted. It waits for entries' turns with
// one member-local copy of each queue's order, kept current by the
// member's shared watch (grantwatch; see Waiters), opening no etcd watch
// and reading nothing per waiter, and removes entries whose caller gave
// up.
//
// Guarantees: Wait reports a turn only once fewer than the limit of
// entries created before this one remain, as of the returned revision, and
// only while the entry itself is alive at that revision; events delivered
// twice change nothing. A deletion costs O(1) plus O(1) per waiter it
// grants, whatever the queue's length.
//
// An entry has one owner, the call that wrote it last: an idempotent
// retry takes an entry over from the call it retries (TakeOver), and the
// entry's turn is told to its owner only. Whatever order the two calls
// register their waits in, the one that owns the entry stays registered
// and the other ends with ErrTakenOver, so the replaced call giving up
// never takes the owner's wait with it (a lost wake-up that once left a
// retried acquire waiting on a free lock).
package queue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
)

// ErrEntryGone is returned by Wait when the waiting entry was deleted:
// its session ended (or someone removed it).
var ErrEntryGone = errors.New("queue: the entry was deleted while it waited")

// ErrTakenOver is returned by Wait when another call took the waiting
// entry over (an idempotent retry of the same request): that call now owns
// the entry and waits for its turn.
var ErrTakenOver = errors.New("queue: the entry was taken over by a retry of the same request")

// Turn is one entry's wait for its turn (see Waiters.Wait).
type Turn struct {
	prefix string // the queue's key prefix
	key    string // the entry's key
	rev    int64  // the entry's create revision
	limit  int    // how many entries at the head are granted
	// OwnedAt is the revision of the caller's write that made the entry
	// its own: the entry's create revision (the default, when zero) or
	// the revision of the caller's TakeOver. Of two waits for one entry,
	// the one with the later OwnedAt owns it.
	OwnedAt int64
	// heads are the queue's first entries as the caller read them when it
	// enqueued, until the wait registers.
	heads []*mvccpb.KeyValue
	// Gone lists the Notable entries (see WaitersOptions) ahead of this
	// one that went away while it waited (for lock-delay: a holder that
	// asked for one).
	Gone []Gone
	// Blocks, when set, says which entries ahead hold this one back (a
	// reader waits only for writers); nil: every entry ahead does. It
	// must be the Waiters' Exclusive.
	Blocks func(*mvccpb.KeyValue) bool
}

// Gone is an entry that went away at Rev (0 if the exact revision was
// not seen, e.g. it vanished while the watch was being reopened).
type Gone struct {
	KV  *mvccpb.KeyValue
	Rev int64
}

// NewTurn starts tracking the wait of the entry key (create revision rev)
// in the queue under prefix, whose first limit entries are granted. heads
// are the queue's first entries as last read.
func NewTurn(prefix, key string, rev int64, limit int, heads []*mvccpb.KeyValue) *Turn {
	return &Turn{prefix: prefix, key: key, rev: rev, limit: limit, heads: heads}
}

// lateWriteWindow is how long RemoveLate waits for a write whose outcome
// is unknown to be applied.
const lateWriteWindow = 30 * time.Second

// RemoveLate removes the entry key with value value that a write whose
// outcome is unknown may have created: now, if it is there, and otherwise
// whenever it appears within the next 30s. A write that failed on the
// client side (a timeout, the member's etcd leader changing) may still be
// applied later: a proposal held up in a paused or cut-off leader is
// forwarded and committed once it runs again. By then the call that made
// it has given up, and its retry may even have been granted and released;
// the late write would leave an entry that nobody waits for, and that
// every later waiter queues behind (a ghost that lasts as long as its
// session). Only an entry with exactly this call's value is removed, so a
// retry that took the entry over keeps it. It follows key through w, the
// member's shared watch of the queue (which must cover key's queue), and
// opens no etcd watch of its own: under load many calls may be in this
// state at once.
//
// Ops in also are committed with the removal (an election's seat of that
// candidacy, say), and only with it.
func RemoveLate(cli *clientv3.Client, w *grantwatch.Watcher, bg *Background, key, value string, also ...clientv3.Op) {
	bg.Go(func(stop context.Context) {
		ctx, cancel := context.WithTimeout(stop, lateWriteWindow)
		defer cancel()
		f, _ := w.Subscribe(key[:strings.LastIndex(key, "/")+1], true)
		defer f.Stop()
		for ctx.Err() == nil {
			// Subscribed before the compare: a put after it arrives on f.
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.Value(key), "=", value)).
				Then(append([]clientv3.Op{clientv3.OpDelete(key)}, also...)...).
				Commit()
			if err == nil && resp.Succeeded {
				return
			}
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			if !waitForValue(ctx, f, key, value, resp.Header.Revision) {
				return // the window ended
			}
		}
	})
}

// waitForValue waits until f delivers a put of key with value after
// revision after (true), or the watch restarted and the state must be
// read again (true), or ctx ends (false).
func waitForValue(ctx context.Context, f *grantwatch.Feed, key, value string, after int64) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-f.Ready():
		}
		evs, restarted := f.Take()
		if restarted != 0 {
			return true
		}
		for _, ev := range evs {
			if ev.Type == mvccpb.PUT && ev.Kv.ModRevision > after && string(ev.Kv.Key) == key && string(ev.Kv.Value) == value {
				return true
			}
		}
	}
}

// Abandoned reports whether a wait under ctx ended because the member
// serving it gave the call up, not because its caller did: ctx ended with
// a cause of kind Unavailable (the daemon stopping, or this member cut
// off from its peers). Such a call's entry is kept, in its place, for the
// client's retry (with the same request id) to take over, on this member
// once it is back or on another; if no retry comes, its session's end
// removes it. Callers keep it only for calls whose client named the
// request id: a retry without one could not find it.
func Abandoned(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errkind.Unavailable)
}

// Remove deletes the entry key if its value is still value, also when ctx
// has ended: a caller that gave up removes only what it wrote, never an
// entry a later call (an idempotent retry) has taken over. If etcd does not
// answer, bg keeps trying for up to 30s; the entry's session ending removes
// it at the latest. Ops in also are committed with the removal, and only
// with it.
func Remove(ctx context.Context, cli *clientv3.Client, bg *Background, key, value string, also ...clientv3.Op) {
	try := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", value)).
			Then(append([]clientv3.Op{clientv3.OpDelete(key)}, also...)...).
			Commit()
		return err
	}
	if try(context.WithoutCancel(ctx)) == nil {
		return
	}
	bg.Go(func(stop context.Context) {
		ctx, cancel := context.WithTimeout(stop, 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			if try(ctx) == nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
}

// Background runs short-lived background writes and lets its owner stop
// them. The zero value is ready to use.
type Background struct {
	mu     sync.Mutex
	closed bool
	stop   context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Go runs fn in a goroutine that Close cancels (through fn's context) and
// waits for; after Close it does nothing. fn must return within a bounded
// time, and promptly once its context is done.
func (b *Background) Go(fn func(stop context.Context)) { b.TryGo(fn) }

// TryGo is Go that reports whether fn runs (false once Close ran).
func (b *Background) TryGo(fn func(stop context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	if b.stop == nil {
		b.stop, b.cancel = context.WithCancel(context.Background())
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn(b.stop)
	}()
	return true
}

// Close stops new work from starting, cancels running work and waits for
// it to return.
func (b *Background) Close() {
	b.mu.Lock()
	b.closed = true
	if b.cancel != nil {
		b.cancel()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// HeadsOp reads the first n entries of the queue under prefix (all of them
// for n = 0), in queue order.
func HeadsOp(prefix string, n int) clientv3.Op {
	return clientv3.OpGet(prefix, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(n)))
}

// TakeOver replaces the value of the entry key created at rev (an
// idempotent retry taking the entry over from an earlier call), keeping
// its lease, and returns the revision of that write (the caller's
// Turn.OwnedAt). It returns 0 if that entry no longer exists.
func TakeOver(ctx context.Context, cli *clientv3.Client, key string, rev int64, value string) (int64, error) {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, value, clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, nil
	}
	return resp.Header.Revision, nil
}

// Restamp replaces key's value old with value in the background (for
// bookkeeping such as when an entry was granted), off the caller's path:
// it costs a commit that nobody should wait for. It does nothing if the
// value changed meanwhile; a lost restamp is harmless by contract.
func Restamp(bg *Background, cli *clientv3.Client, key, old, value string) {
	bg.Go(func(stop context.Context) {
		ctx, cancel := context.WithTimeout(stop, 5*time.Second)
		defer cancel()
		_, _ = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", old)).
			Then(clientv3.OpPut(key, value, clientv3.WithIgnoreLease())).
			Commit()
	})
}

// Position reads, in one snapshot, the entry created at rev and how many
// entries are at or ahead of it in the queue under prefix (its 1-based
// place; 0 and a nil entry if it does not exist), together with the
// responses of extra read ops. An entry at place p keeps a place of at
// most p until it is deleted: entries only join behind it.
func Position(ctx context.Context, cli *clientv3.Client, prefix string, rev int64, extra ...clientv3.Op) (*mvccpb.KeyValue, int, []*etcdserverpb.ResponseOp, error) {
	ops := append([]clientv3.Op{
		clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithMinCreateRev(rev), clientv3.WithMaxCreateRev(rev)),
		// Count the keys: etcd's Count ignores the create revision filter.
		clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev), clientv3.WithKeysOnly()),
	}, extra...)
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, nil, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, 0, resp.Responses[2:], nil
	}
	return kvs[0], len(resp.Responses[1].GetResponseRange().Kvs), resp.Responses[2:], nil
}
