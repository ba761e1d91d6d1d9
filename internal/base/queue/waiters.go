package queue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/third_party/forked/golang/btree"

	"github.com/coordd/coordd/internal/base/grantwatch"
)

// Waiters waits for the turns of every entry that waits on this member.
// For each queue with waiters here it keeps one copy of the queue's order
// (a mirror), built with one read and kept current by one Feed of the
// member's shared watch (grantwatch), so that:
//   - a waiter costs one registration and a node of the mirror: it reads
//     nothing, and is woken only when its own turn comes or its entry goes;
//   - a deletion costs O(1), plus O(k) for the k waiters it grants: the
//     mirror tracks where the granted part of the queue ends, and only
//     entries crossing that boundary are looked at.
//
// Without it every waiter read the entries ahead of it and was woken by
// every deletion in the queue, which it answered by walking them all:
// O(n) per waiter per grant, O(n²) per grant for n waiters.
//
// A mirror lives while its queue has waiters on this member, and is
// dropped (its goroutine ends) with the last one.
type Waiters struct {
	cli  *clientv3.Client
	w    *grantwatch.Watcher
	opts WaitersOptions

	mu       sync.Mutex
	mirrors  map[mirrorID]*mirror
	byPrefix map[string][]*mirror // the same mirrors, by queue (usually one each)
}

// WaitersOptions describe the entries of the queues a Waiters serves.
type WaitersOptions struct {
	// Exclusive reports whether an entry holds the queue back for a Turn
	// whose Blocks is set (a writer, for readers); nil: every entry. It
	// must be the same function as every such Turn's Blocks.
	Exclusive func(*mvccpb.KeyValue) bool
	// Notable reports which entries a Turn's Gone lists when they go away
	// ahead of it (nil: none). Keep it to the few entries a caller needs
	// to hear of (lock-delay holders): every one that goes is remembered
	// while a waiter might need it.
	Notable func(*mvccpb.KeyValue) bool
}

// NewWaiters returns a Waiters whose mirrors follow w, which must watch
// the queues' prefixes and run.
func NewWaiters(cli *clientv3.Client, w *grantwatch.Watcher, opts WaitersOptions) *Waiters {
	return &Waiters{cli: cli, w: w, opts: opts, mirrors: map[mirrorID]*mirror{}, byPrefix: map[string][]*mirror{}}
}

type mirrorID struct {
	prefix string
	limit  int
}

// Wait blocks until fewer than t's limit entries (of those t.Blocks
// counts) are ahead of t's entry, and returns the revision at which that
// became true. It fails with ErrEntryGone as soon as the entry itself goes
// away (its session ended), with ErrTakenOver when another call owns the
// entry (see Turn.OwnedAt), and with ctx's error when ctx ends.
func (ws *Waiters) Wait(ctx context.Context, t *Turn) (int64, error) {
	m := ws.use(t.prefix, t.limit)
	defer ws.drop(m)
	wt := newWaiting(t)
	wt.done = make(chan outcome, 1)
	m.register(wt, t.heads)
	t.heads = nil // registered: the caller's read is not needed any more
	select {
	case o := <-wt.done:
		t.Gone = append(t.Gone, o.gone...)
		return o.rev, o.err
	case <-ctx.Done():
		m.unregister(wt)
		return 0, ctx.Err()
	}
}

// Park is Wait without a goroutine: it registers t's wait and returns at
// once, and then is called once, on a goroutine of its own, with what Wait
// would have returned (t.Gone appended to first). While it waits, the wait
// is a registration on its mirror's node and ctx's AfterFunc: a crowd of
// parked waits costs no stacks. ctx must end once then was called (the
// AfterFunc stays registered until then).
func (ws *Waiters) Park(ctx context.Context, t *Turn, then func(rev int64, err error)) {
	m := ws.use(t.prefix, t.limit)
	wt := newWaiting(t)
	wt.then = func(o outcome) {
		ws.drop(m)
		t.Gone = append(t.Gone, o.gone...)
		then(o.rev, o.err)
	}
	m.register(wt, t.heads)
	t.heads = nil
	context.AfterFunc(ctx, func() {
		if m.unregister(wt) {
			ws.drop(m)
			then(0, ctx.Err())
		}
	})
}

// Hold keeps this member's mirror of the queue under prefix with limit
// (see Entry, Heads) until release is called, making it if there is none,
// and returns once it has read the queue, or with ctx's error (released).
// A caller about to wait on a queue that its member may not mirror yet
// (after a restart, a crowd's retries) holds it first, so that the view
// serves what precedes the wait.
func (ws *Waiters) Hold(ctx context.Context, prefix string, limit int) (release func(), err error) {
	m := ws.use(prefix, limit)
	var once sync.Once
	release = func() { once.Do(func() { ws.drop(m) }) }
	select {
	case <-m.firstLoad:
		return release, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// use returns the mirror of the queue under prefix with limit, made if it
// is the first user, counting one more user; drop forgets the user.
func (ws *Waiters) use(prefix string, limit int) *mirror {
	id := mirrorID{prefix, max(limit, 1)}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	m := ws.mirrors[id]
	if m == nil {
		m = newMirror(ws, id)
		ws.mirrors[id] = m
		ws.byPrefix[id.prefix] = append(ws.byPrefix[id.prefix], m)
	}
	m.refs++
	return m
}

func newWaiting(t *Turn) *waiting {
	owned := t.OwnedAt
	if owned == 0 {
		owned = t.rev
	}
	return &waiting{key: t.key, rev: t.rev, owned: owned, shared: t.Blocks != nil}
}

// drop forgets one user of m, and m itself with the last.
func (ws *Waiters) drop(m *mirror) {
	ws.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last {
		delete(ws.mirrors, m.id)
		ms := slices.DeleteFunc(ws.byPrefix[m.id.prefix], func(o *mirror) bool { return o == m })
		if len(ms) == 0 {
			delete(ws.byPrefix, m.id.prefix)
		} else {
			ws.byPrefix[m.id.prefix] = ms
		}
	}
	ws.mu.Unlock()
	if last {
		m.close()
	}
}

// outcome is how a wait ended.
type outcome struct {
	rev  int64
	err  error
	gone []Gone
}

// waiting is one registered waiter.
type waiting struct {
	key    string
	rev    int64 // its entry's create revision
	owned  int64 // the revision at which its caller made the entry its own
	shared bool  // counts only Exclusive entries ahead (a reader)
	// The outcome goes to done (Wait), or to then on a goroutine of its
	// own (Park); ended is set once it went (guarded by the mirror's mu).
	done  chan outcome
	then  func(outcome)
	ended bool
	gone  []Gone // notable entries ahead that went before the mirror saw them
	// heads are the Notable entries ahead as the caller read them, until
	// the mirror is loaded to compare them with.
	heads []*mvccpb.KeyValue
	node  *node // its entry in the mirror, once seen
}

// node is one queue entry in a mirror, in create revision order.
type node struct {
	kv         *mvccpb.KeyValue
	exclusive  bool
	prev, next *node
	// inAll: among the first limit entries (an exclusive waiter here has
	// its turn); inEx: at or before the limit-th exclusive entry (a shared
	// waiter here has its turn). Both zones are prefixes of the queue.
	inAll, inEx bool
	waiter      *waiting
}

// mirror is one queue's order as this member last saw it.
type mirror struct {
	ws    *Waiters
	id    mirrorID
	refs  int // guarded by ws.mu
	feed  *grantwatch.Feed
	from  int64 // the Feed's position when subscribed
	stop  context.CancelFunc
	ended chan struct{}
	// applying is held while a batch of the Feed is taken and applied, so
	// that batches are applied in order by whoever takes them (the mirror's
	// goroutine, or a read that catches the mirror up; see drain).
	applying sync.Mutex
	// reload wakes the goroutine to read the queue again (a read found
	// that the member's watch restarted).
	reload chan struct{}
	// firstLoad is closed once the queue was first read.
	firstLoad chan struct{}

	mu     sync.Mutex
	loaded bool
	pos    int64 // every change up to pos is applied
	head   *node
	tail   *node
	byKey  map[string]*node
	byRev  *btree.BTree[*node] // the same nodes by create revision (token)
	// allEnd and exEnd are the last nodes of the two zones (nil: empty);
	// nAll and nEx count the zone's nodes and the exclusive nodes of the
	// inEx zone.
	allEnd, exEnd *node
	nAll, nEx     int
	// pending are waiters whose entry the mirror has not seen yet.
	pending map[string]*waiting
	// waiters counts registered waiters (pending or on a node).
	waiters int
	// notable are the Notable entries that went away, while a waiter that
	// was behind them may still need to hear of it; past trimAt of them,
	// those no waiter needs are dropped.
	trimAt int
	// was behind them may still need to hear of it.
	notable []noted
}

// noted is a Notable entry that went away, and the revision at which the
// mirror learned it (its deletion's, or the load's that missed it).
type noted struct {
	Gone
	at int64
}

func newMirror(ws *Waiters, id mirrorID) *mirror {
	m := &mirror{ws: ws, id: id, byKey: map[string]*node{}, byRev: newRevIndex(), pending: map[string]*waiting{},
		ended: make(chan struct{}), reload: make(chan struct{}, 1), firstLoad: make(chan struct{})}
	m.feed, m.from = ws.w.Subscribe(id.prefix, true)
	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	go m.run(ctx)
	return m
}

// close stops the mirror's goroutine and its Feed and waits for them.
func (m *mirror) close() {
	m.stop()
	<-m.ended
	m.feed.Stop()
}

// run keeps the mirror current until ctx ends: it loads the queue (again
// after the member's watch restarted) and applies each change.
func (m *mirror) run(ctx context.Context) {
	defer close(m.ended)
	for ctx.Err() == nil {
		m.mu.Lock()
		loaded := m.loaded
		m.mu.Unlock()
		if !loaded {
			if err := m.load(ctx); err != nil {
				m.failAll(fmt.Errorf("queue: wait: %w", err))
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.feed.Ready():
			m.drain()
		case <-m.reload:
		}
	}
}

// drain applies what the Feed holds, in order. When the member's watch
// restarted, changes may have been missed: the mirror is marked for a new
// read of the queue (which covers the changes taken with the restart).
func (m *mirror) drain() {
	m.applying.Lock()
	defer m.applying.Unlock()
	evs, restarted := m.feed.Take()
	if restarted != 0 {
		m.mu.Lock()
		m.loaded = false
		m.mu.Unlock()
		select {
		case m.reload <- struct{}{}:
		default:
		}
		return
	}
	m.apply(evs)
}

// load reads the whole queue and rebuilds the mirror from it: waiters
// whose entries are gone fail with ErrEntryGone, those whose turn has come
// are told so, Notable entries that vanished are remembered as gone.
func (m *mirror) load(ctx context.Context) error {
	resp, err := m.ws.cli.Get(ctx, m.id.prefix, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.byKey
	m.head, m.tail, m.allEnd, m.exEnd, m.nAll, m.nEx = nil, nil, nil, nil, 0, 0
	m.byKey = make(map[string]*node, len(resp.Kvs))
	m.byRev.Clear(false)
	rev := resp.Header.Revision
	if m.pos == 0 {
		close(m.firstLoad)
	}
	m.pos, m.loaded = rev, true
	for _, kv := range resp.Kvs {
		n := &node{kv: kv, exclusive: m.exclusive(kv)}
		if o := old[string(kv.Key)]; o != nil && o.kv.CreateRevision == kv.CreateRevision && o.waiter != nil {
			wt := o.waiter
			o.waiter = nil
			m.attach(n, wt)
		}
		m.append(n, rev)
	}
	for k, o := range old {
		if n := m.byKey[k]; n != nil && n.kv.CreateRevision == o.kv.CreateRevision {
			continue
		}
		// Gone while no watch ran: the exact revision is unknown.
		if o.waiter != nil {
			m.finish(o.waiter, outcome{err: ErrEntryGone})
		}
		m.noteGone(o.kv, 0, rev)
	}
	m.settlePending()
	return nil
}

func (m *mirror) exclusive(kv *mvccpb.KeyValue) bool {
	return m.ws.opts.Exclusive == nil || m.ws.opts.Exclusive(kv)
}

// apply applies changes in revision order.
func (m *mirror) apply(evs []*clientv3.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		return // the load covers them
	}
	// One revision may change several entries (a transaction): all of a
	// revision's changes come in one batch, after those of every earlier
	// revision.
	base := m.pos
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		if rev <= base {
			continue // in the read already
		}
		key := string(ev.Kv.Key)
		switch {
		case ev.Type == mvccpb.DELETE:
			if n := m.byKey[key]; n != nil {
				m.remove(n, rev)
			}
		case ev.Kv.CreateRevision == rev: // a new entry, at the tail
			n := &node{kv: ev.Kv, exclusive: m.exclusive(ev.Kv)}
			if wt := m.pending[key]; wt != nil && wt.rev == rev {
				delete(m.pending, key)
				m.attach(n, wt)
			}
			m.append(n, rev)
		default: // a new value of an entry (a retry took it over)
			if n := m.byKey[key]; n != nil && n.kv.CreateRevision == ev.Kv.CreateRevision {
				n.kv = ev.Kv
			}
		}
		m.pos = rev
	}
	m.settlePending()
}

// append adds n at the tail (entries arrive in create revision order) and
// into each zone that is not full; a waiter on it whose turn that is, is
// told.
func (m *mirror) append(n *node, rev int64) {
	m.byKey[string(n.kv.Key)] = n
	m.byRev.ReplaceOrInsert(n)
	n.prev = m.tail
	if m.tail != nil {
		m.tail.next = n
	} else {
		m.head = n
	}
	m.tail = n
	m.grow(rev)
}

// remove takes n out at revision rev, moves the zones' ends past it, and
// tells the waiters whose turn came.
func (m *mirror) remove(n *node, rev int64) {
	delete(m.byKey, string(n.kv.Key))
	m.byRev.Delete(n)
	if n.waiter != nil {
		m.finish(n.waiter, outcome{err: ErrEntryGone})
	}
	m.noteGone(n.kv, rev, rev)
	if n.inAll {
		m.nAll--
		if m.allEnd == n {
			m.allEnd = n.prev
		}
	}
	if n.inEx {
		if n.exclusive {
			m.nEx--
		}
		if m.exEnd == n {
			m.exEnd = n.prev
		}
	}
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		m.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		m.tail = n.prev
	}
	n.prev, n.next = nil, nil
	m.grow(rev)
}

// grow extends each zone that is not full over the nodes after its end,
// telling the waiters whose turn that is (at rev). Each node enters each
// zone once, so growing costs O(1) per node over the mirror's life.
func (m *mirror) grow(rev int64) {
	for c := m.after(m.allEnd); c != nil && m.nAll < m.id.limit; c = c.next {
		c.inAll, m.allEnd = true, c
		m.nAll++
		m.check(c, rev)
	}
	for c := m.after(m.exEnd); c != nil && m.nEx < m.id.limit; c = c.next {
		c.inEx, m.exEnd = true, c
		if c.exclusive {
			m.nEx++
		}
		m.check(c, rev)
	}
}

// after is the node after a zone's end: the head for an empty zone.
func (m *mirror) after(end *node) *node {
	if end == nil {
		return m.head
	}
	return end.next
}

// check tells n's waiter, if any, that its turn came at rev, if it did.
func (m *mirror) check(n *node, rev int64) {
	wt := n.waiter
	if wt == nil || (wt.shared && !n.inEx) || (!wt.shared && !n.inAll) {
		return
	}
	n.waiter = nil
	m.finish(wt, outcome{rev: rev})
}

// finish ends wt's wait with o (and the notable entries that went ahead
// of it, for a turn).
func (m *mirror) finish(wt *waiting, o outcome) {
	if o.err == nil {
		o.gone = wt.gone
		for _, g := range m.notable {
			if g.KV.CreateRevision < wt.rev && g.at > wt.rev {
				o.gone = append(o.gone, g.Gone)
			}
		}
	}
	wt.node = nil
	m.waiters--
	wt.ended = true
	if wt.then != nil {
		go wt.then(o)
		return
	}
	wt.done <- o
}

// noteGone remembers a Notable entry that went at rev (0: unknown), as
// the mirror learned at revision at, while some waiter behind it waits.
func (m *mirror) noteGone(kv *mvccpb.KeyValue, rev, at int64) {
	if m.ws.opts.Notable == nil || m.waiters == 0 || !m.ws.opts.Notable(kv) {
		return
	}
	m.notable = append(m.notable, noted{Gone{KV: kv, Rev: rev}, at})
	if len(m.notable) < max(m.trimAt, 256) {
		return
	}
	// Only waiters created before an entry went need to hear of it: drop
	// what went before the oldest waiter. The oldest waiter is pending or
	// the first with a node in queue order.
	oldest := int64(-1)
	for _, wt := range m.pending {
		if oldest < 0 || wt.rev < oldest {
			oldest = wt.rev
		}
	}
	for n := m.head; n != nil; n = n.next {
		if n.waiter != nil {
			if oldest < 0 || n.waiter.rev < oldest {
				oldest = n.waiter.rev
			}
			break
		}
	}
	kept := m.notable[:0]
	for _, g := range m.notable {
		if oldest < 0 || g.at > oldest {
			kept = append(kept, g)
		}
	}
	clear(m.notable[len(kept):])
	m.notable = kept
	m.trimAt = 2 * len(kept)
}

// register adds wt: on its node if the mirror has it (and tells it at once
// if its turn has come), else as pending until its entry arrives. heads
// are the queue's first entries as wt's caller read them when it
// enqueued: Notable ones the mirror no longer has went ahead of it.
func (m *mirror) register(wt *waiting, heads []*mvccpb.KeyValue) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waiters++
	if m.ws.opts.Notable != nil {
		for _, kv := range heads {
			if kv.CreateRevision < wt.rev && m.ws.opts.Notable(kv) {
				wt.heads = append(wt.heads, kv)
			}
		}
	}
	if !m.loaded {
		m.addPending(wt)
		return
	}
	m.compareHeads(wt)
	if m.pos < wt.rev {
		m.addPending(wt)
		return
	}
	n := m.byKey[wt.key]
	if n == nil || n.kv.CreateRevision != wt.rev {
		m.finish(wt, outcome{err: ErrEntryGone})
		return
	}
	if m.attach(n, wt) {
		m.check(n, m.pos)
	}
}

// attach makes wt the waiter of n, its entry, unless n's waiter owns the
// entry by a later write: of the two, the one that owns it earlier ends
// with ErrTakenOver (see Turn.OwnedAt). An entry has one waiter, so a
// replaced call that gives up cannot take the owner's wait with it. It
// reports whether wt is n's waiter now.
func (m *mirror) attach(n *node, wt *waiting) bool {
	if old := n.waiter; old != nil && old != wt {
		if old.owned >= wt.owned {
			m.finish(wt, outcome{err: ErrTakenOver})
			return false
		}
		n.waiter = nil
		m.finish(old, outcome{err: ErrTakenOver})
	}
	n.waiter, wt.node = wt, n
	return true
}

// addPending keeps wt until the mirror sees its entry. Pending waiters are
// kept by key, one each, by the rule of attach; one whose entry has an
// older create revision than the other's waits for an entry that was
// deleted (a key is created again only after a deletion).
func (m *mirror) addPending(wt *waiting) {
	if old := m.pending[wt.key]; old != nil && old != wt {
		switch {
		case old.rev < wt.rev:
			m.finish(old, outcome{err: ErrEntryGone})
		case old.rev > wt.rev:
			m.finish(wt, outcome{err: ErrEntryGone})
			return
		case old.owned >= wt.owned:
			m.finish(wt, outcome{err: ErrTakenOver})
			return
		default:
			m.finish(old, outcome{err: ErrTakenOver})
		}
	}
	m.pending[wt.key] = wt
}

// compareHeads moves wt's heads that the (loaded) mirror no longer has to
// its gone list: they went before the mirror could see them. Those still
// there are followed by the mirror from now on.
func (m *mirror) compareHeads(wt *waiting) {
	for _, kv := range wt.heads {
		if n := m.byKey[string(kv.Key)]; n == nil || n.kv.CreateRevision != kv.CreateRevision {
			wt.gone = append(wt.gone, Gone{KV: kv})
		}
	}
	wt.heads = nil
}

// settlePending fails the pending waiters whose entry the mirror has gone
// past without seeing: it was deleted before. It also drops remembered
// notable entries once no waiter is left.
func (m *mirror) settlePending() {
	for k, wt := range m.pending {
		if wt.heads != nil {
			m.compareHeads(wt)
		}
		if m.pos < wt.rev {
			continue
		}
		delete(m.pending, k)
		if n := m.byKey[k]; n != nil && n.kv.CreateRevision == wt.rev {
			if m.attach(n, wt) { // seen in a load
				m.check(n, m.pos)
			}
			continue
		}
		m.finish(wt, outcome{err: ErrEntryGone})
	}
	if m.waiters == 0 {
		m.notable, m.trimAt = nil, 0
	}
}

// unregister removes wt (its caller gave up) and reports whether it did:
// it does nothing if wt's wait already ended.
func (m *mirror) unregister(wt *waiting) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if wt.ended {
		return false // already counted out
	}
	wt.ended = true
	if m.pending[wt.key] == wt {
		delete(m.pending, wt.key)
	}
	if wt.node != nil && wt.node.waiter == wt {
		wt.node.waiter = nil
	}
	wt.node = nil
	m.waiters--
	if m.waiters == 0 {
		m.notable, m.trimAt = nil, 0
	}
	return true
}

// failAll ends every registered wait with err (the queue could not be
// read).
func (m *mirror) failAll(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, wt := range m.pending {
		delete(m.pending, k)
		m.finish(wt, outcome{err: err})
	}
	for _, n := range m.byKey {
		if n.waiter != nil {
			wt := n.waiter
			n.waiter = nil
			m.finish(wt, outcome{err: err})
		}
	}
}

// Waiting returns how many waits are registered on this member now.
func (ws *Waiters) Waiting() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	n := 0
	for _, m := range ws.mirrors {
		m.mu.Lock()
		n += m.waiters
		m.mu.Unlock()
	}
	return n
}
