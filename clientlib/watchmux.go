package clientlib

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// watchMux carries every Subscription of a Client on one WatchMany stream,
// so a process that follows many namespace sets costs the server one
// stream. It owns one goroutine while it has subscriptions: it opens the
// stream (reopening it with full-jitter backoff, and when it carries
// nothing for the stall timeout), starts every subscription on it from
// the subscription's own resume point, and hands each message to the
// subscriptions it names.
type watchMux struct {
	c *Client

	mu      sync.Mutex
	entries map[int64]*muxEntry // by watch id
	stops   []int64             // watches to stop on the current stream
	// starts are the watches to start on the current stream: new ones,
	// restarted ones, and every one when a stream opens. due sends them
	// without looking at the others, so a client with many subscriptions
	// pays per start, not per subscription, for each message.
	starts  []int64
	nextID  int64
	running bool
	closed  bool
	cancel  context.CancelFunc // stops the goroutine
	wake    chan struct{}
	done    chan struct{} // closed when the goroutine exits
}

type muxEntry struct {
	sub  *Subscription
	from int64 // resume point: 0 asks for a snapshot
	// sent: a Start for the watch's current incarnation went out on this
	// stream; open: the server has a watch with this id on it (a restart
	// replaces it, a remove must stop it).
	sent, open bool
	// resyncing: restarted for a snapshot; messages still in flight for
	// the watch it replaced are dropped until the snapshot arrives.
	resyncing bool
}

func newWatchMux(c *Client) *watchMux {
	return &watchMux{c: c, entries: map[int64]*muxEntry{}, wake: make(chan struct{}, 1)}
}

func (m *watchMux) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// add starts following sub and returns its watch id; false if the client
// is closed.
func (m *watchMux) add(sub *Subscription) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, false
	}
	m.nextID++
	m.entries[m.nextID] = &muxEntry{sub: sub}
	m.starts = append(m.starts, m.nextID)
	if !m.running {
		m.running = true
		m.done = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		go m.run(ctx, m.done)
	}
	m.poke()
	return m.nextID, true
}

// shutdown stops the goroutine (Client.Close) and waits for it; later adds
// fail.
func (m *watchMux) shutdown() {
	m.mu.Lock()
	m.closed = true
	cancel, done := m.cancel, m.done
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// remove stops following the watch id.
func (m *watchMux) remove(id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		delete(m.entries, id)
		if e.open {
			m.stops = append(m.stops, id)
		}
		m.poke()
	}
}

// restart asks for watch id to start again from from (0: a snapshot).
func (m *watchMux) restart(id, from int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		e.from, e.sent, e.resyncing = from, false, from == 0
		m.starts = append(m.starts, id)
		m.poke()
	}
}

// timing is the smallest stall timeout and backoff the subscriptions ask for.
func (m *watchMux) timing() (stall, minB, maxB time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stall, minB, maxB = 20*time.Second, 800*time.Millisecond, 30*time.Second
	first := true
	for _, e := range m.entries {
		o := e.sub.opts
		if first {
			stall, minB, maxB, first = o.stall, o.minBackoff, o.maxBackoff, false
			continue
		}
		stall, minB, maxB = min(stall, o.stall), min(minB, o.minBackoff), min(maxB, o.maxBackoff)
	}
	return stall, minB, maxB
}

func (m *watchMux) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		m.mu.Lock()
		if len(m.entries) == 0 {
			m.running = false // the next add starts a new goroutine
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		_, minB, maxB := m.timing()
		if backoff == 0 {
			backoff = minB
		}
		got := m.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		m.mu.Lock()
		idle := len(m.entries) == 0
		m.starts = m.starts[:0]
		for id, e := range m.entries {
			e.sent, e.open = false, false
			m.starts = append(m.starts, id)
			e.sub.setStatus(func(st *SubscriptionStatus) {
				if st.State == StateLive {
					st.State = StateStale
				}
				st.Reconnects++
			})
		}
		m.stops = nil
		m.mu.Unlock()
		if idle {
			continue // every subscription left: exit (or serve a new one) at once
		}
		if got {
			backoff = minB
		}
		timer := time.NewTimer(rand.N(backoff) + time.Millisecond) // full jitter
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, maxB)
	}
}

// stream runs one WatchMany stream until it breaks, stalls, or has no
// subscriptions left. It reports whether it received events.
func (m *watchMux) stream(ctx context.Context) (got bool) {
	stallFor, _, _ := m.timing()
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := errors.New("coordd: config watch stalled")
	stall := time.AfterFunc(stallFor, func() { cancel(stalled) })
	defer stall.Stop()
	st, err := m.c.config.WatchMany(sctx)
	if err != nil {
		return false
	}
	// The endpoint this stream uses (the stream's context carries it).
	endpoint := ""
	if p, ok := peer.FromContext(st.Context()); ok && p.Addr != nil {
		endpoint = p.Addr.String()
	}
	msgs := make(chan *coorddv1.WatchManyResponse)
	ended := make(chan struct{}) // the reader or the sender stopped
	var endOnce sync.Once
	end := func() { endOnce.Do(func() { close(ended) }) }
	go func() { // the reader; exits when the stream ends
		defer end()
		forward(sctx, st.Recv, msgs)
	}()
	// The sender works through a queue, so this goroutine never blocks in
	// Send and keeps taking messages: the two sides can never wait on each
	// other's flow-control windows.
	var qmu sync.Mutex
	var queue []*coorddv1.WatchManyRequest
	queued := make(chan struct{}, 1)
	go func() { // the sender; exits with the stream
		defer end()
		for {
			select {
			case <-sctx.Done():
				return
			case <-queued:
			}
			qmu.Lock()
			batch := queue
			queue = nil
			qmu.Unlock()
			for _, r := range batch {
				if err := st.Send(r); err != nil {
					return
				}
			}
		}
	}()
	for {
		// Queue what is due: stops, and starts of new or restarted watches.
		reqs, idle := m.due()
		if idle {
			return got
		}
		if len(reqs) > 0 {
			qmu.Lock()
			queue = append(queue, reqs...)
			qmu.Unlock()
			select {
			case queued <- struct{}{}:
			default:
			}
		}
		select {
		case <-sctx.Done():
			if errors.Is(context.Cause(sctx), stalled) && endpoint != "" {
				m.c.avoid(endpoint, false)
			}
			return got
		case <-ended:
			return got
		case <-m.wake:
		case msg := <-msgs:
			stall.Reset(stallFor)
			events, reconnect := m.deliver(msg, endpoint)
			got = got || events
			if reconnect {
				return got // a lagging member: reconnect elsewhere
			}
		}
	}
}

// forward sends what recv returns on out until recv fails or ctx ends.
func forward[T any](ctx context.Context, recv func() (T, error), out chan<- T) {
	for {
		msg, err := recv()
		if err != nil {
			return
		}
		select {
		case out <- msg:
		case <-ctx.Done():
			return
		}
	}
}

// due returns the requests to send now: stops, and starts of new or
// restarted watches (marked sent and open). idle is true when no
// subscription is left, and the stream is to end.
func (m *watchMux) due() (reqs []*coorddv1.WatchManyRequest, idle bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.entries) == 0 {
		return nil, true
	}
	for _, id := range m.stops {
		reqs = append(reqs, &coorddv1.WatchManyRequest{Request: &coorddv1.WatchManyRequest_Stop{Stop: &coorddv1.WatchManyStop{WatchId: id}}})
	}
	m.stops = nil
	for _, id := range m.starts {
		if e := m.entries[id]; e != nil && !e.sent { // not removed, nor listed twice
			e.sent, e.open = true, true
			reqs = append(reqs, &coorddv1.WatchManyRequest{Request: &coorddv1.WatchManyRequest_Start{Start: &coorddv1.WatchManyStart{
				WatchId: id, Namespaces: e.sub.namespaces, FromRevision: e.from,
				Instance: e.sub.opts.instance, Labels: e.sub.opts.labels, RevealSecrets: e.sub.reveal}}})
		}
	}
	m.starts = m.starts[:0]
	return reqs, false
}

// deliver hands msg to the watches it names. It reports whether it carried
// events, and whether the stream must be reopened (the member is behind
// what a subscription already has, or it refused a start for a reason
// other than the request itself).
func (m *watchMux) deliver(msg *coorddv1.WatchManyResponse, endpoint string) (events, reconnect bool) {
	memo := map[*ConfigSnapshot]*ConfigSnapshot{} // subscriptions in one state share the result
	for _, id := range msg.GetWatchIds() {
		m.mu.Lock()
		e := m.entries[id]
		if e != nil && e.resyncing && msg.GetErrorReason() == "" {
			if msg.GetEvent().GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT {
				e = nil // the replaced watch's: its state is being replaced anyway
			} else {
				e.resyncing = false
			}
		}
		m.mu.Unlock()
		if e == nil {
			continue // stopped meanwhile, or stale
		}
		if msg.GetErrorReason() != "" {
			err := &Error{Reason: msg.GetErrorReason(), Message: msg.GetErrorMessage()}
			if errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrUnauthenticated) {
				// The request itself is wrong, or not allowed: retrying
				// cannot help. The subscription fails (or, if it already
				// started, reports it); the client's others go on.
				m.park(id)
				e.sub.refuse(fmt.Errorf("coordd: config watch refused: %w", err))
				continue
			}
			reconnect = true // the member is behind, or stopping: try another
			continue
		}
		events = true
		switch e.sub.apply(msg.GetEvent(), memo) {
		case applyGap:
			m.restart(id, 0)
		case applyBehind:
			if endpoint != "" {
				m.c.avoid(endpoint, false)
			}
			m.setFrom(id, e.sub.snap.Load().revision+1)
			reconnect = true
		default:
			m.setFrom(id, msg.GetEvent().GetRevision()+1)
		}
	}
	return events, reconnect
}

// park keeps a refused watch from being started again.
func (m *watchMux) park(id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		delete(m.entries, id)
		m.poke()
	}
}

func (m *watchMux) setFrom(id, from int64) {
	m.mu.Lock()
	if e := m.entries[id]; e != nil {
		e.from = from
	}
	m.mu.Unlock()
}
