package barrier

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/kind"
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
var errClosing = kind.Unavailable.New("barrier: the member is stopping")

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
	waits  map[*roundWait]bool
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
		rw = &roundWatch{m: m, name: name, wake: make(chan struct{}, 1), waits: map[*roundWait]bool{}}
		if !m.bg.TryGo(rw.run) {
			return nil, errClosing
		}
		if rs.byName == nil {
			rs.byName = map[string]*roundWatch{}
		}
		rs.byName[name] = rw
	}
	rw.mu.Lock()
	rw.waits[w] = true
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
	if !rw.waits[w] {
		return false
	}
	delete(rw.waits, w)
	if len(rw.waits) == 0 {
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
	empty := len(rw.waits) == 0
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
	return len(rw.waits) == 0
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
	var ready []*roundWait
	markOpen := false
	for w := range rw.waits {
		if w.rev > at {
			continue // the watch has not reached its write yet
		}
		switch {
		case w.leave && in == 0:
			ready = append(ready, w)
		case w.leave:
		case open:
			ready = append(ready, w)
		case present != nil && !present[w.key], c != nil && c.gone[w.key] > w.rev:
			ready = append(ready, w)
		case in >= w.count:
			markOpen = true
		}
	}
	leaving := false
	for _, w := range ready {
		delete(rw.waits, w)
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
	var waits []*roundWait
	for w := range rw.waits {
		waits = append(waits, w)
	}
	clear(rw.waits)
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
