package grantwatch

import (
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Feed is a subscription to the changes under one key prefix (a lock's or
// an election's queue, or an election's keys), for a waiter that counts
// the entries ahead of it or an observer that follows an election: any
// number of them share the Watcher's etcd watch instead of opening one
// each.
//
// Guarantees: every change under the prefix with a revision above the
// position Subscribe returned (deletions only, or puts too) is delivered,
// in revision order, unless the Watcher's etcd watch broke; then Take
// reports the restart with the new watch's position once it runs again,
// and changes between the old position and the new one may be missing
// (read them from etcd). Changes at or below the position may be delivered
// too: a subscriber that has the state at revision C skips changes at or
// below C.
type Feed struct {
	w      *Watcher
	prefix string
	puts   bool
	ready  chan struct{} // holds a token while something waits in Take

	mu          sync.Mutex
	pending     []*clientv3.Event
	restartedAt int64
}

// Subscribe starts a Feed of the changes under prefix (which must end in
// "/" and lie under one of the Watcher's prefixes): deletions, and puts
// too when puts is set. It returns the Feed and its position: every change
// above that revision will be delivered. Stop the Feed when done.
func (w *Watcher) Subscribe(prefix string, puts bool) (f *Feed, from int64) {
	f = &Feed{w: w, prefix: prefix, puts: puts, ready: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.feeds[prefix] == nil {
		w.feeds[prefix] = make(map[*Feed]struct{})
	}
	w.feeds[prefix][f] = struct{}{}
	return f, w.pos[w.cover(prefix)]
}

// cover is the Watcher prefix that prefix lies under.
func (w *Watcher) cover(prefix string) string {
	for _, p := range w.prefixes {
		if strings.HasPrefix(prefix, p) {
			return p
		}
	}
	return ""
}

// Ready receives when Take has something to return.
func (f *Feed) Ready() <-chan struct{} { return f.ready }

// Take returns the changes delivered since the last Take, oldest first.
// If the Watcher's etcd watch restarted since, restartedAt is the new
// watch's position (changes up to it may be missing) and changes only
// holds those after the restart; else it is 0.
func (f *Feed) Take() (changes []*clientv3.Event, restartedAt int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	changes, restartedAt = f.pending, f.restartedAt
	f.pending, f.restartedAt = nil, 0
	return changes, restartedAt
}

// Stop ends the subscription.
func (f *Feed) Stop() {
	w := f.w
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.feeds[f.prefix], f)
	if len(w.feeds[f.prefix]) == 0 {
		delete(w.feeds, f.prefix)
	}
}

func (f *Feed) push(evs []*clientv3.Event) {
	f.mu.Lock()
	f.pending = append(f.pending, evs...)
	f.mu.Unlock()
	f.signal()
}

func (f *Feed) restart(at int64) {
	f.mu.Lock()
	f.pending, f.restartedAt = nil, at
	f.mu.Unlock()
	f.signal()
}

func (f *Feed) signal() {
	select {
	case f.ready <- struct{}{}:
	default:
	}
}
