// Package groupcommit merges the etcd transactions that callers hand it
// concurrently into one transaction per round trip: N lock or election
// mutations cost one Raft proposal, one fsync and one apply instead of N.
//
// A batch is whatever queued while the previous batch was in flight: there
// is no timer, so an idle member commits a lone transaction at once, from
// the caller's own goroutine (no hand-off to the committer and back). One
// batch is in flight at a time, except while CrowdDepth creations or more
// of one Name are queued (a crowd joining one lock, which a batch serves
// one creation at a time): then up to MaxInFlight batches go without
// waiting for each other, so that the crowd's joins share etcd's fsyncs
// instead of taking a round trip each (10,000 joins of one lock: 3.3 s
// before, 1.5-2.0 s). Not sooner: sending a batch whenever a creation
// waited behind its Name's in flight shrank the batches of 64 clients on
// 64 locks and cost 12 % more CPU per acquisition. Each
// caller's transaction becomes one nested transaction (etcd's OpTxn) of the
// batch, with its own compares and branches, and gets back exactly the
// response it would have had alone, except that every transaction of a
// batch shares the batch's revision.
//
// Guarantees:
//   - At most one transaction that Creates an entry per Name in a batch,
//     taken in arrival order: two entries of one lock or election never
//     share a create revision, so the tokens of one lock stay strictly
//     increasing and its FIFO order (by token) exact. Batches in flight
//     together are sent in arrival order but ordered by etcd: of two
//     creations of a Name that were in flight at once, either may get the
//     lower revision (neither caller had its answer, so neither came first
//     in any order a client can observe). Transactions of different names,
//     and a name's releases, may share a revision (a token is unique per
//     lock or election, not across them).
//   - Every transaction's compares are evaluated on the state before the
//     batch (etcd evaluates a request's compares first), its reads and
//     writes in batch order. So transactions of one name that only delete
//     or update entries (releases, resignations, proclamations) must be
//     correct in either order; etcd refuses a batch that would delete a key
//     and then write it (retried transaction by transaction, below).
//   - A batch that etcd refuses as a whole before applying anything (a
//     session's lease gone, a key written twice, too large) is retried
//     transaction by transaction, so one caller's refusal is never another's.
//   - A batch whose outcome is unknown (a timeout, the etcd leader lost)
//     reports that error to each of its callers, as a lone transaction would.
//   - A caller that gives up before its transaction is sent leaves nothing
//     behind; one that gives up while it is in flight cannot tell whether it
//     committed (as with any etcd call). The batch runs until its last
//     caller gives up.
package groupcommit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxInFlight is the most batches in flight at once: more than one only
// while a Name has CrowdDepth creations queued.
const MaxInFlight = 8

// CrowdDepth is how many creations of one Name must be queued for batches
// to go without waiting for the one in flight.
const CrowdDepth = 8

// MaxBatch is the most transactions one batch carries. etcd allows 128
// operations per transaction level by default (--max-txn-ops) and gives a
// nested transaction what its parent leaves over, so 64 leaves every
// nested transaction 64 operations: a cluster with the default limit takes
// any batch.
const MaxBatch = 64

// maxBatchBytes bounds a batch's keys and values well under etcd's request
// limit (1.5 MiB by default); a transaction larger than that goes alone.
const maxBatchBytes = 512 << 10

// ErrClosed is returned for transactions handed to a closed Committer.
var ErrClosed = errors.New("groupcommit: closed")

// Txn is one caller's transaction: if every compare in If holds, Then runs,
// else Else; as clientv3's Txn. Name is what it mutates (a lock's or an
// election's name, with its kind). Creates marks a transaction that may
// create an entry (an acquisition, a campaign): a batch holds at most one
// of those per Name.
//
// Prepare, when set, is called once, right before the transaction is sent
// (in the committer's goroutine or the caller's), and may rewrite it from
// the newest state the caller knows: a transaction that waited behind
// others of its Name is built when its turn comes, not when it queued.
// It must not change Name or Creates, and must return promptly.
type Txn struct {
	Name    string
	Creates bool
	If      []clientv3.Cmp
	Then    []clientv3.Op
	Else    []clientv3.Op
	Prepare func(*Txn)
}

// prepared is t after its Prepare, which it runs once.
func (t Txn) prepared() Txn {
	if p := t.Prepare; p != nil {
		t.Prepare = nil
		p(&t)
	}
	return t
}

// Committer commits transactions in batches (New) or each alone (Direct).
type Committer struct {
	cli    *clientv3.Client
	direct bool

	mu sync.Mutex
	// pending are the calls not yet sent, one queue per Name (in arrival
	// order), the Names in the order a batch visits them.
	pending  []*nameQueue
	byName   map[string]*nameQueue
	npending int
	seq      uint64 // the last call's arrival number
	inflight int    // batches in flight (the committer's, or a caller's lone one)
	closed   bool
	wake     chan struct{}  // one token: pending may be non-empty
	sending  sync.WaitGroup // the committer's batches in flight

	stop    context.Context // cancelled by Close: in-flight batches end
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns
	batches atomic.Int64
	txns    atomic.Int64
	seen    atomic.Int64 // the newest revision etcd answered with

	beforeAlone func() // tests: runs as a caller's lone transaction starts
}

type call struct {
	seq  uint64 // arrival order
	ctx  context.Context
	txn  Txn
	size int
	resp *clientv3.TxnResponse
	err  error
	done chan struct{}
}

// New starts a Committer for cli. Close stops it.
func New(cli *clientv3.Client) *Committer {
	c := &Committer{cli: cli, wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.stop, c.cancel = context.WithCancel(context.Background())
	go c.run()
	return c
}

// Direct returns a Committer that commits every transaction alone, at
// once, in the caller's goroutine: what New's does with batching switched
// off. Its Close does nothing.
func Direct(cli *clientv3.Client) *Committer {
	return &Committer{cli: cli, direct: true}
}

// Close fails the transactions not yet sent with ErrClosed, cancels the
// batch in flight and waits for the committer to stop (a caller's lone
// transaction is cancelled too, but ends in its caller's goroutine). Call
// it once the callers are done, before closing the etcd client.
func (c *Committer) Close() {
	if c == nil || c.direct {
		return
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	<-c.done
}

// Stats reports how many batches and transactions were committed so far
// (their ratio is the mean batch size).
func (c *Committer) Stats() (batches, txns int64) {
	return c.batches.Load(), c.txns.Load()
}

// Revision is the newest etcd revision of any answer the committer has
// had (0 before the first). It never decreases. A change that etcd commits
// after a caller reads Revision has a higher revision, so a key whose
// create revision is above what a call read when it began was written
// after the call began. (The converse does not hold: the committer may not
// yet have seen the revision of a key written before.)
func (c *Committer) Revision() int64 { return c.seen.Load() }

// arrivedKey keys, in a call's context, Revision as the call arrived.
type arrivedKey struct{}

// Arrived returns ctx noting Revision now as the moment its call arrived,
// for Began: a call that waits between its arrival and its transaction
// (for authentication's reads, say) still counts from its arrival.
func (c *Committer) Arrived(ctx context.Context) context.Context {
	return context.WithValue(ctx, arrivedKey{}, c.Revision())
}

// Began is the revision ctx's call began at: the one Arrived noted, or
// Revision now. A key whose create revision is above it was written after
// the call began.
func (c *Committer) Began(ctx context.Context) int64 {
	if rev, ok := ctx.Value(arrivedKey{}).(int64); ok {
		return rev
	}
	return c.Revision()
}

// saw records the revision of an answer.
func (c *Committer) saw(resp *clientv3.TxnResponse) {
	if resp == nil || resp.Header == nil {
		return
	}
	for rev := resp.Header.Revision; ; {
		cur := c.seen.Load()
		if rev <= cur || c.seen.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// Commit commits t, batched with whatever else is queued, and returns its
// own response: Succeeded and Responses as t alone would have them, the
// Header of the batch. It returns ctx's error if ctx ends first.
func (c *Committer) Commit(ctx context.Context, t Txn) (*clientv3.TxnResponse, error) {
	if c.direct {
		c.batches.Add(1)
		c.txns.Add(1)
		return c.alone(ctx, t.prepared())
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.inflight == 0 && c.npending == 0 {
		// Idle: this transaction is the batch. What arrives meanwhile
		// queues for the next one.
		c.inflight++
		c.mu.Unlock()
		return c.commitAlone(ctx, t)
	}
	cl := &call{ctx: ctx, txn: t, size: size(t), done: make(chan struct{})}
	c.queueLocked(cl)
	c.mu.Unlock()
	c.poke()
	select {
	case <-cl.done:
		return cl.resp, cl.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *Committer) run() {
	defer close(c.done)
	for {
		select {
		case <-c.stop.Done():
			c.mu.Lock()
			rest := c.pending
			c.pending, c.byName, c.npending = nil, nil, 0
			c.mu.Unlock()
			for _, q := range rest {
				for _, cl := range slices.Concat(q.creates, q.others) {
					cl.finish(nil, ErrClosed)
				}
			}
			c.sending.Wait() // cancelled by c.stop
			return
		case <-c.wake:
		}
		for {
			batch, ok := c.next()
			if !ok {
				break
			}
			c.sending.Add(1)
			go func() {
				defer c.sending.Done()
				c.commit(batch)
				c.sent()
			}()
		}
	}
}

// next takes the next batch and marks it in flight, unless nothing is
// queued or batches are in flight already: any one (a caller's lone
// transaction, whose end pokes the loop), or MaxInFlight while a Name has
// CrowdDepth creations queued.
func (c *Committer) next() ([]*call, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight >= MaxInFlight || c.inflight > 0 && !c.crowdedLocked() {
		return nil, false
	}
	batch := c.takeLocked()
	if len(batch) == 0 {
		return nil, false
	}
	c.inflight++
	return batch, true
}

// crowdedLocked reports whether a Name has CrowdDepth creations or more
// queued. c.mu must be held.
func (c *Committer) crowdedLocked() bool {
	for _, q := range c.pending {
		if len(q.creates) >= CrowdDepth {
			return true
		}
	}
	return false
}

// sent marks a batch answered, and lets the committer send what queued
// meanwhile.
func (c *Committer) sent() {
	c.mu.Lock()
	c.inflight--
	queued := c.npending > 0
	c.mu.Unlock()
	if queued {
		c.poke()
	}
}

// commitAlone commits t, a batch of one (marked in flight), in the
// caller's goroutine, then lets the committer send what queued meanwhile.
// Close cancels it as it cancels a batch.
func (c *Committer) commitAlone(ctx context.Context, t Txn) (*clientv3.TxnResponse, error) {
	c.batches.Add(1)
	c.txns.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.stop, cancel)
	if c.beforeAlone != nil {
		c.beforeAlone()
	}
	resp, err := c.alone(ctx, t.prepared())
	stop()
	cancel()
	c.sent()
	return resp, err
}

func (c *Committer) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Crowded reports whether creations of name are queued, waiting for
// batches: each batch takes one, so a caller that may not need to create
// (a retry that will find its entry) can save its place in that line by
// learning so first. Always false for a Direct committer.
func (c *Committer) Crowded(name string) bool {
	if c == nil || c.direct {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.byName[name]
	return q != nil && len(q.creates) > 0
}

// nameQueue is one Name's calls not yet sent, each kind in arrival order:
// those that Create (one per batch) and the others (releases and updates,
// which may go before creations that arrived earlier: see Txn).
type nameQueue struct {
	name            string
	creates, others []*call
}

// popCreate removes q's first creation.
func (q *nameQueue) popCreate() {
	q.creates[0] = nil
	q.creates = q.creates[1:]
}

// queueLocked adds cl to its Name's queue. c.mu must be held.
func (c *Committer) queueLocked(cl *call) {
	q := c.byName[cl.txn.Name]
	if q == nil {
		if c.byName == nil {
			c.byName = map[string]*nameQueue{}
		}
		q = &nameQueue{name: cl.txn.Name}
		c.byName[q.name] = q
		c.pending = append(c.pending, q)
	}
	c.seq++
	cl.seq = c.seq
	if cl.txn.Creates {
		q.creates = append(q.creates, cl)
	} else {
		q.others = append(q.others, cl)
	}
	c.npending++
}

// takeLocked removes the next batch from the queues: from each Name in
// turn, its other calls and its first creation, in arrival order; at most
// MaxBatch calls and about maxBatchBytes. The Names served go to the back
// of the turn, so that every Name is served while more than a batch's
// worth are busy. Calls whose caller gave up are dropped (nothing was sent
// for them). A batch costs O(the Names visited + its calls), however many
// creations a crowded Name has queued (one join of a crowd goes in each
// batch, and its releases go at once). c.mu must be held.
func (c *Committer) takeLocked() []*call {
	var batch []*call
	bytes := 0
	var served, rest []*nameQueue
	fits := func(cl *call) bool {
		return len(batch) < MaxBatch && (len(batch) == 0 || bytes+cl.size <= maxBatchBytes)
	}
	for i, q := range c.pending {
		if len(batch) == MaxBatch {
			rest = append(rest, c.pending[i:]...)
			break
		}
		before := len(batch)
		add := func(cl *call) {
			batch = append(batch, cl)
			bytes += cl.size
		}
		// Drop creations whose caller gave up; the first left may go.
		for len(q.creates) > 0 && q.creates[0].ctx.Err() != nil {
			q.creates[0].finish(nil, q.creates[0].ctx.Err())
			q.popCreate()
			c.npending--
		}
		var create *call
		if len(q.creates) > 0 {
			create = q.creates[0]
		}
		took := 0
		for _, cl := range q.others {
			if cl.ctx.Err() != nil {
				cl.finish(nil, cl.ctx.Err())
				took++
				continue
			}
			if create != nil && create.seq < cl.seq { // arrived first: goes first
				if !fits(create) {
					break
				}
				add(create)
				q.popCreate()
				c.npending--
				create = nil
			}
			if !fits(cl) {
				break
			}
			add(cl)
			took++
		}
		clear(q.others[:took])
		q.others = q.others[took:]
		c.npending -= took
		if create != nil && fits(create) {
			add(create)
			q.popCreate()
			c.npending--
		}
		switch {
		case len(q.creates)+len(q.others) == 0:
			delete(c.byName, q.name)
		case len(batch) == before:
			rest = append(rest, q) // not served: keeps its turn
		default:
			served = append(served, q)
		}
	}
	clear(c.pending)
	c.pending = append(append(c.pending[:0], rest...), served...)
	return batch
}

// commit sends one batch and hands each call its answer.
func (c *Committer) commit(batch []*call) {
	ctx, cancel := c.batchContext(batch)
	defer cancel()
	c.batches.Add(1)
	c.txns.Add(int64(len(batch)))
	for _, cl := range batch {
		cl.txn = cl.txn.prepared()
	}
	if len(batch) == 1 {
		cl := batch[0]
		cl.finish(c.alone(ctx, cl.txn))
		return
	}
	ops := make([]clientv3.Op, len(batch))
	for i, cl := range batch {
		ops[i] = clientv3.OpTxn(cl.txn.If, cl.txn.Then, cl.txn.Else)
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err == nil {
		c.saw(resp)
		for i, cl := range batch {
			r := resp.Responses[i].GetResponseTxn()
			r.Header = resp.Header
			cl.finish((*clientv3.TxnResponse)(r), nil)
		}
		return
	}
	if !refusedWhole(err) {
		for _, cl := range batch {
			cl.finish(nil, err)
		}
		return
	}
	// Nothing of the batch was applied: let each transaction meet its own
	// fate, concurrently (etcd's own pipelining applies).
	var wg sync.WaitGroup
	for _, cl := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(cl.ctx)
			defer cancel()
			stop := context.AfterFunc(c.stop, cancel) // Close does not wait for it
			defer stop()
			cl.finish(c.alone(ctx, cl.txn))
		}()
	}
	wg.Wait()
}

// batchContext lives until the committer closes or every caller of the
// batch has given up: one caller's cancellation does not cancel the
// others' writes.
func (c *Committer) batchContext(batch []*call) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(c.stop)
	left := atomic.Int64{}
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, cl := range batch {
		stops[i] = context.AfterFunc(cl.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// refusedWhole reports whether etcd refused the request before applying
// any of it for a reason that may belong to one transaction of the batch
// alone.
func refusedWhole(err error) bool {
	for _, e := range []error{
		rpctypes.ErrLeaseNotFound, rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps,
		rpctypes.ErrRequestTooLarge, rpctypes.ErrKeyNotFound, rpctypes.ErrEmptyKey,
		// A full database refuses a transaction with any put; the deletes
		// of a batch (releases, resignations) must still go through.
		rpctypes.ErrNoSpace,
	} {
		if errors.Is(err, e) || rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(e) {
			return true
		}
	}
	return false
}

// alone commits t as a transaction of its own.
func (c *Committer) alone(ctx context.Context, t Txn) (*clientv3.TxnResponse, error) {
	resp, err := c.cli.Txn(ctx).If(t.If...).Then(t.Then...).Else(t.Else...).Commit()
	if err == nil {
		c.saw(resp)
	}
	return resp, err
}

func (cl *call) finish(resp *clientv3.TxnResponse, err error) {
	cl.resp, cl.err = resp, err
	close(cl.done)
}

// size approximates t's bytes on the wire: its keys and values.
func size(t Txn) int {
	n := 0
	for _, cmp := range t.If {
		n += len(cmp.KeyBytes()) + len(cmp.ValueBytes()) + 32
	}
	for _, ops := range [][]clientv3.Op{t.Then, t.Else} {
		for _, op := range ops {
			n += len(op.KeyBytes()) + len(op.RangeBytes()) + len(op.ValueBytes()) + 16
		}
	}
	return n
}
