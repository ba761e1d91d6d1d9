package configcenter

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"google.golang.org/grpc/metadata"

	"github.com/coordd/coordd/internal/base/names"
)

// Cache is a member's watch cache of the whole config tree: one etcd watch
// feeds an in-memory copy of every namespace and a bounded history of
// recent releases, and every subscriber is served from it, so K
// subscribers cost one etcd watch, not K.
//
// Guarantees: a subscriber receives, for its namespaces, a SNAPSHOT and
// then exactly one CHANGE per release, in revision order, each complete;
// whenever it cannot be given every release since its revision (a resume
// point older than the history, its own queue overflowing, the cache
// reloading after losing its watch), it gets a fresh SNAPSHOT instead, at
// a revision not older than anything it was sent. Dispatch never waits
// for a subscriber.
//
// Non-guarantees: the cache may lag etcd by the time it takes a watch
// event to arrive; reads that must be current (Snapshot with a minimum
// revision) wait for it to catch up, or fail with ErrBehind.
type Cache struct {
	store *Store
	cli   *clientv3.Client
	opts  CacheOptions

	ready     chan struct{} // closed once the first load is done
	readyOnce sync.Once
	done      chan struct{} // closed when Run returns
	nudge     chan struct{} // asks the watch for its progress now

	mu      sync.RWMutex
	cluster uint64 // etcd's cluster id
	rev     int64  // every change at or below rev is applied
	oldest  int64  // history holds every release after oldest
	// nsOldest raises oldest for single namespaces whose history starts
	// later (older releases pruned, a record that did not decode).
	nsOldest map[string]int64
	live     bool // the watch is healthy; bookmarks are sent only then
	spaces   map[string]*space
	history  []Event                               // CHANGE events, oldest first
	subs     map[string]map[*Subscription]struct{} // namespace -> subscribers
	advanced chan struct{}                         // closed and replaced whenever rev grows
	// advancedAt is when rev last grew (or the cache was loaded).
	advancedAt time.Time

	// beforeWatch, when set (by tests), runs before each etcd watch opens.
	beforeWatch func()
}

// CacheOptions tune a Cache. Zero values mean the defaults.
type CacheOptions struct {
	// History is how many recent releases (of all namespaces) the cache
	// keeps to resume subscribers without a snapshot. Default 10,000.
	History int
	// QueueLimit bounds the events waiting for one subscriber; past it the
	// subscriber is reset to a snapshot. Default 1,024.
	QueueLimit int
	// Bookmark is how often an idle subscriber is told the current
	// revision. Default 5s.
	Bookmark time.Duration
	// Progress is how often the cache asks etcd for its watch's progress,
	// so its revision advances while the config tree is quiet. Default 1s.
	Progress time.Duration
	// Local is this member's own etcd store, when the member runs one
	// (coordd's embedded etcd): the cache then watches it in place, and a
	// release reaches the cache from etcd's apply with one goroutine
	// woken, instead of through etcd's watch server, its in-process
	// client and that client's watch goroutines (four more wake-ups and
	// copies before the first subscriber hears of it). The tree is still
	// loaded through the client. Nil when etcd runs elsewhere.
	//
	// Like the watch through the in-process client, a local watch does
	// not end when the member loses its leader: the daemon ends its
	// subscribers' streams then (see daemon's leader watch).
	Local LocalStore
}

// LocalStore is a member's etcd store (etcd's mvcc.WatchableKV).
type LocalStore interface {
	NewWatchStream() mvcc.WatchStream
	// Rev is the store's current revision.
	Rev() int64
}

type space struct {
	release int64
	changed int64 // revision of the last release
	content map[string]string
	gray    *Gray // the running gray release, if any
	grayRev int64 // the revision of the last gray change (0: none known)
	// grayView caches, for the current revision, a release event as the
	// running gray's instances see it.
	grayView *Event
	inherit  *Inheritance // the shared namespace it inherits from, if any
}

// NewCache returns a cache over store. Run must be running for it to serve.
func NewCache(store *Store, opts CacheOptions) *Cache {
	if opts.History <= 0 {
		opts.History = 10000
	}
	if opts.QueueLimit <= 0 {
		opts.QueueLimit = 1024
	}
	if opts.Bookmark <= 0 {
		opts.Bookmark = 5 * time.Second
	}
	if opts.Progress <= 0 {
		opts.Progress = time.Second
	}
	return &Cache{
		store: store, cli: store.cli, opts: opts,
		ready: make(chan struct{}), done: make(chan struct{}), nudge: make(chan struct{}, 1),
		spaces: map[string]*space{}, subs: map[string]map[*Subscription]struct{}{}, advanced: make(chan struct{}), nsOldest: map[string]int64{},
	}
}

// Run loads the config tree and follows it with one etcd watch until ctx
// ends. It reloads from a fresh read when its watch is compacted away (and
// resets every subscriber to a snapshot), and reopens a broken watch where
// it left off.
//
// A load opens its watch first, at the serving etcd member's current
// revision, and reads the tree at the revision the watch starts from: such
// a watch is caught up (synced) from the start. etcd answers a progress
// request only while every watch on the request's gRPC stream is synced; a
// watch from an older revision is not until etcd's background sync reaches
// it, up to 100 ms later, and meanwhile every subscription that must start
// from the current state would wait. The cache's watch has a gRPC stream of
// its own (see ownStream), so no other watch of the client delays it so.
// With CacheOptions.Local the watch is on the member's store, opened at its
// current revision, and the tree is read there.
func (c *Cache) Run(ctx context.Context) {
	defer close(c.done)
	backoff := 50 * time.Millisecond
	pause := func() bool {
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		defer t.Stop()
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	fresh := true // the next watch starts with a fresh read
	for ctx.Err() == nil {
		progressed, reload := c.follow(ctx, fresh)
		fresh = reload
		if progressed {
			backoff = 50 * time.Millisecond
			continue
		}
		if !pause() {
			return
		}
	}
}

// load reads every namespace at revision rev and replaces the cache's
// state with it, resetting subscribers. It reports success.
func (c *Cache) load(ctx context.Context, rev int64) bool {
	base := c.store.root + "ns/"
	resp, err := c.cli.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return false
	}
	// Further pages at the same revision.
	kvs := resp.Kvs
	for resp.More {
		last := string(kvs[len(kvs)-1].Key) + "\x00"
		if resp, err = c.cli.Get(ctx, last, clientv3.WithRange(clientv3.GetPrefixRangeEnd(base)), clientv3.WithRev(rev)); err != nil {
			return false
		}
		kvs = append(kvs, resp.Kvs...)
	}
	spaces := map[string]*space{}
	for _, kv := range kvs {
		c.applyKV(spaces, mvccpb.PUT, kv)
	}
	history, oldest, nsOldest, err := c.loadHistory(ctx, rev)
	if err != nil {
		return false
	}
	// After a restore, no history from before it is usable (see
	// Store.MarkRestored).
	mark, err := c.cli.Get(ctx, c.store.restoredKey(), clientv3.WithRev(rev))
	if err != nil {
		return false
	}
	if len(mark.Kvs) > 0 {
		floor := mark.Kvs[0].CreateRevision
		oldest = max(oldest, floor)
		for len(history) > 0 && history[0].Revision <= floor {
			history = history[1:]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev < c.rev {
		return false // never go back (a lagging member answered)
	}
	c.cluster = resp.Header.ClusterId
	c.spaces, c.rev, c.oldest, c.nsOldest, c.history = spaces, rev, oldest, nsOldest, history
	c.live = true
	for _, set := range c.subs {
		for sub := range set {
			sub.resetToSnapshot()
		}
	}
	c.broadcast()
	return true
}

// loadHistory rebuilds the history from the release records (kept in etcd
// for history and rollback), so that after a restart subscribers resume
// without a snapshot: the newest History records at rev, and the revision
// after which that history is complete: after the oldest record read (if
// more exist), and after each namespace's oldest record read unless that
// is its release 1.
func (c *Cache) loadHistory(ctx context.Context, rev int64) ([]Event, int64, map[string]int64, error) {
	base := c.store.root + "rel/"
	resp, err := c.cli.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(int64(c.opts.History)))
	if err != nil {
		return nil, 0, nil, err
	}
	nsOldest := map[string]int64{}
	oldest := int64(0)
	if resp.More && len(resp.Kvs) > 0 {
		oldest = resp.Kvs[len(resp.Kvs)-1].ModRevision - 1
	}
	first := map[string]*Release{} // each namespace's oldest record read
	history := make([]Event, 0, len(resp.Kvs))
	for i := len(resp.Kvs) - 1; i >= 0; i-- {
		kv := resp.Kvs[i]
		esc, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), base), "/")
		ns := names.Unescape(esc)
		r, err := c.store.decodeRelease(ns, kv)
		if err != nil {
			nsOldest[ns] = max(nsOldest[ns], kv.ModRevision) // no resume may cross it
			continue
		}
		if first[r.Namespace] == nil {
			first[r.Namespace] = &r
		}
		history = append(history, Event{Type: EventChange, Revision: r.Revision, Release: &r})
	}
	for ns, r := range first {
		if r.Number > 1 {
			// Its predecessor was not read: pruned (by any member's
			// retention) or older than the records read. Either way
			// nothing before r is known for its namespace.
			nsOldest[ns] = max(nsOldest[ns], r.Revision-1)
		}
	}
	// Drop what the completeness bound excludes.
	i := 0
	for i < len(history) && history[i].Revision <= oldest {
		i++
	}
	return history[i:], oldest, nsOldest, nil
}

// applyKV applies one etcd key change under ns/ to spaces. It returns
// the namespace whose gray release changed, if the change was that.
func (c *Cache) applyKV(spaces map[string]*space, typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) (grayChanged string) {
	rest, ok := strings.CutPrefix(string(kv.Key), c.store.root+"ns/")
	if !ok {
		return ""
	}
	esc, sub, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	ns := names.Unescape(esc)
	sp := spaces[ns]
	if sp == nil {
		sp = &space{content: map[string]string{}}
		spaces[ns] = sp
	}
	switch {
	case strings.HasPrefix(sub, "k/"):
		key := names.Unescape(sub[2:])
		if typ == mvccpb.DELETE {
			delete(sp.content, key)
		} else {
			sp.content[key] = string(kv.Value)
		}
	case sub == "meta" && typ == mvccpb.PUT:
		var m meta
		if json.Unmarshal(kv.Value, &m) == nil {
			sp.release, sp.changed = m.Release, kv.ModRevision
		}
	case sub == "inherit":
		sp.inherit = nil
		if typ == mvccpb.PUT {
			inh := &Inheritance{}
			if json.Unmarshal(kv.Value, inh) == nil {
				sp.inherit = inh
			}
		}
	case sub == "gray":
		sp.gray, sp.grayRev = nil, kv.ModRevision
		if typ == mvccpb.PUT {
			// A record that does not decode runs no gray: its instances
			// keep the normal content, which is never a leak.
			if g, err := c.store.decodeGray(ns, string(kv.Key), kv.Value, kv.ModRevision); err == nil && g.Running() {
				sp.gray = g
			}
		}
		return ns
	}
	return ""
}

// follow watches the tree until the watch ends: when fresh, from the
// member's current revision after reading the tree there; else after
// c.rev. It reports whether it made progress (so the caller retries at
// once: a watch compacted away counts, its reload is due now), and whether
// the next watch must start with a fresh read (this one could not read
// the tree, or fell behind etcd's compacted history).
func (c *Cache) follow(ctx context.Context, fresh bool) (progressed, reload bool) {
	if c.opts.Local != nil {
		return c.followLocal(ctx, fresh)
	}
	wctx, cancel := context.WithCancel(ownStream(clientv3.WithRequireLeader(ctx)))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithProgressNotify()}
	if fresh {
		opts = append(opts, clientv3.WithCreatedNotify())
	} else {
		c.mu.RLock()
		opts = append(opts, clientv3.WithRev(c.rev+1))
		c.mu.RUnlock()
	}
	if c.beforeWatch != nil {
		c.beforeWatch()
	}
	wch := c.cli.Watch(wctx, c.store.root, opts...)
	if fresh {
		// The watch sends what follows the revision its creation reports
		// (and perhaps a little before it, which apply skips): the tree
		// read there joins it without a gap.
		wr, ok := <-wch
		if !ok || wr.Err() != nil || !wr.Created || !c.load(ctx, wr.Header.Revision) {
			return false, true
		}
		c.readyOnce.Do(func() { close(c.ready) })
	}
	// Ask for progress regularly, so the revision (and bookmarks) advance
	// while nothing changes.
	go func() {
		t := time.NewTicker(c.opts.Progress)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			case <-c.nudge:
			}
			// On the watch's own stream (wctx): etcd keys streams by context.
			_ = c.cli.RequestProgress(wctx)
		}
	}()
	for wr := range wch {
		if wr.CompactRevision != 0 {
			// The cache fell behind etcd's history: start over from a
			// fresh read; subscribers get snapshots.
			c.setLive(false)
			return true, true
		}
		if wr.Err() != nil {
			break
		}
		progressed = true
		if wr.IsProgressNotify() {
			c.advance(wr.Header.Revision)
			continue
		}
		c.applyAll(wr.Events)
	}
	c.setLive(false)
	return progressed && ctx.Err() == nil, false
}

// followLocal is follow on the member's own store (CacheOptions.Local).
// The cache's goroutine receives etcd's responses itself, and asks for
// progress on the same schedule as follow.
func (c *Cache) followLocal(ctx context.Context, fresh bool) (progressed, reload bool) {
	ws := c.opts.Local.NewWatchStream()
	defer ws.Close()
	var from int64 // the revision the watch follows
	if fresh {
		from = c.opts.Local.Rev()
	} else {
		c.mu.RLock()
		from = c.rev
		c.mu.RUnlock()
	}
	if c.beforeWatch != nil {
		c.beforeWatch()
	}
	// A watch from the store's current revision is caught up (synced) at
	// once; one from an older revision waits for etcd's sync, as in follow.
	id, err := ws.Watch(ctx, mvcc.WatchID(clientv3.AutoWatchID), []byte(c.store.root), []byte(clientv3.GetPrefixRangeEnd(c.store.root)), from+1)
	if err != nil {
		return false, fresh
	}
	if fresh {
		// The tree at from joins the watch after it without a gap.
		if !c.load(ctx, from) {
			return false, true
		}
		c.readyOnce.Do(func() { close(c.ready) })
	}
	defer c.setLive(false)
	progress := time.NewTicker(c.opts.Progress)
	defer progress.Stop()
	var evs []*clientv3.Event // scratch
	for {
		select {
		case <-ctx.Done():
			return false, false
		case <-progress.C:
			ws.RequestProgress(id)
		case <-c.nudge:
			ws.RequestProgress(id)
		case wr, ok := <-ws.Chan():
			if !ok {
				return progressed && ctx.Err() == nil, false
			}
			if wr.CompactRevision != 0 {
				return true, true // as in follow
			}
			progressed = true
			if len(wr.Events) == 0 {
				c.advance(wr.Revision) // a progress response
				continue
			}
			evs = evs[:0]
			for _, ev := range wr.Events {
				evs = append(evs, (*clientv3.Event)(ev))
			}
			c.applyAll(evs)
			clear(evs)
		}
	}
}

// applyAll applies a watch response's events, revision by revision.
func (c *Cache) applyAll(evs []*clientv3.Event) {
	for len(evs) > 0 {
		r := evs[0].Kv.ModRevision
		n := 1
		for n < len(evs) && evs[n].Kv.ModRevision == r {
			n++
		}
		c.apply(r, evs[:n])
		evs = evs[n:]
	}
}

// ownStream gives the cache's watch a gRPC watch stream of its own. etcd's
// client puts watches whose contexts carry the same outgoing metadata on
// one stream, and etcd answers a progress request only once every watch on
// that stream is synced: an election observer or a KV watch resuming from
// an old revision (same metadata: they too require a leader) would hold up
// the progress that a subscription from the current state waits for, until
// etcd's background sync reached it, up to 100 ms later. The metadata is
// also sent to etcd, which ignores it.
func ownStream(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "coordd-watch", "config-cache")
}

func (c *Cache) setLive(v bool) {
	c.mu.Lock()
	c.live = v
	c.mu.Unlock()
}

// advance records that every change up to rev has been seen.
func (c *Cache) advance(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = true
	if rev > c.rev {
		c.rev = rev
		c.broadcast()
	}
}

// broadcast wakes everyone waiting for the revision to grow. c.mu must be
// held for writing.
func (c *Cache) broadcast() {
	c.advancedAt = time.Now()
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// apply applies one revision's etcd events: the key changes, and the
// release record that becomes a CHANGE event for the namespace's
// subscribers.
func (c *Cache) apply(rev int64, evs []*clientv3.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev <= c.rev {
		return // seen (a reopened watch may repeat a revision)
	}
	relBase := c.store.root + "rel/"
	var changes []Event
	grays := map[string]bool{} // namespaces whose gray changed
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		if k == c.store.restoredKey() && ev.Type == mvccpb.PUT && ev.Kv.Version == 1 {
			// A restore marked while this cache ran: nothing before it
			// can be resumed (see Store.MarkRestored).
			c.oldest, c.history = max(c.oldest, rev), nil
			continue
		}
		if rest, ok := strings.CutPrefix(k, relBase); ok {
			if ev.Type != mvccpb.PUT || ev.Kv.Version != 1 {
				continue // history pruning, or a rewrite (never done)
			}
			esc, _, _ := strings.Cut(rest, "/")
			ns := names.Unescape(esc)
			r, err := c.store.decodeRelease(ns, ev.Kv)
			if err != nil {
				// A release nobody can be told about: its subscribers start
				// over from a snapshot, and no resume may cross it.
				for sub := range c.subs[ns] {
					sub.resetToSnapshot()
				}
				c.nsOldest[ns] = max(c.nsOldest[ns], rev)
				continue
			}
			changes = append(changes, Event{Type: EventChange, Revision: rev, Release: &r})
			continue
		}
		if ns := c.applyKV(c.spaces, ev.Type, ev.Kv); ns != "" {
			grays[ns] = true
		}
	}
	c.rev, c.live = rev, true
	for ns := range grays {
		// Whoever's gray changes starts over from a snapshot of what it
		// now sees (a gray's start, change and end are one revision).
		for sub := range c.subs[ns] {
			if sub.who != nil && c.spaces[ns].grayFor(ns, sub.who) != sub.grays[ns] {
				sub.resetToSnapshot()
			}
		}
	}
	for _, ev := range changes {
		c.history = append(c.history, ev)
		ns := ev.Release.Namespace
		for sub := range c.subs[ns] {
			if sub.grays == nil { // runs no gray: the common case
				sub.enqueue(ev)
				continue
			}
			if g := sub.grays[ns]; g != 0 {
				if sp := c.spaces[ns]; sp.gray != nil && sp.gray.Number == g {
					sub.enqueue(sp.asGray(ev))
				} else {
					// Its gray changed: it is due a snapshot (never the
					// normal release, which would undo the overrides).
					sub.resetToSnapshot()
				}
				continue
			}
			sub.enqueue(ev)
		}
	}
	if over := len(c.history) - c.opts.History; over > 0 {
		// Dropped from the head in place: append moves the rest to a
		// new array once the old one's tail is used up, so a release
		// costs O(1) amortized, not a copy of the whole history.
		c.oldest = c.history[over-1].Revision
		clear(c.history[:over])
		c.history = c.history[over:]
	}
	c.broadcast()
}

// Revision returns the revision the cache has reached.
func (c *Cache) Revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// Stats describe a Cache for metrics.
type Stats struct {
	Revision    int64     // every change at or below it is applied
	AdvancedAt  time.Time // when Revision last grew; zero before the first load
	Live        bool      // its etcd watch is healthy
	Namespaces  int       // namespaces with a release, as Store.Namespaces lists them
	Subscribers int       // subscriptions open on this member
}

// Stats returns the cache's revision, when it last advanced, and its
// namespaces and subscriptions.
func (c *Cache) Stats() Stats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st := Stats{Revision: c.rev, AdvancedAt: c.advancedAt, Live: c.live}
	for _, sp := range c.spaces {
		if sp.changed > 0 { // a meta: not only a schema, a proposal or a policy
			st.Namespaces++
		}
	}
	for _, set := range c.subs {
		st.Subscribers += len(set)
	}
	return st
}

// EachNamespace calls fn with each namespace that has a release: its
// release number and the subscriptions this member serves on it. fn runs
// with the cache locked: it must not call the cache.
func (c *Cache) EachNamespace(fn func(ns string, release int64, subscribers int)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for ns, sp := range c.spaces {
		if sp.changed > 0 {
			fn(ns, sp.release, len(c.subs[ns]))
		}
	}
}

// waitReady waits for the first load.
func (c *Cache) waitReady(ctx context.Context) error {
	select {
	case <-c.ready:
		return nil
	case <-c.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nudgeEvery is how often a wait for the cache asks again for etcd's
// progress.
const nudgeEvery = 50 * time.Millisecond

// waitRevision waits, for at most wait, until the cache has reached rev,
// nudging etcd for progress. It fails with ErrBehind if it did not.
func (c *Cache) waitRevision(ctx context.Context, rev int64, wait time.Duration) error {
	if err := c.waitReady(ctx); err != nil {
		return err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// etcd drops a progress request while a watch on its stream is not
	// synced (the cache's own, after a reopen from its revision), so the
	// nudge is repeated until the cache gets there.
	renudge := time.NewTicker(nudgeEvery)
	defer renudge.Stop()
	nudge := true
	for {
		c.mu.RLock()
		at, advanced := c.rev, c.advanced
		c.mu.RUnlock()
		if at >= rev {
			return nil
		}
		if nudge {
			select {
			case c.nudge <- struct{}{}:
			default:
			}
			nudge = false
		}
		select {
		case <-renudge.C:
			nudge = true
		case <-advanced:
		case <-timer.C:
			return fmt.Errorf("%w: it is at revision %d, the request needs %d", ErrBehind, at, rev)
		case <-c.done:
			return ErrStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// snapshotLocked copies a namespace's state as the instance who sees it
// (nil: the normal content). c.mu must be held.
func (c *Cache) snapshotLocked(ns string, who *Identity) Snapshot {
	s := Snapshot{Namespace: ns, Revision: c.rev, Content: map[string]string{}}
	if sp := c.spaces[ns]; sp != nil {
		s.Release, s.Changed = sp.release, sp.changed
		if s.Gray = sp.grayFor(ns, who); s.Gray != 0 {
			s.Content = sp.gray.apply(sp.content)
		} else {
			s.Content = maps.Clone(sp.content)
		}
		if sp.inherit != nil {
			s.Inherits, s.Inherited = sp.inherit.From, inheritedSet(sp.inherit.Keys)
			s.InheritanceSuspended = sp.inherit.Suspended
		}
	}
	return s
}

// BehindHeirs lists the namespaces that inherit from a shared namespace
// whose release, as this member's cache knows it, they do not carry yet:
// Store.CatchUp brings each up to date.
func (c *Cache) BehindHeirs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for ns, sp := range c.spaces {
		if sp.inherit == nil {
			continue
		}
		if shared := c.spaces[sp.inherit.From]; shared != nil && shared.release > sp.inherit.Release {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// grayFor returns the number of the gray release the instance who sees in
// namespace ns (0: none). sp may be nil.
func (sp *space) grayFor(ns string, who *Identity) int64 {
	if sp == nil || sp.gray == nil || who == nil || !sp.gray.Selector.Matches(ns, who) {
		return 0
	}
	return sp.gray.Number
}

// asGray returns a release event as the running gray's instances see it:
// without the keys the gray overrides. The result is shared by all of
// them (events are read-only).
func (sp *space) asGray(ev Event) Event {
	if v := sp.grayView; v != nil && v.Revision == ev.Revision {
		return *v
	}
	r := *ev.Release
	r.Changes = nil
	for _, ch := range ev.Release.Changes {
		if !sp.gray.overrides(ch.Key) {
			r.Changes = append(r.Changes, ch)
		}
	}
	v := Event{Type: EventChange, Revision: ev.Revision, Release: &r, Gray: sp.gray.Number}
	sp.grayView = &v
	return v
}

// Snapshot returns a namespace's content from the cache, at a revision of
// at least minRev: it waits (up to one second) for the cache to get there,
// and fails with ErrBehind if it does not.
func (c *Cache) Snapshot(ctx context.Context, ns string, minRev int64) (Snapshot, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Snapshot{}, err
	}
	if err := c.waitRevision(ctx, minRev, time.Second); err != nil {
		return Snapshot{}, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.snapshotLocked(ns, nil), nil
}

// Poll waits until the namespace has a release newer than revision after,
// for at most wait (plus up to wait/16 of jitter, so a crowd of pollers
// does not return in step), and returns its snapshot and whether it
// changed. Without a change it returns the current snapshot and false.
func (c *Cache) Poll(ctx context.Context, ns string, after int64, wait time.Duration) (Snapshot, bool, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Snapshot{}, false, err
	}
	if after < 0 || wait < 0 {
		return Snapshot{}, false, fmt.Errorf("%w: after %d, wait %s", ErrInvalid, after, wait)
	}
	if err := c.waitReady(ctx); err != nil {
		return Snapshot{}, false, err
	}
	timer := time.NewTimer(wait + rand.N(wait/16+1))
	defer timer.Stop()
	for {
		c.mu.RLock()
		s := c.snapshotLocked(ns, nil)
		advanced := c.advanced
		c.mu.RUnlock()
		if s.Changed > after {
			return s, true, nil
		}
		select {
		case <-advanced:
		case <-timer.C:
			return s, false, nil
		case <-c.done:
			return Snapshot{}, false, ErrStopped
		case <-ctx.Done():
			return Snapshot{}, false, ctx.Err()
		}
	}
}

// BookmarkInterval is how often idle subscribers are told the revision.
func (c *Cache) BookmarkInterval() time.Duration { return c.opts.Bookmark }
