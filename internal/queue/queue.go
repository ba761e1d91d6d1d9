// Package queue is the FIFO core that locks and elections share: a queue of
// lease-bound entries under one etcd prefix, ordered by create revision,
// whose first few entries are granted. It waits for an entry's turn with
// one read and then the member's shared watch (grantwatch), opening no
// etcd watch per waiter, and removes entries whose caller gave up.
//
// Guarantees: Wait reports a turn only once fewer than the limit of
// entries created before this one remain, as of the returned revision, and
// only while the entry itself is alive at that revision; events delivered
// twice change nothing.
package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/grantwatch"
)

// ErrEntryGone is returned by Wait when the waiting entry was deleted:
// its session ended (or someone removed it).
var ErrEntryGone = errors.New("queue: the entry was deleted while it waited")

// Turn is one entry's wait for its turn.
type Turn struct {
	prefix string // the queue's key prefix
	key    string // the entry's key
	rev    int64  // the entry's create revision
	limit  int    // how many entries at the head are granted
	// holders are the entries ahead (that hold this one back) when last
	// seen: any of them holds, or may come to hold, before this one.
	holders map[string]*mvccpb.KeyValue
	// Gone lists the entries ahead of this one that went away while it
	// waited, in the order seen (for lock-delay and the like: those that
	// held are among them).
	Gone []Gone
	// Blocks, when set, says which entries ahead hold this one back (a
	// reader waits only for writers); nil: every entry ahead does.
	Blocks func(*mvccpb.KeyValue) bool
}

// Gone is a granted entry that went away at Rev (0 if the exact revision
// was not seen, e.g. it vanished while the watch was being reopened).
type Gone struct {
	KV  *mvccpb.KeyValue
	Rev int64
}

// NewTurn starts tracking the wait of the entry key (create revision rev)
// in the queue under prefix, whose first limit entries are granted. heads
// are the queue's first entries as last read.
func NewTurn(prefix, key string, rev int64, limit int, heads []*mvccpb.KeyValue) *Turn {
	t := &Turn{prefix: prefix, key: key, rev: rev, limit: limit, holders: map[string]*mvccpb.KeyValue{}}
	for _, kv := range heads {
		if string(kv.Key) != key {
			t.holders[string(kv.Key)] = kv
		}
	}
	return t
}

// Wait blocks until fewer than limit entries (of those t.Blocks counts)
// are ahead of t's entry and
// returns the revision at which that became true. It fails with
// ErrEntryGone as soon as the entry itself goes away (its session ended),
// and with ctx's error when ctx ends. Deletions come from w, the member's
// one watch over every queue (it must run): a waiting entry opens no etcd
// watch of its own.
func Wait(ctx context.Context, cli *clientv3.Client, w *grantwatch.Watcher, t *Turn) (int64, error) {
	d, _ := w.Subscribe(t.prefix, false)
	defer d.Stop()
	for {
		rev, err := waitTurn(ctx, cli, d, t)
		if !errors.Is(err, errRecount) {
			return rev, err
		}
	}
}

// errRecount: the member's watch restarted, deletions may have been
// missed; read the queue again.
var errRecount = errors.New("queue: watch restarted; count again")

// waitTurn reads the entries ahead at the current revision C (d was
// subscribed before, so every later deletion arrives through it), then
// follows their deletions with no further reads. The entries ahead are
// tracked by key, so a deletion delivered twice changes nothing, and those
// at or below C are already in the read.
func waitTurn(ctx context.Context, cli *clientv3.Client, d *grantwatch.Feed, t *Turn) (int64, error) {
	resp, err := cli.Get(ctx, t.prefix, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(t.rev),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return 0, fmt.Errorf("queue: wait: %w", err)
	}
	c := resp.Header.Revision
	ahead := map[string]*mvccpb.KeyValue{}
	var order []*mvccpb.KeyValue // ahead, in queue order
	mine := false
	for _, kv := range resp.Kvs {
		if string(kv.Key) == t.key && kv.CreateRevision == t.rev {
			mine = true
			continue
		}
		if t.Blocks != nil && !t.Blocks(kv) {
			continue // ahead, but does not hold this entry back
		}
		ahead[string(kv.Key)] = kv
		order = append(order, kv)
	}
	if !mine {
		return 0, ErrEntryGone
	}
	// Holders that went away while nobody counted.
	for k, kv := range t.holders {
		if _, ok := ahead[k]; !ok {
			t.Gone = append(t.Gone, Gone{KV: kv})
		}
	}
	limit := t.limit
	refreshHolders := func() {
		clear(t.holders)
		for _, kv := range order {
			if _, ok := ahead[string(kv.Key)]; ok {
				t.holders[string(kv.Key)] = kv
			}
		}
	}
	refreshHolders()
	if len(ahead) < limit {
		return c, nil
	}
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-d.Ready():
		}
		deleted, restarted := d.Take()
		if restarted != 0 {
			return 0, errRecount
		}
		var last int64
		for _, ev := range deleted {
			key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
			if rev <= c {
				continue // in the read already
			}
			if key == t.key {
				return 0, ErrEntryGone
			}
			if _, ok := ahead[key]; !ok {
				continue // not ahead of us, or seen already
			}
			delete(ahead, key)
			if kv, ok := t.holders[key]; ok {
				t.Gone = append(t.Gone, Gone{KV: kv, Rev: rev})
			}
			last = rev
		}
		if last != 0 && len(ahead) < limit {
			return last, nil
		}
		refreshHolders()
	}
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
// retry that took the entry over keeps it.
func RemoveLate(cli *clientv3.Client, bg *Background, key, value string) {
	bg.Go(func(stop context.Context) {
		ctx, cancel := context.WithTimeout(stop, lateWriteWindow)
		defer cancel()
		for ctx.Err() == nil {
			if removeLate(ctx, cli, key, value) {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
}

// removeLate deletes key if it has value, else watches for it to get value
// until ctx ends. It reports whether it is done (false: retry).
func removeLate(ctx context.Context, cli *clientv3.Client, key, value string) bool {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", value)).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return false
	}
	if resp.Succeeded {
		return true
	}
	// Not there (yet): watch from just after the state the compare saw.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterDelete()) {
		if wr.Err() != nil {
			return false
		}
		for _, ev := range wr.Events {
			if string(ev.Kv.Value) == value {
				return removeLate(ctx, cli, key, value)
			}
		}
	}
	return ctx.Err() != nil // the window ended: done
}

// Remove deletes the entry key if its value is still value, also when ctx
// has ended: a caller that gave up removes only what it wrote, never an
// entry a later call (an idempotent retry) has taken over. If etcd does not
// answer, bg keeps trying for up to 30s; the entry's session ending removes
// it at the latest.
func Remove(ctx context.Context, cli *clientv3.Client, bg *Background, key, value string) {
	try := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", value)).
			Then(clientv3.OpDelete(key)).
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
func (b *Background) Go(fn func(stop context.Context)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if b.stop == nil {
		b.stop, b.cancel = context.WithCancel(context.Background())
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn(b.stop)
	}()
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
// its lease. It reports false if that entry no longer exists.
func TakeOver(ctx context.Context, cli *clientv3.Client, key string, rev int64, value string) (bool, error) {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, value, clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
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
