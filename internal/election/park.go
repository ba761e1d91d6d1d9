package election

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/queue"
)

// errClosing ends the parked campaigns of a manager that closes.
var errClosing = errkind.Unavailable.New("election: the member is stopping")

// Parked campaigns.
//
// A campaign that waits for the seat in CampaignLater holds no goroutine:
// it is a record in its election's seatWatch, which follows the election
// through one subscription of the member's shared watch and one goroutine
// for all of the election's parked candidates (started with the first,
// ended with the last). Each event of the election costs a map lookup per
// change, not a wake-up per candidate: a crowd of candidates costs their
// records and contexts. A restarted watch is caught up with one read of
// the election for all of them.

// seatWatch follows one election for its parked candidates.
type seatWatch struct {
	m    *Manager
	name string
	feed *grantwatch.Feed

	wake chan struct{} // the last wait went: run looks whether to retire

	mu      sync.Mutex
	byEntry map[string]*parkedSeat // candidacy key -> its wait
	bySeat  map[string]*parkedSeat // the seat key it waits for -> its wait
	asking  map[*parkedSeat]bool   // waits that ask leaders to step down (onSeat)
}

// parkedSeat is one parked candidate's wait.
type parkedSeat struct {
	key, seatKey string
	onSeat       func(*mvccpb.KeyValue)
	then         func(term, rev int64, err error)
	// seen is its first read's revision (older changes are in it); until
	// that read it is the revision at which the campaign last read its
	// candidacy, so that the watch, which may still deliver older changes,
	// never takes the end of an earlier candidacy or seat of the same key
	// (a session campaigns again under the request id of the leadership it
	// just resigned or handed over) for this one's.
	seen int64
	once sync.Once
}

// newParkedSeat is the wait of the candidacy key for the seat seatKey,
// its campaign having read the candidacy at revision since.
func newParkedSeat(key, seatKey string, since int64, onSeat func(*mvccpb.KeyValue), then func(term, rev int64, err error)) *parkedSeat {
	return &parkedSeat{key: key, seatKey: seatKey, onSeat: onSeat, then: then, seen: since}
}

// end gives the wait its outcome, once.
func (p *parkedSeat) end(term, rev int64, err error) {
	p.once.Do(func() { p.then(term, rev, err) })
}

// parkSeat is waitSeat without a goroutine: then is called once, with the
// term and the revision it was seen at, queue.ErrEntryGone when the
// candidacy goes, or ctx's error. It reads the election once to begin,
// on the caller's goroutine. ctx must end once then was called (its
// AfterFunc stays registered until then).
func (m *Manager) parkSeat(ctx context.Context, name, key, seatKey string, since int64, onSeat func(*mvccpb.KeyValue), then func(term, rev int64, err error)) {
	p := newParkedSeat(key, seatKey, since, onSeat, then)
	w, err := m.watchSeats(name, p)
	if err != nil {
		p.end(0, 0, err)
		return
	}
	// Registered before the read: a change after it comes to the watch.
	resp, err := m.cli.Txn(ctx).Then(clientv3.OpGet(seatKey), clientv3.OpGet(key, clientv3.WithKeysOnly()), m.seatsOp(name)).Commit()
	if err != nil {
		w.forget(p)
		p.end(0, 0, fmt.Errorf("election: campaign %q: %w", name, err))
		return
	}
	w.mu.Lock()
	p.seen = resp.Header.Revision
	w.mu.Unlock()
	if kv := first(resp.Responses[0].GetResponseRange().Kvs); kv != nil {
		w.forget(p)
		p.end(kv.CreateRevision, resp.Header.Revision, nil)
		return
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
		w.forget(p)
		p.end(0, 0, queue.ErrEntryGone)
		return
	}
	switch seat := first(resp.Responses[2].GetResponseRange().Kvs); {
	case seat == nil:
		m.kick(name)
	case onSeat != nil:
		onSeat(seat) // it may have been created before the watch began
	}
	context.AfterFunc(ctx, func() {
		if w.forget(p) {
			p.end(0, 0, ctx.Err())
		}
	})
}

// watchSeats registers p with its election's watch, starting the watch
// for the first.
func (m *Manager) watchSeats(name string, p *parkedSeat) (*seatWatch, error) {
	ws := &m.seatWatches
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.byName[name]
	if w == nil {
		w = &seatWatch{m: m, name: name, wake: make(chan struct{}, 1), byEntry: map[string]*parkedSeat{}, bySeat: map[string]*parkedSeat{}, asking: map[*parkedSeat]bool{}}
		w.feed, _ = m.dels.Subscribe(m.prefix(name), true)
		if !m.bg.TryGo(w.run) {
			w.feed.Stop()
			return nil, errClosing
		}
		if ws.byName == nil {
			ws.byName = map[string]*seatWatch{}
		}
		ws.byName[name] = w
	}
	w.mu.Lock()
	w.byEntry[p.key], w.bySeat[p.seatKey] = p, p
	if p.onSeat != nil {
		w.asking[p] = true
	}
	w.mu.Unlock()
	return w, nil
}

// seatWatches are the elections with parked candidates.
type seatWatches struct {
	mu     sync.Mutex
	byName map[string]*seatWatch
}

// forget removes p, and reports whether it was still waiting.
func (w *seatWatch) forget(p *parkedSeat) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byEntry[p.key] != p {
		return false
	}
	delete(w.byEntry, p.key)
	delete(w.bySeat, p.seatKey)
	delete(w.asking, p)
	if len(w.byEntry) == 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// run follows the election until its last parked candidate is gone (or
// the manager closes: every wait then ends with ErrUnavailable).
func (w *seatWatch) run(stop context.Context) {
	ws := &w.m.seatWatches
	defer func() {
		ws.mu.Lock()
		if ws.byName[w.name] == w {
			delete(ws.byName, w.name)
		}
		ws.mu.Unlock()
		w.feed.Stop()
	}()
	for {
		select {
		case <-stop.Done():
			w.endAll(errClosing)
			return
		case <-w.feed.Ready():
		case <-w.wake:
		}
		if w.retire() {
			return
		}
		evs, restarted := w.feed.Take()
		if restarted != 0 {
			w.reread(stop)
			continue
		}
		w.apply(evs)
	}
}

// retire ends the watch when nobody waits any longer: it leaves the
// elections' map under the map's lock, so that a new candidate starts a
// new watch.
func (w *seatWatch) retire() bool {
	ws := &w.m.seatWatches
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.byEntry) > 0 {
		return false
	}
	if ws.byName[w.name] == w {
		delete(ws.byName, w.name)
	}
	return true
}

// apply settles the waits that evs decide and kicks a free seat.
func (w *seatWatch) apply(evs []*clientv3.Event) {
	seats, q := w.m.seats(w.name), w.m.queue(w.name)
	type outcome struct {
		p         *parkedSeat
		term, rev int64
		err       error
	}
	var ended []outcome
	var asks []*mvccpb.KeyValue
	free, changed := false, false
	w.mu.Lock()
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		switch {
		case strings.HasPrefix(k, seats):
			free, changed = ev.Type == mvccpb.DELETE, true
			if p := w.bySeat[k]; p != nil && ev.Type == mvccpb.PUT && ev.Kv.ModRevision > p.seen {
				ended = append(ended, outcome{p: p, term: ev.Kv.CreateRevision, rev: ev.Kv.ModRevision})
			} else if ev.IsCreate() && len(w.asking) > 0 {
				asks = append(asks, ev.Kv)
			}
		case strings.HasPrefix(k, q) && ev.Type == mvccpb.DELETE:
			changed = true // a promotion may have failed on it
			if p := w.byEntry[k]; p != nil && ev.Kv.ModRevision > p.seen {
				ended = append(ended, outcome{p: p, err: queue.ErrEntryGone})
			}
		}
	}
	var askers []*parkedSeat
	for p := range w.asking {
		askers = append(askers, p)
	}
	w.mu.Unlock()
	for _, o := range ended {
		if w.forget(o.p) {
			o.p.end(o.term, o.rev, o.err)
		}
	}
	for _, kv := range asks {
		for _, p := range askers {
			p.onSeat(kv)
		}
	}
	if free && changed {
		w.m.kick(w.name)
	}
}

// reread catches every wait up after the watch restarted (changes may be
// missing): one read of the seat and the candidacies.
func (w *seatWatch) reread(stop context.Context) {
	resp, err := w.m.cli.Txn(stop).Then(w.m.seatsOp(w.name), clientv3.OpGet(w.m.queue(w.name), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return // the next restart or change tries again
	}
	seat := first(resp.Responses[0].GetResponseRange().Kvs)
	queued := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		queued[string(kv.Key)] = true
	}
	var waits []*parkedSeat
	w.mu.Lock()
	for _, p := range w.byEntry {
		waits = append(waits, p)
	}
	w.mu.Unlock()
	for _, p := range waits {
		switch {
		case seat != nil && string(seat.Key) == p.seatKey:
			if w.forget(p) {
				p.end(seat.CreateRevision, resp.Header.Revision, nil)
			}
		case !queued[p.key]:
			if w.forget(p) {
				p.end(0, 0, queue.ErrEntryGone)
			}
		case seat != nil && p.onSeat != nil:
			p.onSeat(seat)
		}
	}
	if seat == nil {
		w.m.kick(w.name)
	}
}

// endAll ends every wait with err.
func (w *seatWatch) endAll(err error) {
	w.mu.Lock()
	var waits []*parkedSeat
	for _, p := range w.byEntry {
		waits = append(waits, p)
	}
	w.mu.Unlock()
	for _, p := range waits {
		if w.forget(p) {
			p.end(0, 0, err)
		}
	}
}
