package configcenter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// MaxQueuedWatchRequests bounds the Start and Stop requests waiting for a
// WatchMux to handle them.
const MaxQueuedWatchRequests = 10000

// maxWatchRounds bounds the rounds Next runs in a row before it handles
// waiting requests again, so starts and stops get in between long runs of
// events.
const maxWatchRounds = 64

// WatchMux serves many watches of the Cache, each named by an id its
// caller chooses, from the one goroutine that calls Next: an idle watch
// costs its subscription, not a goroutine. Start and Stop only queue a
// request and never wait for Next, so a caller that reads requests on one
// goroutine and sends Next's batches on another (which may block on a slow
// peer) never has the two wait on each other.
//
// Guarantees:
//   - Each watch behaves as a Subscription (see Cache): a SNAPSHOT first,
//     or a BOOKMARK at once when it resumes with nothing to replay; then
//     exactly one CHANGE per release of its namespaces, in revision order;
//     a fresh SNAPSHOT instead whenever it cannot be given every release
//     (its queue overflowed CacheOptions.QueueLimit, the cache reloaded);
//     a BOOKMARK every CacheOptions.Bookmark while the cache's watch is
//     healthy. Next returns each watch's events in that order.
//   - Fairness: events are taken in rounds of at most one event per watch,
//     in ascending id order, and every batch of a round is returned before
//     the next round is taken, so a watch with a long backlog delays each
//     other watch by at most one batch per round. After 64 rounds in a
//     row, Next looks at waiting requests again, so a steady flow of
//     events does not hold up starts and stops.
//   - Batching: a release that several watches take in the same round is
//     one batch naming them all; so are bookmarks at the same revision
//     (never one bookmark for watches at different revisions, which would
//     claim a revision beyond what a watch was sent). A SNAPSHOT is one
//     batch per watch. A round returns its snapshots, then its changes (in
//     the order of their first watch), then its bookmarks.
//   - Overflow: the cache never waits for a mux; a watch whose queue
//     overflows gets a fresh SNAPSHOT. With MaxQueuedWatchRequests
//     requests already waiting, Start and Stop fail with ErrInvalid and
//     queue nothing: the caller sends faster than Next is called, and
//     should give up.
//   - A start that cannot be served (bad namespaces: ErrInvalid; a resume
//     point this member has not reached: ErrBehind; ErrStopped) becomes a
//     batch with Err set, naming that watch alone; the other watches go
//     on. Starting an id that is live replaces that watch, even if the new
//     start is refused. Stopping an unknown id does nothing.
//
// Non-guarantees: no order between different watches' events beyond the
// rounds. A release is shared only by the watches that take it in the
// same round: a watch still replaying a backlog gets it in a batch of its
// own, and a release that arrives while a round is being taken reaches the
// watches that round had already passed in a later batch. Requests take effect only when Next handles them, between runs of
// rounds: until then a stopped watch may still appear in batches. The mux
// does not follow the Cache's lifetime: once Cache.Run has returned its
// watches hear nothing more, and only ctx ends Next.
//
// Start and Stop may be called from any goroutine; Next and Close from one
// goroutine only.
type WatchMux struct {
	c      *Cache
	notify chan struct{} // shared by the subscriptions: one may have an event
	ticker *time.Ticker  // bookmarks

	mu        sync.Mutex
	requests  []watchRequest // waiting for Next, in order
	requested chan struct{}  // a request is waiting

	// Owned by Next's goroutine.
	subs      map[int64]*Subscription
	revealing map[int64]bool  // watches whose start asked for secrets
	out       []WatchBatch    // the rest of the current round, or refused starts
	draining  bool            // taking rounds until one is empty or maxWatchRounds
	rounds    int             // rounds taken in this run
	ids       []int64         // the watches, ascending; rebuilt when stale
	order     []*Subscription // their subscriptions, in the same order
	stale     bool            // subs changed since ids was built
	bookmarks bool            // the next round may take bookmarks
}

// WatchBatch is one result of WatchMux.Next: an event for one or more
// watches, or a start that was refused.
type WatchBatch struct {
	// IDs are the watches the batch is for, ascending: with Err, the
	// refused watch alone.
	IDs []int64
	// Event is the event, the same for every watch in IDs; unset with Err.
	Event Event
	// Err says why the watch in IDs could not start.
	Err error
}

type watchRequest struct {
	id         int64
	stop       bool
	namespaces []string
	from       int64
	who        *Identity
	refused    error // the start was refused: report it
	reveal     bool  // the start asked for secrets in clear
}

// NewWatchMux returns a WatchMux with no watches over c. Close it when
// done.
func NewWatchMux(c *Cache) *WatchMux {
	return &WatchMux{
		c: c, notify: make(chan struct{}, 1), ticker: time.NewTicker(c.opts.Bookmark),
		requested: make(chan struct{}, 1), subs: map[int64]*Subscription{}, revealing: map[int64]bool{},
	}
}

// Start asks for a watch named id of namespaces from revision from, for
// the instance who (nil: anonymous), with the meaning Cache.SubscribeAs
// gives them; it replaces a live watch named
// id. It only queues the request: Next starts the watch, or returns a
// batch with the reason it could not. Start fails with ErrInvalid, queueing
// nothing, if MaxQueuedWatchRequests requests are already waiting.
func (m *WatchMux) Start(id int64, namespaces []string, from int64, who *Identity) error {
	return m.request(watchRequest{id: id, namespaces: namespaces, from: from, who: who})
}

// StartRevealing is Start for a watch whose caller may see secret values
// in clear and asked to: Revealing reports it, from the moment the watch
// starts (never for a watch of the same id started before).
func (m *WatchMux) StartRevealing(id int64, namespaces []string, from int64, who *Identity) error {
	return m.request(watchRequest{id: id, namespaces: namespaces, from: from, who: who, reveal: true})
}

// Revealing reports whether the live watch id was started by
// StartRevealing. Call it from Next's goroutine, for the batches Next
// returned.
func (m *WatchMux) Revealing(id int64) bool { return m.revealing[id] }

// Refuse ends the watch named id, if live, and returns a batch for it with
// err: its start was refused before it reached the mux (its caller may
// not watch those namespaces). It queues like Start and fails the same
// way.
func (m *WatchMux) Refuse(id int64, err error) error {
	return m.request(watchRequest{id: id, refused: err})
}

// Stop asks for the watch named id to end; an unknown id is ignored. Like
// Start it only queues the request, and fails the same way.
func (m *WatchMux) Stop(id int64) error {
	return m.request(watchRequest{id: id, stop: true})
}

func (m *WatchMux) request(r watchRequest) error {
	m.mu.Lock()
	full := len(m.requests) >= MaxQueuedWatchRequests
	if !full {
		m.requests = append(m.requests, r)
	}
	m.mu.Unlock()
	if full {
		return fmt.Errorf("%w: more than %d watch requests waiting; send fewer at once", ErrInvalid, MaxQueuedWatchRequests)
	}
	poke(m.requested)
	return nil
}

// Next returns the next batch, waiting until there is one or ctx ends. It
// handles the waiting requests (starting a watch may wait for the cache,
// as Cache.Subscribe does, within ctx) and takes the watches' events in
// rounds. It fails only with ctx's error, and as soon as ctx has ended,
// even with batches due; a start that fails because ctx ended is not
// reported as refused.
func (m *WatchMux) Next(ctx context.Context) (WatchBatch, error) {
	if err := ctx.Err(); err != nil {
		return WatchBatch{}, err
	}
	for {
		if len(m.out) > 0 {
			b := m.out[0]
			m.out[0] = WatchBatch{}
			m.out = m.out[1:]
			return b, nil
		}
		if m.draining {
			if m.rounds == maxWatchRounds {
				// Events may remain: come back for them after the
				// requests that wait.
				m.draining = false
				poke(m.notify)
				continue
			}
			m.rounds++
			m.draining = m.round()
			continue
		}
		select {
		case <-ctx.Done():
			return WatchBatch{}, ctx.Err()
		case <-m.requested:
			if err := m.handleRequests(ctx); err != nil {
				return WatchBatch{}, err
			}
		case <-m.notify:
		case <-m.ticker.C:
			m.bookmarks = true
		}
		if m.stale {
			m.sortSubs()
		}
		m.draining, m.rounds = true, 0
	}
}

// sortSubs lists the watches in ascending order of id, for the rounds.
func (m *WatchMux) sortSubs() {
	m.ids = m.ids[:0]
	for id := range m.subs {
		m.ids = append(m.ids, id)
	}
	slices.Sort(m.ids)
	clear(m.order)
	m.order = m.order[:0]
	for _, id := range m.ids {
		m.order = append(m.order, m.subs[id])
	}
	m.stale = false
}

// handleRequests applies the waiting requests in order. Refused starts go
// to m.out. It fails only with ctx's error.
func (m *WatchMux) handleRequests(ctx context.Context) error {
	m.mu.Lock()
	reqs := m.requests
	m.requests = nil
	m.mu.Unlock()
	// One linearizable read serves every start from the current state in
	// this lot: it is made after all of them were asked for.
	if slices.ContainsFunc(reqs, func(r watchRequest) bool { return !r.stop && r.refused == nil && r.from == 0 }) {
		m.c.catchUp(ctx)
	}
	m.stale = m.stale || len(reqs) > 0
	for _, r := range reqs {
		if old := m.subs[r.id]; old != nil { // a stop, or a restart of the same watch
			old.Close()
			delete(m.subs, r.id)
		}
		delete(m.revealing, r.id)
		if r.stop {
			continue
		}
		if r.refused != nil {
			m.out = append(m.out, WatchBatch{IDs: []int64{r.id}, Err: r.refused})
			continue
		}
		sub, err := m.c.subscribe(ctx, r.namespaces, r.from, m.notify, false, r.who)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			m.out = append(m.out, WatchBatch{IDs: []int64{r.id}, Err: err})
			continue
		}
		m.subs[r.id] = sub
		if r.reveal {
			m.revealing[r.id] = true
		}
		poke(m.notify) // greet it: its first event is due now
	}
	return nil
}

// round takes at most one event from every watch into m.out: a release
// several watches take is one batch, bookmarks are grouped by revision. It
// reports whether it took any.
func (m *WatchMux) round() bool {
	var snapshots, changes, marks []WatchBatch
	var byRelease map[*Release]int // index in changes, once a round has many
	var byRevision map[int64]int   // bookmark revision -> index in marks, likewise
	for i, id := range m.ids {
		ev, ok := m.order[i].TryNext(m.bookmarks)
		if !ok {
			continue
		}
		rest := len(m.ids) - i // this watch and those after it
		switch ev.Type {
		case EventChange:
			if j := batchOf(changes, &byRelease, ev.Release, func(b *WatchBatch) *Release { return b.Event.Release }); j >= 0 {
				changes[j].IDs = joinBatch(changes[j].IDs, id, rest)
			} else {
				changes = append(changes, WatchBatch{IDs: []int64{id}, Event: ev})
			}
		case EventBookmark:
			if j := batchOf(marks, &byRevision, ev.Revision, func(b *WatchBatch) int64 { return b.Event.Revision }); j >= 0 {
				marks[j].IDs = joinBatch(marks[j].IDs, id, rest)
			} else {
				marks = append(marks, WatchBatch{IDs: []int64{id}, Event: Event{Type: EventBookmark, Revision: ev.Revision}})
			}
		default:
			snapshots = append(snapshots, WatchBatch{IDs: []int64{id}, Event: ev})
		}
	}
	m.bookmarks = false
	m.out = slices.Concat(m.out, snapshots, changes, marks)
	return len(m.out) > 0
}

// maxBatchRoom bounds the ids a batch makes room for at once.
const maxBatchRoom = 128

// joinBatch adds id, taken in a round with rest-1 watches after it, to a
// batch's ids. A batch is made for one watch; when a second joins, it gets
// room for the rest of the round's (up to maxBatchRoom), so a release many
// watches take grows its array once, not one id at a time, and a round of
// releases taken by one watch each makes one id's room for each.
func joinBatch(ids []int64, id int64, rest int) []int64 {
	if len(ids) == 1 && cap(ids) == 1 {
		grown := make([]int64, 1, min(1+rest, maxBatchRoom))
		grown[0] = ids[0]
		ids = grown
	}
	return append(ids, id)
}

// linearBatches is how many batches of one kind a round searches one by
// one for the batch an event joins; past it, it indexes them in a map (a
// round's watches are usually at one or two releases, but may be at as
// many as there are watches).
const linearBatches = 8

// batchOf returns the index of the batch in bs whose key (as key reads
// it) is k, or -1. It searches bs in order while it is short, then
// through *index, which it builds once bs outgrows linearBatches.
func batchOf[K comparable](bs []WatchBatch, index *map[K]int, k K, key func(*WatchBatch) K) int {
	if *index == nil && len(bs) > linearBatches {
		*index = make(map[K]int, 2*len(bs))
		for j := range bs {
			(*index)[key(&bs[j])] = j
		}
	}
	if *index == nil {
		for j := range bs {
			if key(&bs[j]) == k {
				return j
			}
		}
		return -1
	}
	if j, ok := (*index)[k]; ok {
		return j
	}
	(*index)[k] = len(bs) // the caller appends the new batch there
	return -1
}

// Close ends every watch and stops the bookmark ticker. Requests made
// after Close are never handled.
func (m *WatchMux) Close() {
	m.ticker.Stop()
	for id, sub := range m.subs {
		sub.Close()
		delete(m.subs, id)
	}
	m.stale = true
}

// poke sends on a one-slot channel without waiting.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
