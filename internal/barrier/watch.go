package barrier

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Shared waits.
//
// The participants of one barrier on a member wait through one etcd watch
// of the barrier and one goroutine (a roundWatch, started with the first
// wait and ended with the last), which counts the participants from the
// watch's events: n participants cost one watch and O(n) work in all, not
// n watches each reading the count at every arrival. Enter and Leave wait
// on it; EnterLater parks its wait there without a goroutine.

// errClosing ends the waits of a manager that closes.
var errClosing = errkind.Unavailable.New("barrier: the member is stopping")

// roundWait is one Enter's or Leave's wait.
type roundWait struct {
	key   string // the participant's key: gone, its session ended (Enter)
	count int    // Enter: open once this many are in
	leave bool   // Leave: done once nobody is in
	rev   int64  // its own write's revision: the watch's state must be at least as new
	once  sync.Once
	then  func(Entered, error)
}

func (w *roundWait) end(e Entered, err error) { w.once.Do(func() { w.then(e, err) }) }

// roundWatch follows one barrier for the member's waits on it.
type roundWatch struct {
	m    *Manager
	name string
	wake chan struct{}   // a wait came or went
	ctx  context.Context // run's: ends when the manager closes

	mu     sync.Mutex
	waits  waitSet
	at     int64 // the revision the counts below reflect (0: not read yet)
	in     int   // participants in
	open   bool  // the open key exists
	opened string
}

// roundWatches are the barriers with waits on this member.
type roundWatches struct {
	mu     sync.Mutex
	byName map[string]*roundWatch
}

// wait registers w with its barrier's watch (starting the watch for the
// first) and has then called once with the outcome: w.end. ctx ending
// first ends it with ctx's error.
func (m *Manager) wait(ctx context.Context, name string, w *roundWait) {
	// The AfterFunc on ctx goes once the wait ends: a caller's context
	// may outlive many waits.
	var mu sync.Mutex
	var stop func() bool
	ended := false
	then := w.then
	w.then = func(e Entered, err error) {
		mu.Lock()
		ended = true
		s := stop
		mu.Unlock()
		if s != nil {
			s()
		}
		then(e, err)
	}
	rw, err := m.watchRound(name, w)
	if err != nil {
		w.end(Entered{}, err)
		return
	}
	s := context.AfterFunc(ctx, func() {
		if rw.forget(w) {
			w.end(Entered{}, ctx.Err())
		}
	})
	mu.Lock()
	if ended {
		mu.Unlock()
		s()
		return
	}
	stop = s
	mu.Unlock()
}

func (m *Manager) watchRound(name string, w *roundWait) (*roundWatch, error) {
	rs := &m.rounds
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rw := rs.byName[name]
	if rw == nil {
		rw = &roundWatch{m: m, name: name, wake: make(chan struct{}, 1), waits: newWaitSet()}
		if !m.bg.TryGo(rw.run) {
			return nil, errClosing
		}
		if rs.byName == nil {
			rs.byName = map[string]*roundWatch{}
		}
		rs.byName[name] = rw
	}
	rw.mu.Lock()
	rw.waits.add(w)
	rw.mu.Unlock()
	rw.poke()
	return rw, nil
}

func (rw *roundWatch) poke() {
	select {
	case rw.wake <- struct{}{}:
	default:
	}
}

// forget removes w, and reports whether it was still waiting.
func (rw *roundWatch) forget(w *roundWait) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.waits.remove(w) {
		return false
	}
	if rw.waits.len() == 0 {
		rw.poke()
	}
	return true
}

// run follows the barrier until its last wait is gone: it reads the
// barrier, watches it from there, and after a watch that fails (etcd
// compacted what it missed, or lost its leader) reads it again.
func (rw *roundWatch) run(stop context.Context) {
	rw.mu.Lock()
	rw.ctx = stop
	rw.mu.Unlock()
	defer rw.retire(true)
	pause := 50 * time.Millisecond
	for !rw.retire(false) {
		if err := rw.follow(stop); err == nil {
			continue
		}
		select { // etcd unavailable, or a watch compacted away: read again soon
		case <-stop.Done():
			rw.endAll(errClosing)
			return
		case <-time.After(pause):
			pause = min(2*pause, time.Second)
		}
	}
}

// retire reports whether no wait is left, and then (or when force is set)
// takes the watch out of the manager's map, so that a new wait starts a
// new one.
func (rw *roundWatch) retire(force bool) bool {
	rs := &rw.m.rounds
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rw.mu.Lock()
	empty := rw.waits.len() == 0
	rw.mu.Unlock()
	if (empty || force) && rs.byName[rw.name] == rw {
		delete(rs.byName, rw.name)
	}
	return empty
}

// follow reads the barrier and watches it from there until no wait is
// left (nil) or the watch fails.
func (rw *roundWatch) follow(stop context.Context) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(stop))
	defer cancel()
	m := rw.m
	resp, err := m.cli.Txn(ctx).Then(clientv3.OpGet(m.parts(rw.name), clientv3.WithPrefix(), clientv3.WithKeysOnly()), clientv3.OpGet(m.openKey(rw.name))).Commit()
	if err != nil {
		return err
	}
	keys := map[string]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		keys[string(kv.Key)] = true
	}
	opened := first(resp.Responses[1].GetResponseRange().Kvs)
	rw.mu.Lock()
	rw.at, rw.in, rw.open = resp.Header.Revision, len(keys), opened != nil
	if opened != nil {
		rw.opened = string(opened.Value)
	}
	rw.mu.Unlock()
	rw.settle(keys, nil)
	wch := m.cli.Watch(ctx, m.prefix(rw.name), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case <-stop.Done():
			return stop.Err()
		case <-rw.wake:
			if rw.empty() {
				return nil
			}
			rw.settle(nil, nil)
		case wr, ok := <-wch:
			if !ok {
				return fmt.Errorf("the watch ended")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			rw.apply(wr)
		}
	}
}

func (rw *roundWatch) empty() bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.waits.len() == 0
}

// apply counts a watch response's changes and settles the waits.
func (rw *roundWatch) apply(wr clientv3.WatchResponse) {
	parts, open := rw.m.parts(rw.name), rw.m.openKey(rw.name)
	gone := map[string]int64{} // participants' keys deleted, at which revision
	var openedAt int64
	rw.mu.Lock()
	for _, ev := range wr.Events {
		k := string(ev.Kv.Key)
		switch {
		case k == open && ev.Type == mvccpb.PUT:
			if !rw.open {
				openedAt = ev.Kv.ModRevision
			}
			rw.open, rw.opened = true, string(ev.Kv.Value)
		case k == open:
			rw.open = false
		case strings.HasPrefix(k, parts) && ev.Type == mvccpb.PUT && ev.IsCreate():
			rw.in++
		case strings.HasPrefix(k, parts) && ev.Type == mvccpb.DELETE:
			rw.in--
			gone[k] = ev.Kv.ModRevision
		}
	}
	rw.at = max(rw.at, wr.Header.Revision)
	rw.mu.Unlock()
	rw.settle(nil, &change{gone: gone, openedAt: openedAt})
}

// change is what one watch response did that waits care about beyond the
// counts.
type change struct {
	gone     map[string]int64
	openedAt int64
}

// settle ends the waits that the barrier's state decides: present, when
// set, is every participant's key (after a read); c, the last change.
func (rw *roundWatch) settle(present map[string]bool, c *change) {
	rw.mu.Lock()
	at, in, open, opened := rw.at, rw.in, rw.open, rw.opened
	ready, markOpen := rw.waits.decide(at, in, open, present, c)
	leaving := false
	for _, w := range ready {
		rw.waits.remove(w)
		leaving = leaving || w.leave
	}
	parent := rw.ctx
	rw.mu.Unlock()
	if parent == nil {
		parent = context.Background()
	}
	var closed error
	if leaving { // everyone is out: one close for all the leavers
		ctx, cancel := context.WithTimeout(parent, 5*time.Second)
		closed = rw.m.closeRound(ctx, rw.name)
		cancel()
	}
	for _, w := range ready {
		switch {
		case w.leave:
			w.end(Entered{Revision: at}, closed)
		case open:
			n, err := strconv.Atoi(opened)
			if err != nil { // opened by hand: who is in
				n = in
			}
			rev := at
			if c != nil && c.openedAt > 0 {
				rev = c.openedAt
			}
			w.end(Entered{Participants: n, Revision: rev}, nil)
		default:
			w.end(Entered{}, fmt.Errorf("%w: the participant's session ended while it waited", ErrSessionNotFound))
		}
	}
	if markOpen {
		// Its put comes back through the watch and lets every wait in; if
		// it fails, the next change tries again.
		ctx, cancel := context.WithTimeout(parent, 5*time.Second)
		_, _ = rw.m.markOpen(ctx, rw.name, in)
		cancel()
	}
}

// endAll ends every wait with err.
func (rw *roundWatch) endAll(err error) {
	rw.mu.Lock()
	waits := rw.waits.drain()
	rw.mu.Unlock()
	for _, w := range waits {
		w.end(Entered{}, err)
	}
}

func first(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// waitSet is a barrier's waits on this member, indexed so that a change
// of the barrier costs O(log n) plus the waits it ends, not a look at
// every wait (which made a round of n arrivals O(n²)).
type waitSet struct {
	all    map[*roundWait]bool
	early  []*roundWait            // their own write not seen yet (rev > the watch's)
	enters map[*roundWait]bool     // Enters whose write the watch has seen
	byKey  map[string][]*roundWait // the same, by participant key
	counts countHeap               // the same, least count first (lazily: ended ones stay until they surface)
	leaves map[*roundWait]bool     // Leaves whose write the watch has seen
}

func newWaitSet() waitSet {
	return waitSet{all: map[*roundWait]bool{}, enters: map[*roundWait]bool{}, byKey: map[string][]*roundWait{}, leaves: map[*roundWait]bool{}}
}

func (s *waitSet) len() int { return len(s.all) }

func (s *waitSet) add(w *roundWait) {
	s.all[w] = true
	s.early = append(s.early, w)
}

// remove takes w out, and reports whether it was in.
func (s *waitSet) remove(w *roundWait) bool {
	if !s.all[w] {
		return false
	}
	delete(s.all, w)
	delete(s.leaves, w)
	if s.enters[w] {
		delete(s.enters, w)
		ws := slices.DeleteFunc(s.byKey[w.key], func(x *roundWait) bool { return x == w })
		if len(ws) == 0 {
			delete(s.byKey, w.key)
		} else {
			s.byKey[w.key] = ws
		}
		if len(s.enters) == 0 {
			s.counts = nil // only ended ones were left in it
		}
	}
	s.early = slices.DeleteFunc(s.early, func(x *roundWait) bool { return x == w })
	return true
}

// drain takes every wait out and returns them.
func (s *waitSet) drain() []*roundWait {
	out := make([]*roundWait, 0, len(s.all))
	for w := range s.all {
		out = append(out, w)
	}
	*s = newWaitSet()
	return out
}

// decide returns the waits that the barrier's state at revision at ends
// (in participants, open or not; present, when set, every participant's
// key after a read; c, the last change), and whether the barrier is to be
// opened: an Enter's count is reached. A wait whose own write the watch
// has not reached yet is not decided.
func (s *waitSet) decide(at int64, in int, open bool, present map[string]bool, c *change) (ready []*roundWait, markOpen bool) {
	s.early = slices.DeleteFunc(s.early, func(w *roundWait) bool {
		if w.rev > at {
			return false
		}
		if w.leave {
			s.leaves[w] = true
		} else {
			s.enters[w] = true
			s.byKey[w.key] = append(s.byKey[w.key], w)
			heap.Push(&s.counts, w)
		}
		return true
	})
	if in == 0 {
		for w := range s.leaves {
			ready = append(ready, w)
		}
	}
	if open {
		for w := range s.enters {
			ready = append(ready, w)
		}
		return ready, false
	}
	if present != nil { // after a read: rare
		for w := range s.enters {
			if !present[w.key] {
				ready = append(ready, w)
			}
		}
	}
	if c != nil {
		for key, rev := range c.gone {
			for _, w := range s.byKey[key] {
				if rev > w.rev {
					ready = append(ready, w)
				}
			}
		}
	}
	for len(s.counts) > 0 && !s.enters[s.counts[0]] {
		heap.Pop(&s.counts) // ended meanwhile
	}
	markOpen = len(s.counts) > 0 && in >= s.counts[0].count
	return ready, markOpen
}

// countHeap orders Enter waits by count, least first (container/heap).
type countHeap []*roundWait

func (h countHeap) Len() int           { return len(h) }
func (h countHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h countHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *countHeap) Push(x any)        { *h = append(*h, x.(*roundWait)) }
func (h *countHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}
