package configcenter_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// startCache runs a cache over e's store until the test ends.
func (e env) startCache(t *testing.T, opts configcenter.CacheOptions) *configcenter.Cache {
	t.Helper()
	c := configcenter.NewCache(e.s, opts)
	t.Cleanup(runCache(c))
	return c
}

// runCache runs c until stop is called.
func runCache(c *configcenter.Cache) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	return func() { cancel(); <-done }
}

// truth records the content of every release the writer made.
type truth struct {
	n        atomic.Int64 // releases recorded
	mu       sync.Mutex
	contents map[string]map[int64]map[string]string // ns -> release -> content
	records  map[string]map[int64]configcenter.Release
}

func (tr *truth) record(ns string, r configcenter.Release, content map[string]string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.contents[ns] == nil {
		tr.contents[ns] = map[int64]map[string]string{0: {}}
		tr.records[ns] = map[int64]configcenter.Release{}
	}
	tr.contents[ns][r.Number] = content
	tr.records[ns][r.Number] = r
	tr.n.Add(1)
}

// content returns a release's content, waiting a little for the writer to
// record it (a subscriber may see a release before the writer has read it
// back).
func (tr *truth) content(ns string, n int64) (map[string]string, bool) {
	if n == 0 {
		return map[string]string{}, true
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		tr.mu.Lock()
		c, ok := tr.contents[ns][n]
		tr.mu.Unlock()
		if ok {
			return c, true
		}
	}
	return nil, false
}

// model is what one subscriber believes, checked event by event.
type model struct {
	t        *testing.T
	who      string
	tr       *truth
	rev      int64 // last revision received
	releases map[string]int64
	contents map[string]map[string]string
	changes  int
	snaps    int
}

func (m *model) fail(format string, args ...any) {
	m.t.Errorf("%s: %s", m.who, fmt.Sprintf(format, args...))
}

func (m *model) apply(ev configcenter.Event) {
	if ev.Revision < m.rev || (ev.Type == configcenter.EventChange && ev.Revision == m.rev) {
		m.fail("event %v at revision %d after revision %d", ev.Type, ev.Revision, m.rev)
	}
	m.rev = ev.Revision
	switch ev.Type {
	case configcenter.EventSnapshot:
		m.snaps++
		for _, s := range ev.Snapshots {
			if old, ok := m.releases[s.Namespace]; ok && s.Release < old {
				m.fail("snapshot of %s at release %d after release %d", s.Namespace, s.Release, old)
			}
			if want, ok := m.tr.content(s.Namespace, s.Release); !ok || !maps.Equal(want, s.Content) {
				m.fail("snapshot of %s release %d = %v, the store had %v", s.Namespace, s.Release, s.Content, want)
			}
			m.releases[s.Namespace], m.contents[s.Namespace] = s.Release, maps.Clone(s.Content)
		}
	case configcenter.EventChange:
		m.changes++
		r := ev.Release
		if r.Number != m.releases[r.Namespace]+1 {
			m.fail("release %d of %s after release %d: a gap", r.Number, r.Namespace, m.releases[r.Namespace])
		}
		c := m.contents[r.Namespace]
		for _, ch := range r.Changes {
			old, had := c[ch.Key]
			if had != (ch.Old != nil) || had && old != *ch.Old {
				m.fail("release %d of %s: key %s was %q (%v), the change says %v", r.Number, r.Namespace, ch.Key, old, had, ch.Old)
			}
			if ch.New == nil {
				delete(c, ch.Key)
			} else {
				c[ch.Key] = *ch.New
			}
		}
		m.releases[r.Namespace] = r.Number
		if want, ok := m.tr.content(r.Namespace, r.Number); !ok || !maps.Equal(want, c) {
			m.fail("after release %d of %s: %v, the store had %v", r.Number, r.Namespace, c, want)
		}
	case configcenter.EventBookmark:
	}
}

// TestSubscribersSeeCompleteReleasesInOrder is the subscriber checker:
// random multi-key publishes, deletes, rollbacks and forced compactions,
// while subscribers connect, read a while, disconnect and resume (some
// slowly enough to overflow their queue). Every subscriber must see, per
// namespace, a gap-free sequence of complete releases equal to the store's,
// or a snapshot that restarts it, and end equal to the store.
//
// It runs with the cache watching etcd through its client, and watching the
// member's store in place (CacheOptions.Local, as on coordd's embedded
// member).
func TestSubscribersSeeCompleteReleasesInOrder(t *testing.T) {
	t.Parallel()
	for _, feed := range []string{"client", "local"} {
		t.Run(feed, func(t *testing.T) {
			t.Parallel()
			checkSubscribers(t, feed == "local")
		})
	}
}

func checkSubscribers(t *testing.T, local bool) {
	e := newEnv(t, configcenter.Limits{HistoryReleases: 1000})
	opts := configcenter.CacheOptions{History: 40, QueueLimit: 64, Bookmark: 50 * time.Millisecond, Progress: 20 * time.Millisecond}
	if local {
		opts.Local = e.local
	}
	cache := e.startCache(t, opts)
	ctx := t.Context()
	namespaces := []string{"app/a", "app/b", "shared"}
	midway := make(chan struct{}) // closed once a sixth of the writes are done
	tr := &truth{contents: map[string]map[int64]map[string]string{}, records: map[string]map[int64]configcenter.Release{}}

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range 300 {
			if i == 50 {
				close(midway)
			}
			ns := namespaces[rng.IntN(len(namespaces))]
			var r configcenter.Release
			var err error
			switch op := rng.IntN(10); {
			case op == 0 && i > 10:
				cur, _ := e.s.Snapshot(ctx, ns, 0)
				if cur.Release > 0 {
					r, err = e.s.Rollback(ctx, ns, rng.Int64N(cur.Release), 0, "checker", "")
				}
			case op == 1:
				if _, err := e.cli.Compact(ctx, e.rev(t)); err != nil {
					t.Errorf("compact: %v", err)
				}
				continue
			default:
				var ms []configcenter.Mutation
				for k := range 1 + rng.IntN(4) {
					key := fmt.Sprintf("k%d", (k*7+rng.IntN(6))%6)
					if rng.IntN(4) == 0 {
						ms = append(ms, configcenter.Mutation{Key: key, Delete: true})
					} else {
						ms = append(ms, configcenter.Mutation{Key: key, Value: fmt.Sprintf("v%d-%d", i, k)})
					}
				}
				ms = dedupe(ms)
				r, err = e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: ms, Author: "checker"})
			}
			if err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
			if len(r.Changes) == 0 {
				continue // nothing changed, no release
			}
			snap, err := e.s.Snapshot(ctx, ns, r.Revision)
			if err != nil {
				t.Errorf("read release %d: %v", r.Number, err)
				return
			}
			tr.record(ns, r, snap.Content)
			if rng.IntN(8) == 0 {
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}
	}()

	const subscribers = 6
	var wg sync.WaitGroup
	models := make([]*model, subscribers)
	for i := range subscribers {
		m := &model{t: t, who: fmt.Sprintf("subscriber %d", i), tr: tr, releases: map[string]int64{}, contents: map[string]map[string]string{}}
		models[i] = m
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			slow := i == 0 // overflows its queue
			away := i == 1 // stays away longer than the history reaches
			// Each time on a new cache, started while the writer writes:
			// its read of the tree must join its watch without a gap.
			fresh := i == 5
			for {
				from := int64(0)
				if m.rev > 0 {
					from = m.rev + 1
				}
				c, stop := cache, func() {}
				if fresh {
					<-midway
					c = configcenter.NewCache(e.s, opts)
					stop = runCache(c)
				}
				sub, err := c.Subscribe(ctx, namespaces, from)
				if err != nil {
					stop()
					t.Errorf("%s: Subscribe: %v", m.who, err)
					return
				}
				finished := false
				for n := 1 + rng.IntN(30); n > 0; n-- {
					nctx, cancel := context.WithTimeout(ctx, wait.Bound(2*time.Second))
					ev, err := sub.Next(nctx)
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						break
					}
					if err != nil {
						t.Errorf("%s: Next: %v", m.who, err)
						sub.Close()
						stop()
						return
					}
					m.apply(ev)
					if slow {
						// A sixteenth of its queue behind after each
						// event, however slow the machine.
						tr.awaitMore(int64(opts.QueueLimit)/16, writerDone)
					}
				}
				sub.Close()
				stop()
				if away {
					// Away until more releases than the cache's history
					// holds were made (however slow the machine), or the
					// writer is done.
					tr.awaitMore(int64(opts.History)+1, writerDone)
				}
				finished = closed(writerDone)
				if finished {
					return
				}
			}
		}()
	}
	<-writerDone
	wg.Wait()

	// A last resume from where each left off must bring it level with the
	// store.
	final := map[string]configcenter.Snapshot{}
	for _, ns := range namespaces {
		s, err := e.s.Snapshot(ctx, ns, 0)
		if err != nil {
			t.Fatal(err)
		}
		final[ns] = s
	}
	storeRev := e.rev(t)
	for _, m := range models {
		sub, err := cache.Subscribe(ctx, namespaces, m.rev+1)
		if err != nil {
			t.Fatal(err)
		}
		// Bookmarks keep coming, so the wait is bounded as a whole.
		lctx, cancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
		for m.rev < storeRev-1 || !level(m, final) {
			ev, err := sub.Next(lctx)
			if err != nil {
				cancel()
				t.Fatalf("%s: did not catch up: %v (at %d, store at %d)", m.who, err, m.rev, storeRev)
			}
			m.apply(ev)
		}
		cancel()
		sub.Close()
		t.Logf("%s: %d releases and %d snapshots seen", m.who, m.changes, m.snaps)
	}
	if models[0].snaps < 2 || models[1].snaps < 2 {
		t.Errorf("the slow and the away subscriber were not reset to snapshots (%d, %d snapshots)", models[0].snaps, models[1].snaps)
	}
}

// awaitMore waits until n more releases are recorded, or done is closed.
func (tr *truth) awaitMore(n int64, done <-chan struct{}) {
	from := tr.n.Load()
	for tr.n.Load() < from+n && !closed(done) {
		time.Sleep(5 * time.Millisecond)
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func level(m *model, final map[string]configcenter.Snapshot) bool {
	for ns, s := range final {
		if m.releases[ns] != s.Release || !maps.Equal(m.contents[ns], s.Content) {
			return false
		}
	}
	return true
}

func dedupe(ms []configcenter.Mutation) []configcenter.Mutation {
	seen := map[string]bool{}
	var out []configcenter.Mutation
	for _, m := range ms {
		if !seen[m.Key] {
			seen[m.Key] = true
			out = append(out, m)
		}
	}
	return out
}

// A subscriber that keeps up keeps its queue's array from one release to
// the next (no allocation per release), and one that drained a backlog
// lets the backlog's array go.
func TestQueueArrayKeptOnlyWhenSmall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	c := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour})
	ctx := t.Context()
	var first int64
	for i := range 40 {
		r, err := e.s.Put(ctx, "q/ns", "k", fmt.Sprint(i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Revision
		}
	}
	next := func(sub *configcenter.Subscription) configcenter.Event {
		t.Helper()
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	wait.For(t, "the releases in the cache", func() bool { return c.Revision() >= first+39 })
	sub, err := c.Subscribe(ctx, []string{"q/ns"}, first+1) // a backlog of 39
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for range 39 {
		if ev := next(sub); ev.Type != configcenter.EventChange {
			t.Fatalf("backlog: %v", ev.Type)
		}
	}
	if n := configcenter.QueueArray(sub); n != 0 {
		t.Fatalf("a drained backlog keeps an array of %d events", n)
	}
	for i := range 3 {
		r, err := e.s.Put(ctx, "q/ns", "k", fmt.Sprint("after", i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		ev := next(sub)
		for ev.Revision < r.Revision {
			ev = next(sub)
		}
		if n := configcenter.QueueArray(sub); n < 1 || n > 8 {
			t.Fatalf("after release %d taken alone: an array of %d events, want one of 1 to 8 kept", i, n)
		}
	}
}

// TestStalledSubscriberIsResetNotWaitedFor: a subscriber that stops reading
// does not slow the others, its queue stays bounded, and when it reads
// again it gets a snapshot of the current state.
func TestStalledSubscriberIsResetNotWaitedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{QueueLimit: 4})
	ctx := t.Context()
	stalled, err := cache.Subscribe(ctx, []string{"app"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if ev, err := stalled.Next(ctx); err != nil || ev.Type != configcenter.EventSnapshot {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	live, err := cache.Subscribe(ctx, []string{"app"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if ev, err := live.Next(ctx); err != nil || ev.Type != configcenter.EventSnapshot {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	for i := range 20 {
		r, err := e.s.Put(ctx, "app", "k", fmt.Sprint(i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		ev, err := live.Next(ctx)
		if err != nil || ev.Type != configcenter.EventChange || ev.Release.Number != r.Number {
			t.Fatalf("live subscriber: %+v, %v; want release %d", ev, err, r.Number)
		}
	}
	if stalled.Resets() == 0 {
		t.Fatal("the stalled subscriber's queue was never reset")
	}
	ev, err := stalled.Next(ctx)
	if err != nil || ev.Type != configcenter.EventSnapshot || ev.Snapshots[0].Release != 20 || ev.Snapshots[0].Content["k"] != "19" {
		t.Fatalf("stalled subscriber's next event = %+v, %v; want a snapshot at release 20", ev, err)
	}
}

// TestResumeAndPoll: a subscriber resumes from its revision without a
// snapshot when the history reaches back; bookmarks advance idle ones;
// Poll returns on a newer release or after its wait.
func TestResumeAndPoll(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: 20 * time.Millisecond, Progress: 10 * time.Millisecond})
	ctx := t.Context()
	r1, err := e.s.Put(ctx, "app", "k", "1", 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.s.Put(ctx, "app", "k", "2", 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "other", "k", "x", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	sub, err := cache.Subscribe(ctx, []string{"app"}, r1.Revision+1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Release 2 may reach the cache after a bookmark is due (every 20 ms):
	// a bookmark before it must be below release 2's revision.
	ev, err := sub.Next(ctx)
	for err == nil && ev.Type == configcenter.EventBookmark && ev.Revision < r2.Revision {
		ev, err = sub.Next(ctx)
	}
	if err != nil || ev.Type != configcenter.EventChange || ev.Release.Number != 2 {
		t.Fatalf("resumed: %+v, %v; want release 2 (after bookmarks below its revision %d at most)", ev, err, r2.Revision)
	}
	// Bookmarks advance with the cache: one passes the other namespace's
	// write once the cache has it.
	ev, err = sub.Next(ctx)
	for err == nil && ev.Type == configcenter.EventBookmark && ev.Revision <= r2.Revision {
		ev, err = sub.Next(ctx)
	}
	if err != nil || ev.Type != configcenter.EventBookmark || ev.Revision <= r2.Revision {
		t.Fatalf("idle: %+v, %v; want a bookmark past the other namespace's write", ev, err)
	}
	if _, err := cache.Subscribe(ctx, []string{"app"}, e.rev(t)+1000); !errors.Is(err, configcenter.ErrBehind) {
		t.Fatalf("Subscribe from the future = %v, want ErrBehind", err)
	}

	s, changed, err := cache.Poll(ctx, "app", r2.Revision, 50*time.Millisecond)
	if err != nil || changed || s.Release != 2 {
		t.Fatalf("Poll without a change = %+v, %v, %v", s, changed, err)
	}
	// The release may come before or while Poll waits: either way it
	// answers with it.
	put := make(chan error, 1)
	go func() {
		_, err := e.s.Put(ctx, "app", "k", "3", 0, "", "")
		put <- err
	}()
	s, changed, err = cache.Poll(ctx, "app", r2.Revision, 10*time.Second)
	if perr := <-put; perr != nil {
		t.Fatal(perr)
	}
	if err != nil || !changed || s.Release != 3 || s.Content["k"] != "3" {
		t.Fatalf("Poll across a release = %+v, %v, %v", s, changed, err)
	}
	snap, err := cache.Snapshot(ctx, "app", e.rev(t))
	if err != nil || snap.Release != 3 {
		t.Fatalf("cache Snapshot at the current revision = %+v, %v", snap, err)
	}
}

// A restarted cache rebuilds its history from the release records, so a
// subscriber resumes without a snapshot; but not across a namespace's
// pruned releases.
func TestHistorySurvivesRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{HistoryReleases: 3})
	ctx := t.Context()
	var revs []int64
	for i := range 6 {
		r, err := e.s.Put(ctx, "app", "k", fmt.Sprint(i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Revision)
	}
	if _, err := e.s.Put(ctx, "other", "k", "x", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	cache := e.startCache(t, configcenter.CacheOptions{})
	// Releases 4..6 of app are kept: resuming after release 4 replays 5, 6.
	sub, err := cache.Subscribe(ctx, []string{"app"}, revs[3]+1)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []int64{5, 6} {
		ev, err := sub.Next(ctx)
		if err != nil || ev.Type != configcenter.EventChange || ev.Release.Number != want {
			t.Fatalf("resumed after a restart: %+v, %v; want release %d", ev, err, want)
		}
	}
	sub.Close()
	// Resuming after release 2 would need release 3, which was pruned.
	sub, err = cache.Subscribe(ctx, []string{"app"}, revs[1]+1)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if ev, err := sub.Next(ctx); err != nil || ev.Type != configcenter.EventSnapshot || ev.Snapshots[0].Release != 6 || ev.Cluster == 0 {
		t.Fatalf("resumed across pruned history: %+v, %v; want a snapshot at release 6", ev, err)
	}
}

// A cache that starts while etcd is being written (here: one config
// release and one unrelated key, landing between its read of the tree and
// its watch, if it read first) is at etcd's current revision as soon as it
// is loaded: a subscription that must start from the current state needs
// no progress from its watch, which etcd would give only once its
// background sync caught the watch up (up to 100 ms later).
func TestACacheIsCurrentOnceLoaded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	if _, err := e.s.Put(ctx, "app", "k", "v1", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	c := configcenter.NewCache(e.s, configcenter.CacheOptions{Progress: time.Hour})
	var wrote int64
	configcenter.SetBeforeWatch(c, func() {
		if wrote != 0 {
			return
		}
		if _, err := e.s.Put(ctx, "app", "k", "v2", 0, "", ""); err != nil {
			t.Error(err)
		}
		resp, err := e.cli.Put(ctx, "unrelated", "x")
		if err != nil {
			t.Error(err)
			return
		}
		wrote = resp.Header.Revision
	})
	t.Cleanup(runCache(c))
	wait.For(t, "the cache's first load", func() bool { return !c.Stats().AdvancedAt.IsZero() })
	if st := c.Stats(); st.Revision < wrote {
		t.Fatalf("loaded at revision %d, behind the revision %d written before its watch opened: a subscription from the current state waits for etcd to sync the watch", st.Revision, wrote)
	}
	snap, err := c.Snapshot(ctx, "app", wrote)
	if err != nil || snap.Content["k"] != "v2" {
		t.Fatalf("snapshot at the revision written before the watch: %+v, %v; want k=v2", snap, err)
	}
}

// The cache's watch runs on an etcd watch stream of its own, not on the
// one its client shares among every watch that requires a leader (election
// observers, KV watches): etcd answers progress only once every watch on a
// stream is synced, so one of those resuming from an old revision would
// hold up every subscription that starts from the current state. etcd's
// client puts watches on one stream by their contexts' outgoing metadata,
// and asks for progress on the stream of the context it is given: the test
// records both.
func TestACacheWatchesOnAStreamOfItsOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	rec := &streamRecorder{Watcher: e.cli.Watcher}
	e.cli.Watcher = rec
	e.startCache(t, configcenter.CacheOptions{Progress: 10 * time.Millisecond})
	wait.For(t, "the cache to ask for progress", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.progress) > 0
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	shared := stream(clientv3.WithRequireLeader(t.Context()))
	for _, w := range rec.watches {
		if w == shared {
			t.Fatalf("the cache watches on the stream of every leader-requiring watch (%s)", w)
		}
	}
	for _, p := range rec.progress {
		if !slices.Contains(rec.watches, p) {
			t.Fatalf("the cache asks for progress on stream %s, not its watch's %v", p, rec.watches)
		}
	}
}

// streamRecorder records which etcd watch stream each watch and progress
// request goes to.
type streamRecorder struct {
	clientv3.Watcher
	mu       sync.Mutex
	watches  []string
	progress []string
}

func (r *streamRecorder) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	r.mu.Lock()
	r.watches = append(r.watches, stream(ctx))
	r.mu.Unlock()
	return r.Watcher.Watch(ctx, key, opts...)
}

func (r *streamRecorder) RequestProgress(ctx context.Context) error {
	r.mu.Lock()
	r.progress = append(r.progress, stream(ctx))
	r.mu.Unlock()
	return r.Watcher.RequestProgress(ctx)
}

// stream names the watch stream etcd's client uses for ctx: one per
// distinct outgoing metadata, printed as a plain map (grpc's MD hides its
// values when printed).
func stream(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	return fmt.Sprintf("%+v", map[string][]string(md))
}

// The cache counts the namespaces Store.Namespaces lists (those with a
// release), not every namespace with a key of its own: one with only a
// schema or an approval policy is not counted.
func TestCacheStatsCountNamespacesWithARelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	for _, ns := range []string{"a", "b"} {
		if _, err := e.s.Put(ctx, ns, "k", "v", 0, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.s.SetSchema(ctx, "schema-only", `{"type":"object"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetApproval(ctx, "policy-only", configcenter.ApprovalPolicy{Required: true}, "ana"); err != nil {
		t.Fatal(err)
	}
	last, err := e.s.CurrentRevision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := configcenter.NewCache(e.s, configcenter.CacheOptions{})
	t.Cleanup(runCache(c))
	wait.For(t, "the cache to load", func() bool { return c.Stats().Revision >= last })
	listed, err := e.s.Namespaces(ctx, "", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Namespaces != 2 || len(listed) != 2 {
		t.Errorf("the cache counts %d namespaces, the store lists %q; want a and b in both", st.Namespaces, listed)
	}
}
