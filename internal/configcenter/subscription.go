package configcenter

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// EventType is the kind of a watch Event.
type EventType int

// Event types.
const (
	// EventSnapshot: the complete state of every subscribed namespace at
	// Revision; it replaces whatever the subscriber had.
	EventSnapshot EventType = iota + 1
	// EventChange: one release (Release), complete, at Revision.
	EventChange
	// EventBookmark: nothing changed in the subscribed namespaces up to
	// Revision; resume from Revision+1.
	EventBookmark
)

// Event is what a subscriber receives.
type Event struct {
	Type      EventType
	Revision  int64
	Release   *Release   // EventChange
	Snapshots []Snapshot // EventSnapshot: one per subscribed namespace, in the order asked
	// Cluster is etcd's cluster id (EventSnapshot): revisions compare only
	// within one cluster.
	Cluster uint64
	// Gray (EventChange) is the gray release the subscriber runs in the
	// release's namespace; the release is then as its instances see it,
	// without the keys the gray overrides.
	Gray int64
}

// Subscription is one subscriber's view of the cache. It is not safe for
// concurrent use: one goroutine calls Next.
type Subscription struct {
	c          *Cache
	namespaces []string
	who        *Identity // nil: an anonymous subscriber, which no gray matches
	// grays is, per namespace, the gray release the subscriber was last
	// given (in a snapshot), without the namespaces given none: nil for a
	// subscriber that runs no gray, so a release costs it no lookup. Read
	// under c.mu, written under c.mu (read) and mu.
	grays map[string]int64

	mu    sync.Mutex
	queue []Event // CHANGE events not yet returned
	// long: the queue held more than keptQueueCap events since it was
	// last empty, so its array may be a backlog's.
	long     bool
	snapshot bool // the next event is a snapshot (first, or after a reset)
	resets   int  // how often the queue overflowed
	signal   chan struct{}
	greeted  bool // the first Next answers at once, with a bookmark if nothing else
}

// MaxNamespacesPerWatch bounds one subscription's namespaces.
const MaxNamespacesPerWatch = 64

// Subscribe registers a subscriber for namespaces. With from == 0 it starts
// with a snapshot that includes every write finished before the call
// (unless the cache lags more than a second). With from > 0 (the last revision it received + 1) it
// resumes: the releases at from and after, from the cache's history, or a
// snapshot if the history does not reach back that far. A from beyond the
// cache's revision waits (up to three seconds) for the cache to catch up,
// and fails with ErrBehind if it does not: a subscriber is never sent
// something older than what it has. Close the subscription when done.
func (c *Cache) Subscribe(ctx context.Context, namespaces []string, from int64) (*Subscription, error) {
	return c.SubscribeAs(ctx, namespaces, from, nil)
}

// SubscribeAs is Subscribe for the instance who: where a gray release of
// its namespaces matches it, it sees the gray's content (see Gray). A
// resume gets a snapshot instead of the releases since from when a gray
// of its namespaces runs, or changed since from.
func (c *Cache) SubscribeAs(ctx context.Context, namespaces []string, from int64, who *Identity) (*Subscription, error) {
	return c.subscribe(ctx, namespaces, from, make(chan struct{}, 1), true, who)
}

// SubscribeNotify is Subscribe for a consumer that serves many
// subscriptions from one goroutine: notify (buffered, and shared by them)
// gets a value whenever one of them may have an event, and the consumer
// collects events with TryNext instead of Next.
func (c *Cache) SubscribeNotify(ctx context.Context, namespaces []string, from int64, notify chan struct{}, who *Identity) (*Subscription, error) {
	return c.subscribe(ctx, namespaces, from, notify, true, who)
}

// catchUp waits (briefly) for the cache to reach etcd's current revision,
// read linearizably, so a snapshot taken next includes every write that
// finished before the call. If the cache is slow, it gives up after a
// second: the snapshot is the cache's state, and the newer releases
// follow as changes.
func (c *Cache) catchUp(ctx context.Context) {
	if rev, err := c.store.CurrentRevision(ctx); err == nil {
		_ = c.waitRevision(ctx, rev, time.Second)
	}
}

// subscribe is SubscribeNotify; with catchUp false, the caller has called
// catchUp after this subscription was asked for (WatchMux does it once for
// all the starts it handles together).
func (c *Cache) subscribe(ctx context.Context, namespaces []string, from int64, notify chan struct{}, catchUp bool, who *Identity) (*Subscription, error) {
	if len(namespaces) == 0 || len(namespaces) > MaxNamespacesPerWatch {
		return nil, fmt.Errorf("%w: watch 1 to %d namespaces, not %d", ErrInvalid, MaxNamespacesPerWatch, len(namespaces))
	}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		if err := ValidateNamespace(ns); err != nil {
			return nil, err
		}
		if seen[ns] {
			return nil, fmt.Errorf("%w: namespace %q named twice", ErrInvalid, ns)
		}
		seen[ns] = true
	}
	if from < 0 {
		return nil, fmt.Errorf("%w: revision %d is negative", ErrInvalid, from)
	}
	if who != nil && who.Instance == "" && len(who.Labels) == 0 {
		who = nil
	}
	if who != nil {
		if err := who.validate(); err != nil {
			return nil, err
		}
	}
	if err := c.waitRevision(ctx, from-1, 3*time.Second); err != nil {
		return nil, err
	}
	if from == 0 && catchUp {
		// Start from the current state (see catchUp).
		c.catchUp(ctx)
	}
	s := &Subscription{c: c, namespaces: namespaces, signal: notify, who: who}
	c.mu.Lock()
	defer c.mu.Unlock()
	usable := from > 0 && from-1 >= c.oldest
	for _, ns := range namespaces {
		usable = usable && from-1 >= c.nsOldest[ns]
		if sp := c.spaces[ns]; who != nil && sp != nil && (sp.gray != nil || sp.grayRev >= from) {
			usable = false // what it saw then is not what the history says
		}
	}
	if !usable {
		s.snapshot = true
	} else {
		for _, ev := range c.history {
			if ev.Revision >= from && seen[ev.Release.Namespace] {
				s.pushLocked(ev)
			}
		}
		if len(s.queue) > c.opts.QueueLimit {
			s.dropQueueLocked()
			s.snapshot = true
		}
	}
	for _, ns := range namespaces {
		if c.subs[ns] == nil {
			c.subs[ns] = map[*Subscription]struct{}{}
		}
		c.subs[ns][s] = struct{}{}
	}
	return s, nil
}

// Close unregisters the subscription.
func (s *Subscription) Close() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for _, ns := range s.namespaces {
		delete(s.c.subs[ns], s)
		if len(s.c.subs[ns]) == 0 {
			delete(s.c.subs, ns)
		}
	}
}

// Resets reports how often the subscriber fell too far behind and was
// reset to a snapshot.
func (s *Subscription) Resets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resets
}

// enqueue adds an event for the subscriber without ever blocking: past the
// queue limit the queue is dropped and the next event is a snapshot.
func (s *Subscription) enqueue(ev Event) {
	s.mu.Lock()
	switch {
	case s.snapshot:
	case len(s.queue) >= s.c.opts.QueueLimit:
		s.dropQueueLocked()
		s.snapshot = true
		s.resets++
	default:
		s.pushLocked(ev)
	}
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *Subscription) resetToSnapshot() {
	s.mu.Lock()
	s.dropQueueLocked()
	s.snapshot = true
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// Next returns the subscriber's next event: a snapshot when one is due,
// else the oldest queued release, else, on the first call at once and
// then after the bookmark interval without events, a bookmark (only while the cache's watch is healthy, so
// a subscriber of a member cut off from etcd stops hearing anything and
// can tell). It blocks until one is ready or ctx ends.
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	if !s.greeted {
		// A resumed subscriber learns at once that it is caught up.
		s.greeted = true
		if ev, ok := s.take(true); ok {
			return ev, nil
		}
	}
	timer := time.NewTimer(s.c.opts.Bookmark)
	defer timer.Stop()
	for {
		if ev, ok := s.take(false); ok {
			return ev, nil
		}
		select {
		case <-s.signal:
		case <-timer.C:
			if ev, ok := s.take(true); ok {
				return ev, nil
			}
			timer.Reset(s.c.opts.Bookmark)
		case <-s.c.done:
			return Event{}, ErrStopped
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// TryNext returns the subscription's next event if one is due, without
// blocking: a snapshot, else the oldest queued release, else with bookmark
// (and always on the first call) a bookmark while the cache's watch is
// healthy.
func (s *Subscription) TryNext(bookmark bool) (Event, bool) {
	if !s.greeted {
		s.greeted, bookmark = true, true
	}
	return s.take(bookmark)
}

// take returns a due snapshot or queued event, or with bookmark a bookmark
// if nothing is queued.
//
// A queued release takes the subscription's lock alone: a release reaches
// every subscriber of its namespace at once, and their consumers would
// otherwise all take the cache's lock (shared, but one cache line for
// all) while the next release waits to be applied. A snapshot or a
// bookmark reads the cache's state under the cache's lock (taken first).
func (s *Subscription) take(bookmark bool) (Event, bool) {
	s.mu.Lock()
	if !s.snapshot && len(s.queue) > 0 {
		ev := s.popLocked()
		s.mu.Unlock()
		return ev, true
	}
	due := s.snapshot || bookmark
	s.mu.Unlock()
	if !due {
		return Event{}, false
	}
	s.c.mu.RLock()
	defer s.c.mu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Decided again: the subscription may have changed in between.
	switch {
	case s.snapshot:
		// Everything queued is at or below the cache's revision: the
		// snapshot covers it.
		s.snapshot = false
		s.dropQueueLocked()
		ev := Event{Type: EventSnapshot, Revision: s.c.rev, Cluster: s.c.cluster}
		for _, ns := range s.namespaces {
			snap := s.c.snapshotLocked(ns, s.who)
			if snap.Gray != 0 {
				if s.grays == nil {
					s.grays = map[string]int64{}
				}
				s.grays[ns] = snap.Gray
			} else {
				delete(s.grays, ns)
			}
			ev.Snapshots = append(ev.Snapshots, snap)
		}
		return ev, true
	case len(s.queue) > 0:
		return s.popLocked(), true
	case bookmark && s.c.live:
		return Event{Type: EventBookmark, Revision: s.c.rev}, true
	}
	return Event{}, false
}

// keptQueueCap is the most events a subscription's queue may have held
// since it was last empty for the queue's array to be kept once it
// empties again: a subscriber that keeps up (a release at a time) then
// costs no allocation per release, and a backlog's array (up to
// QueueLimit events) is let go. A queue that never held more than this
// has an array of at most twice as many (append's growth).
const keptQueueCap = 4

// pushLocked queues ev. s.mu must be held.
func (s *Subscription) pushLocked(ev Event) {
	s.queue = append(s.queue, ev)
	if len(s.queue) > keptQueueCap {
		s.long = true
	}
}

// dropQueueLocked empties the queue and lets its array go. s.mu must be
// held.
func (s *Subscription) dropQueueLocked() {
	s.queue, s.long = nil, false
}

// popLocked removes and returns the oldest queued event. s.mu must be
// held, and the queue not empty.
func (s *Subscription) popLocked() Event {
	ev := s.queue[0]
	s.queue[0] = Event{}
	switch {
	case len(s.queue) > 1:
		s.queue = s.queue[1:]
	case !s.long:
		s.queue = s.queue[:0] // for the next release
	default:
		s.dropQueueLocked()
	}
	return ev
}
