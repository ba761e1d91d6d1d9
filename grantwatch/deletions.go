package grantwatch

import "sync"

// Deleted is the deletion of Key at revision Rev.
type Deleted struct {
	Key string
	Rev int64
}

// Deletions is a subscription to every deletion under one key prefix (a
// lock's or an election's queue), for a waiter that counts the entries
// ahead of it: many waiters share the Watcher's one etcd watch instead of
// opening one each.
//
// Guarantees: every deletion under the prefix that this member applies
// after Deletions returns is delivered, in revision order, unless the
// Watcher's etcd watch broke in between; then Take reports Restarted once
// the watch runs again, and the subscriber must read the state afresh
// (deletions around the break may be missing). A deletion may also be
// delivered that was applied before Deletions returned: a subscriber that
// read the state at revision C skips deletions at or below C.
type Deletions struct {
	w      *Watcher
	prefix string
	ready  chan struct{} // holds a token while something waits in Take

	mu        sync.Mutex
	pending   []Deleted
	restarted bool
}

// Deletions subscribes to the deletions under prefix, which must end in
// "/". Stop it when done.
func (w *Watcher) Deletions(prefix string) *Deletions {
	d := &Deletions{w: w, prefix: prefix, ready: make(chan struct{}, 1)}
	w.mu.Lock()
	if w.prefixSubs[prefix] == nil {
		w.prefixSubs[prefix] = make(map[*Deletions]struct{})
	}
	w.prefixSubs[prefix][d] = struct{}{}
	w.mu.Unlock()
	return d
}

// Ready receives when Take has something to return.
func (d *Deletions) Ready() <-chan struct{} { return d.ready }

// Take returns the deletions delivered since the last Take, oldest first,
// and whether the Watcher's etcd watch restarted since (then deletions
// may be missing: read the state again).
func (d *Deletions) Take() (deleted []Deleted, restarted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	deleted, restarted = d.pending, d.restarted
	d.pending, d.restarted = nil, false
	return deleted, restarted
}

// Stop ends the subscription.
func (d *Deletions) Stop() {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.prefixSubs[d.prefix], d)
	if len(w.prefixSubs[d.prefix]) == 0 {
		delete(w.prefixSubs, d.prefix)
	}
}

func (d *Deletions) push(del Deleted, restart bool) {
	d.mu.Lock()
	if restart {
		d.restarted, d.pending = true, nil
	} else {
		d.pending = append(d.pending, del)
	}
	d.mu.Unlock()
	select {
	case d.ready <- struct{}{}:
	default:
	}
}
