package clientlib

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// KeyChange is one key's change: Old is nil for a new key, New for a
// removed one. The strings they point to are shared by every callback
// that sees the change: read them, do not write through the pointers.
type KeyChange struct {
	Key string
	Old *string
	New *string
	// Secret: the key is a secret. Old and New are then empty (they say
	// that it had or has a value, not what), except in a subscription
	// that reveals secrets. Release history and diffs never hold one.
	Secret bool
}

// ConfigUpdate is what a callback receives: the changed keys it asked for,
// from the state the callbacks last saw to Snapshot (several releases
// coalesce into one change while a callback is slow).
type ConfigUpdate struct {
	Namespace string
	Release   int64 // the namespace's release in Snapshot
	Keys      []KeyChange
	Snapshot  *ConfigSnapshot
}

type callback struct {
	ns     string
	filter func(key string) bool
	// fn takes the change by value: a pointer to a change made per call
	// escaped to the heap, an allocation per subscription per release.
	fn func(ConfigUpdate) error // an error rejects the release (bindings)
}

// register adds cb. s.cbs is never modified in place, only replaced, so
// the dispatcher reads it without copying.
func (s *Subscription) register(cb *callback) (unregister func()) {
	s.mu.Lock()
	s.cbs = append(slices.Clip(s.cbs), cb)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.cbs = slices.DeleteFunc(slices.Clone(s.cbs), func(c *callback) bool { return c == cb })
		s.mu.Unlock()
	}
}

// OnNamespace calls fn after every change of the namespace. Callbacks run
// one at a time, in registration order, never two of one subscription at
// once, outside any lock, on a goroutine of the client's (not always the
// same one); a callback that does not return delays no other
// subscription's. A panic is recovered and reported to OnError. It returns
// a function that unregisters fn.
func (s *Subscription) OnNamespace(ns string, fn func(ConfigUpdate)) (unregister func()) {
	return s.register(&callback{ns: ns, filter: func(string) bool { return true }, fn: func(c ConfigUpdate) error { fn(c); return nil }})
}

// OnKey calls fn after every change of one key; see OnNamespace.
func (s *Subscription) OnKey(ns, key string, fn func(ConfigUpdate)) (unregister func()) {
	return s.register(&callback{ns: ns, filter: func(k string) bool { return k == key }, fn: func(c ConfigUpdate) error { fn(c); return nil }})
}

// OnPrefix calls fn after every change of the keys starting with prefix;
// see OnNamespace.
func (s *Subscription) OnPrefix(ns, prefix string, fn func(ConfigUpdate)) (unregister func()) {
	return s.register(&callback{ns: ns, filter: func(k string) bool { return strings.HasPrefix(k, prefix) }, fn: func(c ConfigUpdate) error { fn(c); return nil }})
}

// dispatcher runs a subscription's callbacks, one step at a time on a
// worker of the client's dispatchPool, level-triggered: it compares the
// snapshot the callbacks last saw with the current one, so releases that
// arrive while a callback is slow coalesce into one change and memory
// stays bounded (two snapshots).
type dispatcher struct {
	s         *Subscription
	ctx       context.Context // the subscription's: its end ends the steps
	running   sync.Mutex      // held by a step; Close waits for it
	delivered *ConfigSnapshot // what the callbacks last saw
	recorded  *ConfigSnapshot // what the cache file and the reporter last got
}

func newDispatcher(ctx context.Context, s *Subscription) *dispatcher {
	d := &dispatcher{s: s, ctx: ctx, delivered: s.snap.Load()}
	s.mu.Lock()
	s.good.start(d.delivered)
	s.mu.Unlock()
	return d
}

// step reports the errors found off the dispatcher, calls the callbacks
// for the changes since they last ran, and records the current snapshot
// (cache file, status report); nothing once the subscription ended.
//
// The path from here to a callback is kept light on the stack (the work
// around it is in helpers that return before a callback runs): a stack
// that must grow to call a callback is copied. (With one goroutine per
// subscription, 10,000 of them in one process, the copies held the first
// release after the set-up back by about 50 ms on two CPUs: go run ./bench
// -only config -config-members 3 -config-cluster-subscribers 10000, its
// "first publish" column. A pool's few workers grow their stacks once.)
func (d *dispatcher) step() {
	d.running.Lock()
	defer d.running.Unlock()
	if d.ctx.Err() != nil {
		return
	}
	d.reportErrors()
	cur := d.s.snap.Load()
	var rejected map[string]error
	if cur != d.delivered {
		rejected = d.dispatch(d.delivered, cur)
		d.markGood(cur, rejected)
		d.delivered = cur
	}
	if cur != d.recorded {
		d.record(cur, rejected)
	}
}

// markGood records cur's namespaces that no callback rejected as the
// last good ones.
//
//go:noinline (its map iterator stays off the callbacks' stack)
func (d *dispatcher) markGood(cur *ConfigSnapshot, rejected map[string]error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	d.s.good.delivered(d.delivered, cur, rejected)
}

// record gives cur to the cache file and the status reporter.
//
//go:noinline
func (d *dispatcher) record(cur *ConfigSnapshot, rejected map[string]error) {
	d.recorded = cur
	if d.s.opts.cacheFile != "" {
		d.s.mu.Lock()
		good := d.s.good.all(d.s.namespaces)
		d.s.mu.Unlock()
		d.s.c.dispatch.enterUser() // a write to the disk may take a while
		err := writeCacheFile(d.s.opts.cacheFile, cur, d.s.namespaces, good)
		d.s.c.dispatch.exitUser()
		if err != nil {
			d.report(fmt.Errorf("coordd: write config cache file: %w", err))
		}
	}
	if d.s.reporter != nil {
		d.s.reporter.applied(cur, rejected)
	}
}

// reportErrors reports the errors found off the dispatcher (see
// Subscription.refuse), without waiting. Most wakes carry none: a counter
// spares them a look at the channel.
func (d *dispatcher) reportErrors() {
	for d.s.errsSent.Load() > 0 {
		select {
		case err := <-d.s.errs:
			d.s.errsSent.Add(-1)
			d.report(err)
		default:
			return // counted, not yet in the channel: the sender wakes us again
		}
	}
}

// dispatch calls the callbacks for the changes from old to cur and returns
// the namespaces whose release a callback (a binding) rejected, with why.
func (d *dispatcher) dispatch(old, cur *ConfigSnapshot) map[string]error {
	d.s.mu.Lock()
	cbs := d.s.cbs // replaced, never modified (see register)
	d.s.mu.Unlock()
	var rejected map[string]error
	for _, cb := range cbs {
		keys, release := changes(cb, old, cur)
		if len(keys) == 0 {
			continue
		}
		if err := d.call(cb, ConfigUpdate{Namespace: cb.ns, Release: release, Keys: keys, Snapshot: cur}); err != nil {
			rejected = d.rejected(rejected, cb.ns, err)
		}
	}
	return rejected
}

// changes lists the keys of cb's namespace that cb asks for and that
// differ from old to cur, and the namespace's release in cur.
//
//go:noinline (its frame and the diff's stay off the callbacks' stack)
func changes(cb *callback, old, cur *ConfigSnapshot) ([]KeyChange, int64) {
	a, b := old.spaces[cb.ns], cur.spaces[cb.ns]
	if a == nil || b == nil || a == b {
		return nil, 0
	}
	if b.from != 0 && b.from == a.release && b.gray == a.gray && old.cluster != "" && old.cluster == cur.cluster {
		// b is a's release plus one release's changes (a release's
		// content is fixed within a cluster): only those keys differ.
		return kept(b.changes, cb.filter), b.release
	}
	return diffKeys(a.values, b.values, cb.filter), b.release
}

// rejected adds ns, rejected by a callback for err, to m (made when nil)
// and reports err.
//
//go:noinline
func (d *dispatcher) rejected(m map[string]error, ns string, err error) map[string]error {
	if m == nil {
		m = map[string]error{}
	}
	m[ns] = err
	d.report(err)
	return m
}

func (d *dispatcher) call(cb *callback, ch ConfigUpdate) error {
	p, err := d.callUser(cb, ch)
	if p != nil {
		d.report(fmt.Errorf("coordd: config callback for %q panicked: %v", cb.ns, p))
		return nil // a panicking callback does not reject the release
	}
	return err
}

// report reports err to the subscription's OnError functions (or its
// logger): user code, for the pool.
func (d *dispatcher) report(err error) {
	d.s.c.dispatch.enterUser()
	defer d.s.c.dispatch.exitUser()
	d.s.report(err)
}

// callUser runs cb, as user code for the pool, and returns the value it
// panicked with, or what it returned.
func (d *dispatcher) callUser(cb *callback, ch ConfigUpdate) (panicked any, err error) {
	d.s.c.dispatch.enterUser()
	defer d.s.c.dispatch.exitUser()
	defer func() { panicked = recover() }()
	return nil, cb.fn(ch)
}

// kept returns a copy of the changes that keep keeps (nil for none): a
// callback's own, made from the release's changes, which every
// subscription of the client shares.
func kept(cs []KeyChange, keep func(string) bool) []KeyChange {
	n := 0
	for _, c := range cs {
		if keep(c.Key) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]KeyChange, 0, n)
	for _, c := range cs {
		if keep(c.Key) {
			out = append(out, c)
		}
	}
	return out
}

func keepAll(string) bool { return true }

// changedKeys is diffKeys for maps that can differ only in keys.
func changedKeys(a, b map[string]string, keys []string, keep func(string) bool) []KeyChange {
	var out []KeyChange
	for _, k := range keys {
		if !keep(k) {
			continue
		}
		ov, had := a[k]
		nv, has := b[k]
		switch {
		case had && !has:
			out = append(out, KeyChange{Key: k, Old: &ov})
		case !had && has:
			out = append(out, KeyChange{Key: k, New: &nv})
		case had && nv != ov:
			out = append(out, KeyChange{Key: k, Old: &ov, New: &nv})
		}
	}
	slices.SortFunc(out, func(x, y KeyChange) int { return strings.Compare(x.Key, y.Key) })
	return out
}

// diffKeys lists the keys kept by keep whose values differ between a and
// b, sorted.
func diffKeys(a, b map[string]string, keep func(string) bool) []KeyChange {
	out := added(removedOrChanged(nil, a, b, keep), a, b, keep)
	slices.SortFunc(out, func(x, y KeyChange) int { return strings.Compare(x.Key, y.Key) })
	return out
}

// removedOrChanged appends the keys of a kept by keep that b lacks or
// holds another value of. (diffKeys' two loops are functions of their
// own, so that their map iterators are never on the stack together.)
//
//go:noinline
func removedOrChanged(out []KeyChange, a, b map[string]string, keep func(string) bool) []KeyChange {
	for k, ov := range a {
		if !keep(k) {
			continue
		}
		if nv, ok := b[k]; !ok {
			out = append(out, KeyChange{Key: k, Old: &ov})
		} else if nv != ov {
			out = append(out, KeyChange{Key: k, Old: &ov, New: &nv})
		}
	}
	return out
}

// added appends the keys of b kept by keep that a lacks.
//
//go:noinline
func added(out []KeyChange, a, b map[string]string, keep func(string) bool) []KeyChange {
	for k, nv := range b {
		if _, ok := a[k]; !ok && keep(k) {
			out = append(out, KeyChange{Key: k, New: &nv})
		}
	}
	return out
}
