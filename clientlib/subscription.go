package clientlib

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// SubscriptionState says how current a subscription is.
type SubscriptionState int

// Subscription states.
const (
	// StateSyncing: no configuration yet.
	StateSyncing SubscriptionState = iota
	// StateLive: following the server; the last message (a change or a
	// bookmark) arrived within the stall timeout.
	StateLive
	// StateStale: serving the last known configuration (from the cache
	// file, or since the connection broke) while reconnecting.
	StateStale
)

func (s SubscriptionState) String() string {
	return [...]string{"syncing", "live", "stale"}[s]
}

// SubscriptionStatus is a subscription's health.
type SubscriptionStatus struct {
	State       SubscriptionState
	Revision    int64     // the revision of the current snapshot
	LastContact time.Time // when the server was last heard from (zero: never)
	// Staleness is how long the server has not been heard from while not
	// live; 0 when live.
	Staleness  time.Duration
	Reconnects int // streams reopened
	Relists    int // full snapshots received after the first
}

// SubscribeOption configures Subscribe.
type SubscribeOption func(*subscribeOptions)

type subscribeOptions struct {
	startTimeout time.Duration
	cacheFile    string
	instance     string
	labels       map[string]string
	stall        time.Duration
	minBackoff   time.Duration
	maxBackoff   time.Duration
	reports      bool
	reportEvery  time.Duration
}

// WithStartTimeout bounds how long Subscribe waits for the first snapshot
// (default 10s). Past it, Subscribe returns the cache file's configuration
// if there is one, else an error.
func WithStartTimeout(d time.Duration) SubscribeOption {
	return func(o *subscribeOptions) { o.startTimeout = d }
}

// WithCacheFile keeps the configuration in a file, written atomically after
// every change, so the app can start from it while coordd is unreachable
// (the subscription reports itself stale until it reconnects).
func WithCacheFile(path string) SubscribeOption {
	return func(o *subscribeOptions) { o.cacheFile = path }
}

// WithInstance names this process in the applied-status reports (default
// hostname-pid) and labels it (version, zone, …).
func WithInstance(id string, labels map[string]string) SubscribeOption {
	return func(o *subscribeOptions) { o.instance, o.labels = id, labels }
}

// WithStallTimeout is how long a stream may carry nothing (not even a
// bookmark, which the server sends every 5s while idle) before it is
// reopened, possibly on another endpoint. Default 20s.
func WithStallTimeout(d time.Duration) SubscribeOption {
	return func(o *subscribeOptions) { o.stall = d }
}

// WithReconnectBackoff sets the reconnect delays: full jitter, from first
// doubling up to limit. Default 800ms to 30s.
func WithReconnectBackoff(first, limit time.Duration) SubscribeOption {
	return func(o *subscribeOptions) { o.minBackoff, o.maxBackoff = first, limit }
}

// WithoutStatusReports stops the subscription from reporting which
// releases it applied or rejected.
func WithoutStatusReports() SubscribeOption { return func(o *subscribeOptions) { o.reports = false } }

// Subscription keeps a consistent snapshot of some namespaces current, and
// calls its callbacks on changes. It is safe for concurrent use.
type Subscription struct {
	c          *Client
	namespaces []string
	opts       subscribeOptions

	snap atomic.Pointer[ConfigSnapshot]

	mu     sync.Mutex
	status SubscriptionStatus
	cbs    []*callback
	errFns []func(error)
	// good is, per namespace, the last view delivered without a callback
	// (a Binding) rejecting it; kept in the cache file, so Bind can start
	// from it when the newest release is bad.
	good goodViews

	watchID  int64                      // this subscription on the client's WatchMany stream
	nsKey    string                     // the namespace list, as a key
	reveal   bool                       // secret values are asked for in clear
	dispatch atomic.Pointer[dispatcher] // set once the dispatcher starts
	sched    atomic.Int32               // schedIdle, schedBusy or schedAgain: see wake
	errs     chan error                 // problems found off the dispatcher, reported on it
	errsSent atomic.Int32               // errors put in errs: the dispatcher looks in errs only then
	refused  chan error                 // the server refused the watch (bad namespaces)
	first    chan struct{}              // closed at the first server snapshot
	firstOK  sync.Once
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	reporter *reporter
}

// lastGood is the last view of ns that no callback rejected, or nil.
func (s *Subscription) lastGood(ns string) *nsView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.good.of(ns)
}

// Subscribe follows namespaces. It returns once it has the current
// consistent snapshot (or, past the start timeout, the cache file's, marked
// stale), then keeps it current in the background: it resumes from its
// revision after a disconnect, and replaces its state whenever the server
// sends a snapshot. Close it when done.
func (cc *ConfigCenter) Subscribe(ctx context.Context, namespaces []string, opts ...SubscribeOption) (*Subscription, error) {
	c := cc.c
	if len(namespaces) == 0 {
		return nil, fmt.Errorf("%w: subscribe to at least one namespace", ErrInvalidArgument)
	}
	host, _ := os.Hostname()
	o := subscribeOptions{
		startTimeout: 10 * time.Second, stall: 20 * time.Second,
		minBackoff: 800 * time.Millisecond, maxBackoff: 30 * time.Second,
		instance: fmt.Sprintf("%s-%d", host, os.Getpid()), reports: true, reportEvery: 30 * time.Second,
	}
	for _, opt := range opts {
		opt(&o)
	}
	o.instance = sanitizeInstance(o.instance)
	s := &Subscription{c: c, namespaces: slices.Clone(namespaces), nsKey: strings.Join(namespaces, "\x00"), reveal: cc.reveal, opts: o, errs: make(chan error, 8), refused: make(chan error, 1), first: make(chan struct{})}
	empty := &ConfigSnapshot{spaces: map[string]*nsView{}}
	for _, ns := range namespaces {
		empty.spaces[ns] = &nsView{values: map[string]string{}}
	}
	s.snap.Store(empty)
	if o.cacheFile != "" {
		if cached, good, err := readCacheFile(o.cacheFile, namespaces); err == nil {
			s.snap.Store(cached)
			s.good = goodViews{pins: good}
			s.status.State, s.status.Revision = StateStale, cached.revision
		} else if !errors.Is(err, os.ErrNotExist) {
			c.lg.Warn("coordd: config cache file unusable; starting without it", "file", o.cacheFile, "error", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if o.reports {
		s.reporter = newReporter(c, o)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.reporter.run(runCtx) }()
	}
	var ok bool
	if s.watchID, ok = c.mux.add(s); !ok {
		cancel()
		s.wg.Wait()
		return nil, fmt.Errorf("%w: the client is closed", ErrUnavailable)
	}

	timer := time.NewTimer(o.startTimeout)
	defer timer.Stop()
	select {
	case <-s.first:
	case err := <-s.refused:
		s.Close()
		return nil, err
	case <-timer.C:
		if !s.firstOKDone() && s.Status().State != StateStale {
			s.Close()
			return nil, fmt.Errorf("%w: no configuration from coordd within %s, and no cache file", ErrUnavailable, o.startTimeout)
		}
		// Serving the cache file until coordd answers.
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
	// Callbacks report changes after what the caller now sees: the
	// dispatcher starts from the current snapshot.
	s.dispatch.Store(newDispatcher(runCtx, s))
	s.wake() // record the starting state (cache file, status report)
	return s, nil
}

// sanitizeInstance keeps an instance id within the server's alphabet.
func sanitizeInstance(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !instanceByte(c) {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	if len(b) == 0 {
		return "instance"
	}
	return string(b)
}

// instanceByte reports a byte of the server's instance alphabet:
// [A-Za-z0-9._:@-].
func instanceByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '@' || c == '-'
}

// Snapshot returns the current snapshot. It never blocks.
func (s *Subscription) Snapshot() *ConfigSnapshot { return s.snap.Load() }

// Status returns the subscription's health.
func (s *Subscription) Status() SubscriptionStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if st.State == StateLive && time.Since(st.LastContact) > s.opts.stall {
		st.State = StateStale
	}
	if st.State != StateLive && !st.LastContact.IsZero() {
		st.Staleness = time.Since(st.LastContact)
	}
	return st
}

// Close stops following and calling callbacks, and waits for them to
// stop: do not call it from a callback (it would wait for itself).
func (s *Subscription) Close() {
	s.c.mux.remove(s.watchID)
	s.cancel()
	if d := s.dispatch.Load(); d != nil {
		// Wait for a step under way to finish (its callbacks run to
		// their end); the next ones see the end (step checks it under
		// the same lock).
		d.running.Lock()
		d.running.Unlock() //nolint:staticcheck // an empty critical section: a wait for the step
	}
	s.wg.Wait()
}

func (s *Subscription) setStatus(fn func(st *SubscriptionStatus)) {
	s.mu.Lock()
	fn(&s.status)
	s.mu.Unlock()
}

// The states of a subscription's dispatcher (Subscription.sched).
const (
	schedIdle  = iota // no step queued or running
	schedBusy         // a step is queued or running
	schedAgain        // and a wake came since it began: one more
)

// wake has the dispatcher take a step: queued on the client's pool when
// none is queued or running, else queued again when the running one ends
// (a step looks at the current state, so one step covers every wake
// before it began). So no change is missed, and two steps of one
// subscription never run at once. Before the dispatcher starts it does
// nothing: the start wakes it.
func (s *Subscription) wake() {
	d := s.dispatch.Load()
	if d == nil {
		return
	}
	for {
		switch s.sched.Load() {
		case schedIdle:
			if s.sched.CompareAndSwap(schedIdle, schedBusy) {
				s.c.dispatch.schedule(d)
				return
			}
		case schedBusy:
			if s.sched.CompareAndSwap(schedBusy, schedAgain) {
				return
			}
		default:
			return
		}
	}
}

// applyResult says what apply made of a message.
type applyResult int

const (
	applyOK     applyResult = iota
	applyGap                // a change that does not follow the current state
	applyBehind             // a snapshot older than the current state
)

// apply applies one watch message to the snapshot (copy-on-write). It
// never replaces the state with an older one of the same cluster (a
// lagging member's); a snapshot of another cluster (a different etcd)
// replaces it whatever its revision.
//
// memo, when not nil, maps a snapshot to what this same message made of it
// for another subscription: subscriptions in the same state share the
// result (snapshots are immutable).
func (s *Subscription) apply(msg *coorddv1.WatchResponse, memo map[*ConfigSnapshot]*ConfigSnapshot) applyResult {
	cur := s.snap.Load()
	typ := msg.GetType()
	var next *ConfigSnapshot
	shared, reused := memo[cur]
	reused = reused && typ != coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT
	if reused {
		typ = coorddv1.WatchEventType_WATCH_EVENT_TYPE_UNSPECIFIED // nothing to build below
		next = shared
	}
	switch typ {
	case coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT:
		if cur.cluster != "" && cur.cluster == msg.GetClusterId() && msg.GetRevision() < cur.revision {
			return applyBehind
		}
		next = &ConfigSnapshot{revision: msg.GetRevision(), cluster: msg.GetClusterId(), spaces: map[string]*nsView{}}
		for _, ns := range s.namespaces {
			next.spaces[ns] = &nsView{values: map[string]string{}}
		}
		for _, ns := range msg.GetSnapshots() {
			if v := s.views().get(msg.GetClusterId(), ns.GetNamespace(), ns.GetRelease(), ns.GetChangedRevision(), ns.GetGray()); v != nil {
				next.spaces[ns.GetNamespace()] = v
				continue
			}
			v := &nsView{release: ns.GetRelease(), gray: ns.GetGray(), changed: ns.GetChangedRevision(), values: make(map[string]string, len(ns.GetEntries()))}
			for _, e := range ns.GetEntries() {
				if !e.GetSecret() || s.reveal { // a hidden secret is left out
					v.values[e.GetKey()] = e.GetValue()
				}
			}
			next.spaces[ns.GetNamespace()] = s.views().put(msg.GetClusterId(), ns.GetNamespace(), v)
		}
		next = s.views().share(s.nsKey, next)
		if s.firstOKDone() {
			s.setStatus(func(st *SubscriptionStatus) { st.Relists++ })
		}
	case coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE:
		r := msg.GetRelease()
		old := cur.spaces[r.GetNamespace()]
		if old == nil || r.GetNumber() != old.release+1 || !s.firstOKDone() {
			return applyGap // never sent by a correct server: relist
		}
		// Subscriptions of one client share the views of one release of a
		// namespace (a release's content is fixed within a cluster).
		if old.gray != msg.GetGray() {
			return applyGap // a gray's start, change or end comes as a snapshot
		}
		v := s.views().get(cur.cluster, r.GetNamespace(), r.GetNumber(), msg.GetRevision(), msg.GetGray())
		if v == nil {
			v = &nsView{release: r.GetNumber(), gray: msg.GetGray(), changed: msg.GetRevision(), values: maps.Clone(old.values),
				from: old.release, keys: make([]string, 0, len(r.GetChanges()))}
			for _, ch := range r.GetChanges() {
				switch {
				case ch.NewValue == nil, ch.GetSecret() && !s.reveal:
					delete(v.values, ch.GetKey())
				default:
					v.values[ch.GetKey()] = ch.GetNewValue()
				}
				v.keys = append(v.keys, ch.GetKey())
			}
			v.changes = changedKeys(old.values, v.values, v.keys, keepAll)
			v = s.views().put(cur.cluster, r.GetNamespace(), v)
		}
		next = &ConfigSnapshot{revision: msg.GetRevision(), cluster: cur.cluster, spaces: maps.Clone(cur.spaces)}
		next.spaces[r.GetNamespace()] = v
		next = s.views().share(s.nsKey, next)
	case coorddv1.WatchEventType_WATCH_EVENT_TYPE_BOOKMARK:
		if msg.GetRevision() > cur.revision {
			next = &ConfigSnapshot{revision: msg.GetRevision(), cluster: cur.cluster, spaces: cur.spaces}
		}
	}
	if next != nil {
		if memo != nil && !reused && typ != coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT {
			memo[cur] = next
		}
		s.snap.Store(next)
	}
	s.setStatus(func(st *SubscriptionStatus) {
		st.State, st.LastContact, st.Revision = StateLive, time.Now(), s.snap.Load().revision
	})
	if msg.GetType() == coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT {
		s.firstOK.Do(func() { close(s.first) })
	}
	if next != nil && msg.GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_BOOKMARK {
		s.wake()
	}
	return applyOK
}

// views is the client's cache of views this subscription shares: those
// with secrets revealed are never shared with subscriptions without.
func (s *Subscription) views() *viewCache {
	if s.reveal {
		return &s.c.revealedViews
	}
	return &s.c.views
}

func (s *Subscription) firstOKDone() bool {
	select {
	case <-s.first:
		return true
	default:
		return false
	}
}

// refuse records that the server refused the watch: Subscribe fails with
// err if it is still waiting, else err is reported.
func (s *Subscription) refuse(err error) {
	select {
	case s.refused <- err:
	default:
	}
	s.errsSent.Add(1) // before the send: the count is never below what errs holds
	select {
	case s.errs <- err:
	default:
		s.errsSent.Add(-1)
	}
	s.wake() // the dispatcher reports it
}

// OnError registers a function called (where the callbacks run) with
// problems the subscription cannot return: a callback that panicked, a
// release a binding rejected, a cache file that could not be written.
func (s *Subscription) OnError(fn func(error)) {
	s.mu.Lock()
	s.errFns = append(s.errFns, fn)
	s.mu.Unlock()
}

func (s *Subscription) report(err error) {
	s.mu.Lock()
	fns := slices.Clone(s.errFns)
	s.mu.Unlock()
	if len(fns) == 0 {
		s.c.lg.Warn("coordd: config subscription", "error", err)
	}
	for _, fn := range fns {
		func() {
			defer func() { _ = recover() }()
			fn(err)
		}()
	}
}
