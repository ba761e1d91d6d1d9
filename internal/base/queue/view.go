package queue

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"k8s.io/utils/third_party/forked/golang/btree"
)

// The reads below answer calls that name a crowded queue (an enqueue, a
// release or a fenced check by token, a page of a description) from this
// member's mirror of it, in O(log n), instead of an etcd range that etcd
// sorts whole. They exist only while the member has a mirror of the queue:
// while some call waits on it here, which is when a queue is crowded.
// What a caller concludes from Find or Heads must stay true after the
// mirror's revision (an entry that holds keeps holding until it is
// deleted; a deleted entry's create revision is never used again), or be
// checked again in the caller's etcd transaction; Page first catches the
// mirror up with a revision the caller read.

func newRevIndex() *btree.BTree[*node] {
	return btree.New(32, func(a, b *node) bool { return a.kv.CreateRevision < b.kv.CreateRevision })
}

// turn reports whether n's turn has come: among the first limit entries
// for an exclusive entry, before the limit-th exclusive entry for another.
func (n *node) turn() bool {
	if n.exclusive {
		return n.inAll
	}
	return n.inEx
}

// mirrorOf returns a loaded mirror of the queue under prefix with limit
// (any limit when limit is 0), or nil.
func (ws *Waiters) mirrorOf(prefix string, limit int) *mirror {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, m := range ws.byPrefix[prefix] {
		if limit == 0 || m.id.limit == max(limit, 1) {
			return m
		}
	}
	return nil
}

// Found is an entry as a mirror saw it (see Waiters.Find).
type Found struct {
	// KV is the entry; nil if it was deleted by the time the mirror was
	// read (or never was one of this queue): it never comes back, since a
	// create revision is never used again.
	KV *mvccpb.KeyValue
	// Turn: its turn had come (granted, for a lock), counted with Limit;
	// it stays so until the entry is deleted, since entries only join
	// behind it.
	Turn  bool
	Limit int
}

// Viewed reports whether this member keeps a loaded mirror of the queue
// under prefix: whether Find, Heads and Page may answer for it.
func (ws *Waiters) Viewed(prefix string) bool {
	m := ws.mirrorOf(prefix, 0)
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loaded
}

// Find looks up the entry created at rev in this member's mirror of the
// queue under prefix, in O(log n). ok is false when the member keeps no
// mirror of the queue, or its mirror has not yet seen revision rev: the
// caller reads etcd then.
func (ws *Waiters) Find(prefix string, rev int64) (f Found, ok bool) {
	m := ws.mirrorOf(prefix, 0)
	if m == nil {
		return Found{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded || m.pos < rev {
		return Found{}, false
	}
	f = Found{Limit: m.id.limit}
	if n, hit := m.byRev.Get(&node{kv: &mvccpb.KeyValue{CreateRevision: rev}}); hit {
		f.KV, f.Turn = n.kv, n.turn()
	}
	return f, true
}

// Heads returns the first n entries of the queue under prefix with limit
// as this member's mirror saw them, in O(n). ok is false when the
// member keeps no mirror of the queue or the mirror holds fewer than n
// entries. While all of them exist they stay the queue's first n: entries
// only join at the tail.
func (ws *Waiters) Heads(prefix string, limit, n int) (heads []*mvccpb.KeyValue, ok bool) {
	m := ws.mirrorOf(prefix, limit)
	if m == nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded || len(m.byKey) < n {
		return nil, false
	}
	heads = make([]*mvccpb.KeyValue, 0, n)
	for c := m.head; c != nil && len(heads) < n; c = c.next {
		heads = append(heads, c.kv)
	}
	return heads, true
}

// Entry returns the entry key of the queue under prefix with limit as this
// member's mirror saw it; ok is false when the member keeps no loaded
// mirror of the queue or the mirror has no such entry. O(1).
func (ws *Waiters) Entry(prefix string, limit int, key string) (kv *mvccpb.KeyValue, ok bool) {
	m := ws.mirrorOf(prefix, limit)
	if m == nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		return nil, false
	}
	n := m.byKey[key]
	if n == nil {
		return nil, false
	}
	return n.kv, true
}

// Page is part of a queue in queue order, as a mirror saw it at Pos.
type Page struct {
	Entries []Found // each with its Turn
	// Len is how many entries the queue has; Turns how many of them have
	// had their turn (hold, for a lock).
	Len, Turns int
	Limit      int
	Pos        int64
}

// Page returns up to size entries of the queue under prefix that follow
// create revision after (0: from the head), as of revision rev: this
// member's mirror of it first catches up with every change up to rev
// (rev read linearizably from etcd makes the page a linearizable read).
// ok is false when the member keeps no mirror of the queue, or it is being
// read again: the caller reads etcd. It costs O(log n + size + the entries
// whose turn has come).
func (ws *Waiters) Page(ctx context.Context, prefix string, rev, after int64, size int) (Page, bool, error) {
	m := ws.mirrorOf(prefix, 0)
	if m == nil {
		return Page{}, false, nil
	}
	if err := ws.w.Sync(ctx, prefix, rev); err != nil {
		return Page{}, false, err
	}
	m.drain() // what the Feed got up to rev
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded || isClosed(m.ended) {
		return Page{}, false, nil
	}
	p := Page{Len: len(m.byKey), Limit: m.id.limit, Pos: max(m.pos, rev)}
	for c := m.head; c != nil && c.turn(); c = c.next {
		p.Turns++
	}
	m.byRev.AscendGreaterOrEqual(&node{kv: &mvccpb.KeyValue{CreateRevision: after + 1}}, func(n *node) bool {
		p.Entries = append(p.Entries, Found{KV: n.kv, Turn: n.turn(), Limit: m.id.limit})
		return len(p.Entries) < size
	})
	return p, true, nil
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
