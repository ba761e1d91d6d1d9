// Package trends keeps the last half hour of a member's figures, sampled
// every ten seconds, so that the console draws charts without an outside
// Prometheus: cluster-wide sessions, grants, waiters, leadership changes,
// releases and subscribers; per lock its grants and queue depth, per
// election its leadership changes and candidates, per namespace its
// releases and subscribers.
//
// Locks and elections are followed through the member's one watch of
// them (a grantwatch Feed over every queue): a grant is an entry coming to
// the head of its queue (an exclusive lock's grant, an election's new
// leader), counted cluster-wide whichever member served it. A semaphore's
// or a read lock's further holders are not counted as grants (their queue
// depth is). Namespaces are sampled from the member's config cache.
//
// Guarantees: figures are this member's view, at most one sample old; the
// series of at most Options.MaxNames locks, elections and namespaces each
// are kept (those active first come first; a name idle for the whole
// window is dropped), and a name past the cap says so (Tracked false).
// Non-guarantees: a member that restarts starts its series again; a watch
// that restarts (etcd compacted what it missed) may miss the grants of
// that moment, and reads the queues again.
package trends

import (
	"context"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/names"
)

// Defaults of Options.
const (
	DefaultEvery    = 10 * time.Second
	DefaultPoints   = 180 // half an hour at DefaultEvery
	DefaultMaxNames = 1000
)

// Options tune a Tracker.
type Options struct {
	Every    time.Duration // between samples
	Points   int           // samples kept per series
	MaxNames int           // names with series, per kind
}

// Sources are what a Tracker samples: the member's watch of the lock and
// election keys, its etcd client (to read the queues at start and after a
// watch restarts), the key root, and functions for the figures it does
// not follow itself.
type Sources struct {
	Watch *grantwatch.Watcher
	Cli   *clientv3.Client
	Root  string // "<key root>"; locks under Root+"lock/", elections Root+"election/"
	// Sessions counts the live sessions (cluster-wide).
	Sessions func(context.Context) (int64, error)
	// Namespaces calls fn with each namespace's release number and
	// subscribers on this member.
	Namespaces func(fn func(ns string, release int64, subscribers int))
	Lg         *zap.Logger
}

// Series is one figure over time: Points[i] was sampled at
// End - (len(Points)-1-i)*Every; a point is NaN where the figure could
// not be read.
type Series struct {
	Name   string
	Unit   string // "per second", "count", "seconds"
	Points []float64
}

// Snapshot is a set of series at one moment.
type Snapshot struct {
	Every   time.Duration
	End     time.Time // the last sample's time (zero before the first)
	Series  []Series
	Tracked bool // false: no series are kept for the name asked for
}

// Tracker keeps the series. Run it; read with Cluster, Lock, Election and
// Namespace. It is safe for concurrent use.
type Tracker struct {
	opts Options
	src  Sources
	now  func() time.Time

	mu         sync.Mutex
	end        time.Time
	cluster    map[string]*ring
	clusterOf  []string // the cluster series' order
	locks      *queues
	elections  *queues
	namespaces *named
	lastRel    map[string]int64 // each namespace's release at the last sample
}

// New returns a Tracker over src.
func New(src Sources, opts Options) *Tracker {
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.Points <= 0 {
		opts.Points = DefaultPoints
	}
	if opts.MaxNames <= 0 {
		opts.MaxNames = DefaultMaxNames
	}
	return &Tracker{
		opts: opts, src: src, now: time.Now, cluster: map[string]*ring{},
		locks:      newQueues(src.Root+"lock/", opts),
		elections:  newQueues(src.Root+"election/", opts),
		namespaces: newNamed(opts),
		lastRel:    map[string]int64{},
	}
}

// Run follows the queues and samples every Options.Every until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	lf, lfrom := t.src.Watch.Subscribe(t.locks.root, true)
	defer lf.Stop()
	ef, efrom := t.src.Watch.Subscribe(t.elections.root, true)
	defer ef.Stop()
	t.reload(ctx, t.locks, lfrom)
	t.reload(ctx, t.elections, efrom)
	tick := time.NewTicker(t.opts.Every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lf.Ready():
			t.take(ctx, lf, t.locks)
		case <-ef.Ready():
			t.take(ctx, ef, t.elections)
		case <-tick.C:
			t.sample(ctx)
		}
	}
}

// take applies a feed's changes to qs (reading the queues again after
// the watch restarted).
func (t *Tracker) take(ctx context.Context, f *grantwatch.Feed, qs *queues) {
	changes, restarted := f.Take()
	if restarted != 0 {
		t.reload(ctx, qs, restarted)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range changes {
		qs.apply(ev)
	}
}

// reload reads qs's entries as of rev (0: now), forgetting what it had.
func (t *Tracker) reload(ctx context.Context, qs *queues, rev int64) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := t.src.Cli.Get(ctx, qs.root, opts...)
	if err != nil {
		if ctx.Err() == nil && t.src.Lg != nil {
			t.src.Lg.Warn("trends: reading the queues failed; their depth is counted from their next changes", zap.Error(err))
		}
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	qs.reset(resp.Kvs, resp.Header.Revision)
}

// sample takes one sample of every series.
func (t *Tracker) sample(ctx context.Context) {
	sessions := math.NaN()
	if t.src.Sessions != nil {
		if n, err := t.src.Sessions(ctx); err == nil {
			sessions = float64(n)
		}
	}
	type nsFigure struct {
		release int64
		subs    int
	}
	nss := map[string]nsFigure{}
	if t.src.Namespaces != nil {
		t.src.Namespaces(func(ns string, release int64, subs int) { nss[ns] = nsFigure{release, subs} })
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	secs := t.opts.Every.Seconds()
	lockGrants, lockDepth, lockHeads := t.locks.sample(secs)
	electionChanges, candidates, leaders := t.elections.sample(secs)
	var releases, subscribers float64
	seen := map[string]bool{}
	for ns, f := range nss {
		seen[ns] = true
		prev, had := t.lastRel[ns]
		t.lastRel[ns] = f.release
		var rel float64
		if had || !t.end.IsZero() { // new since the last sample: all its releases are
			rel = float64(max(f.release-prev, 0))
		}
		releases += rel
		subscribers += float64(f.subs)
		t.namespaces.push(ns, rel > 0 || f.subs > 0, rel, float64(f.subs))
	}
	for ns := range t.lastRel {
		if !seen[ns] {
			delete(t.lastRel, ns)
		}
	}
	t.namespaces.idle(seen)
	for _, c := range []struct {
		name, unit string
		v          float64
	}{
		{"sessions", "count", sessions},
		{"lock grants", "per second", lockGrants},
		{"locks held", "count", lockHeads},
		{"lock queue depth", "count", lockDepth},
		{"leadership changes", "per second", electionChanges},
		{"elections with a leader", "count", leaders},
		{"candidates", "count", candidates},
		{"config releases", "per second", releases / secs},
		{"config subscribers", "count", subscribers},
	} {
		r := t.cluster[c.name]
		if r == nil {
			r = newRing(t.opts.Points)
			t.cluster[c.name] = r
			t.clusterOf = append(t.clusterOf, c.name+"\x00"+c.unit)
		}
		r.push(c.v)
	}
	t.end = t.now()
}

// Cluster returns the cluster-wide series.
func (t *Tracker) Cluster() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.snapshot(true)
	for _, nu := range t.clusterOf {
		name, unit, _ := strings.Cut(nu, "\x00")
		s.Series = append(s.Series, Series{Name: name, Unit: unit, Points: t.cluster[name].values()})
	}
	return s
}

// Lock returns a lock's series: grants per second and queue depth.
func (t *Tracker) Lock(name string) Snapshot {
	return t.queueSeries(t.locks, name, "grants", "queue depth")
}

// Election returns an election's series: leadership changes per second
// and candidates.
func (t *Tracker) Election(name string) Snapshot {
	return t.queueSeries(t.elections, name, "leadership changes", "candidates")
}

// Namespace returns a namespace's series: releases per sample and
// subscribers on this member.
func (t *Tracker) Namespace(ns string) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.snapshot(false)
	if rs, ok := t.namespaces.series[ns]; ok {
		s.Tracked = true
		s.Series = []Series{
			{Name: "releases", Unit: "per sample", Points: rs[0].values()},
			{Name: "subscribers", Unit: "count", Points: rs[1].values()},
		}
	}
	return s
}

func (t *Tracker) queueSeries(qs *queues, name, rate, depth string) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.snapshot(false)
	if rs, ok := qs.series.series[names.Escape(name)]; ok {
		s.Tracked = true
		s.Series = []Series{
			{Name: rate, Unit: "per second", Points: rs[0].values()},
			{Name: depth, Unit: "count", Points: rs[1].values()},
		}
	}
	return s
}

func (t *Tracker) snapshot(tracked bool) Snapshot {
	return Snapshot{Every: t.opts.Every, End: t.end, Tracked: tracked}
}

// queues follows the queues under root ("<root><escaped name>/q/<entry>"):
// each queue's entries by create revision, and the grants (the head
// changing to an entry) since the last sample.
type queues struct {
	root   string
	rev    int64 // changes at or below it are applied
	byName map[string]*queueState
	series *named
}

type queueState struct {
	created map[uint64]int64 // entry key's hash (keyID) -> create revision
	order   []int64          // create revisions, ascending (a queue's order)
	grants  int
}

func newQueues(root string, opts Options) *queues {
	return &queues{root: root, byName: map[string]*queueState{}, series: newNamed(opts)}
}

// nameOf is the escaped name and whether key is a queue entry.
func (qs *queues) nameOf(key string) (string, bool) {
	name, sub, ok := strings.Cut(strings.TrimPrefix(key, qs.root), "/")
	return name, ok && strings.HasPrefix(sub, "q/")
}

func (qs *queues) reset(kvs []*mvccpb.KeyValue, rev int64) {
	qs.byName, qs.rev = map[string]*queueState{}, rev
	for _, kv := range kvs {
		if name, ok := qs.nameOf(string(kv.Key)); ok {
			q := qs.state(name)
			q.created[keyID(kv.Key)] = kv.CreateRevision
			q.order = append(q.order, kv.CreateRevision)
		}
	}
	for _, q := range qs.byName {
		slices.Sort(q.order)
	}
}

func (qs *queues) state(name string) *queueState {
	q := qs.byName[name]
	if q == nil {
		q = &queueState{created: map[uint64]int64{}}
		qs.byName[name] = q
	}
	return q
}

// keyID names an entry by a 64-bit hash of its key: a crowd's entries cost
// 16 bytes each here, not their keys (a collision, about one in 10^10
// within a queue of 100,000, would miscount one grant).
func keyID(key []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(key) // a hash.Hash never fails
	return h.Sum64()
}

// apply counts one change: a new entry at the head of its queue, or the
// head's deletion with entries behind it, is a grant.
func (qs *queues) apply(ev *clientv3.Event) {
	if ev.Kv.ModRevision <= qs.rev {
		return // in the read that reset qs
	}
	key := string(ev.Kv.Key)
	name, ok := qs.nameOf(key)
	if !ok {
		return
	}
	q := qs.state(name)
	switch {
	case ev.Type == mvccpb.PUT && ev.IsCreate():
		if _, had := q.created[keyID(ev.Kv.Key)]; had {
			return
		}
		q.created[keyID(ev.Kv.Key)] = ev.Kv.CreateRevision
		i, _ := slices.BinarySearch(q.order, ev.Kv.CreateRevision)
		q.order = slices.Insert(q.order, i, ev.Kv.CreateRevision)
		if i == 0 {
			q.grants++
		}
	case ev.Type == mvccpb.DELETE:
		rev, had := q.created[keyID(ev.Kv.Key)]
		if !had {
			return
		}
		delete(q.created, keyID(ev.Kv.Key))
		if i, found := slices.BinarySearch(q.order, rev); found {
			if i == 0 {
				// The head goes (a grant ends): O(1), where deleting it
				// would move the whole crowd behind it up one place.
				q.order = q.order[1:]
				if len(q.order) > 0 {
					q.grants++
				}
			} else {
				q.order = slices.Delete(q.order, i, i+1)
			}
		}
	}
}

// sample pushes each queue's grants per second and depth into its series,
// and returns the sums: grants per second, entries, queues with a head.
func (qs *queues) sample(secs float64) (rate, depth, heads float64) {
	active := map[string]bool{}
	for name, q := range qs.byName {
		active[name] = true
		g := float64(q.grants) / secs
		qs.series.push(name, true, g, float64(len(q.order)))
		rate += g
		depth += float64(len(q.order))
		if len(q.order) > 0 {
			heads++
		} else {
			delete(qs.byName, name) // empty: its grants are counted
		}
		q.grants = 0
	}
	qs.series.idle(active)
	return rate, depth, heads
}

// named keeps two series per name, for at most MaxNames names.
type named struct {
	opts   Options
	series map[string][2]*ring
	quiet  map[string]int // samples in a row with nothing
}

func newNamed(opts Options) *named {
	return &named{opts: opts, series: map[string][2]*ring{}, quiet: map[string]int{}}
}

// push adds a sample of name's two figures; a name not kept yet is kept
// when active and under the cap.
func (n *named) push(name string, active bool, a, b float64) {
	rs, ok := n.series[name]
	if !ok {
		if !active || len(n.series) >= n.opts.MaxNames {
			return
		}
		rs = [2]*ring{newRing(n.opts.Points), newRing(n.opts.Points)}
		n.series[name] = rs
	}
	rs[0].push(a)
	rs[1].push(b)
	if active && (a != 0 || b != 0) {
		delete(n.quiet, name)
	}
}

// idle adds a zero sample to every kept name not in active, and drops
// those with nothing for a whole window.
func (n *named) idle(active map[string]bool) {
	for name, rs := range n.series {
		if active[name] {
			continue
		}
		rs[0].push(0)
		rs[1].push(0)
		n.quiet[name]++
		if n.quiet[name] >= n.opts.Points {
			delete(n.series, name)
			delete(n.quiet, name)
		}
	}
}

// ring keeps the last len(buf) samples.
type ring struct {
	buf  []float64
	next int
	full bool
}

func newRing(n int) *ring { return &ring{buf: make([]float64, n)} }

func (r *ring) push(v float64) {
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	r.full = r.full || r.next == 0
}

// values are the samples, oldest first.
func (r *ring) values() []float64 {
	if !r.full {
		return slices.Clone(r.buf[:r.next])
	}
	return append(slices.Clone(r.buf[r.next:]), r.buf[:r.next]...)
}
