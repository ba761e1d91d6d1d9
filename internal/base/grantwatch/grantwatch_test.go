package grantwatch_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run starts w.Run for the test's duration.
func run(t *testing.T, w *grantwatch.Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func start(t *testing.T) *clientv3.Client {
	t.Helper()
	return etcdtest.Start(t).Client(t)
}

func put(t *testing.T, cli *clientv3.Client, key string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	resp, err := cli.Put(t.Context(), key, "v", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func del(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	if _, err := cli.Delete(t.Context(), key); err != nil {
		t.Fatal(err)
	}
}

// counter counts reports.
type counter struct{ n atomic.Int32 }

func (c *counter) ended()     { c.n.Add(1) }
func (c *counter) get() int32 { return c.n.Load() }

func TestDeletionIsReportedOnceAndOnlyForTheWatchedEntry(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/", "/r/election/")
	run(t, w)
	lockRev := put(t, cli, "/r/lock/a/q/1/x")
	electionRev := put(t, cli, "/r/election/e/q/1/y")
	otherRev := put(t, cli, "/r/lock/a/q/2/z")

	var lk, el, other counter
	for _, c := range []struct {
		key string
		rev int64
		c   *counter
	}{{"/r/lock/a/q/1/x", lockRev, &lk}, {"/r/election/e/q/1/y", electionRev, &el}, {"/r/lock/a/q/2/z", otherRev, &other}} {
		stop, err := w.Watch(t.Context(), c.key, c.rev, c.c.ended)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	if lk.get()+el.get()+other.get() != 0 {
		t.Fatal("a live entry was reported ended")
	}
	put(t, cli, "/r/lock/a/q/1/x") // an update is no end
	del(t, cli, "/r/lock/a/q/1/x")
	del(t, cli, "/r/election/e/q/1/y")
	wait.For(t, "both deletions reported", func() bool { return lk.get() == 1 && el.get() == 1 })

	// The key comes back (a new incarnation) and goes again: the old watch
	// is over and reports nothing more.
	put(t, cli, "/r/lock/a/q/1/x")
	del(t, cli, "/r/lock/a/q/1/x")
	// A marker write after the deletions: once the watcher has seen it,
	// any report of them would have been made.
	marker := put(t, cli, "/r/lock/marker")
	var seen counter
	stop, err := w.Watch(t.Context(), "/r/lock/marker", marker, seen.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	del(t, cli, "/r/lock/marker")
	wait.For(t, "the marker's deletion reported", func() bool { return seen.get() == 1 })
	if lk.get() != 1 || el.get() != 1 || other.get() != 0 {
		t.Fatalf("reports: lock %d, election %d, untouched entry %d; want 1, 1, 0", lk.get(), el.get(), other.get())
	}
}

func TestAnEntryAlreadyGoneIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/")
	run(t, w)

	var missing counter
	if _, err := w.Watch(t.Context(), "/r/lock/never", 5, missing.ended); err != nil {
		t.Fatal(err)
	}
	if missing.get() != 1 {
		t.Fatal("an entry that does not exist was not reported ended before Watch returned")
	}

	// The key exists, but not the incarnation that was granted.
	first := put(t, cli, "/r/lock/k")
	del(t, cli, "/r/lock/k")
	put(t, cli, "/r/lock/k")
	var replaced counter
	if _, err := w.Watch(t.Context(), "/r/lock/k", first, replaced.ended); err != nil {
		t.Fatal(err)
	}
	if replaced.get() != 1 {
		t.Fatal("a later incarnation of the key was taken for the watched entry")
	}
}

func TestLeaseExpiryIsReported(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/")
	run(t, w)
	lease, err := cli.Grant(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	rev := put(t, cli, "/r/lock/leased", clientv3.WithLease(lease.ID))
	var c counter
	stop, err := w.Watch(t.Context(), "/r/lock/leased", rev, c.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	wait.Within(t, 10*time.Second, "the expired lease's entry reported", func() bool { return c.get() == 1 })
}

// A deletion made while no etcd watch runs (before Run, or between a
// failed watch and its restart) is found when the watch starts.
func TestDeletionBeforeTheWatchStartsIsFound(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/")
	rev := put(t, cli, "/r/lock/early")
	var c counter
	stop, err := w.Watch(t.Context(), "/r/lock/early", rev, c.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	del(t, cli, "/r/lock/early")
	run(t, w)
	wait.For(t, "the deletion made before Run reported", func() bool { return c.get() == 1 })
}

func TestStopEndsReports(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/")
	run(t, w)
	rev := put(t, cli, "/r/lock/s")
	var stopped, marker counter
	stop, err := w.Watch(t.Context(), "/r/lock/s", rev, stopped.ended)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	del(t, cli, "/r/lock/s")
	mrev := put(t, cli, "/r/lock/m")
	mstop, err := w.Watch(t.Context(), "/r/lock/m", mrev, marker.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer mstop()
	del(t, cli, "/r/lock/m")
	wait.For(t, "the marker's deletion reported", func() bool { return marker.get() == 1 })
	if stopped.get() != 0 {
		t.Fatal("a stopped watch reported")
	}
}

// A Feed delivers every change under its prefix (deletions, or puts too),
// in revision order, and nothing else; the first start of the etcd watch
// is reported as a restart with its position (the subscriber reads
// afresh); a Feed subscribed later is positioned at or after what was
// already dispatched; Stop ends deliveries.
func TestFeedsUnderAPrefix(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/r/lock/")
	d, _ := w.Subscribe("/r/lock/a/q/", false)
	other, _ := w.Subscribe("/r/lock/b/q/", false)
	defer other.Stop()
	run(t, w)
	take := func(f *grantwatch.Feed, what string) ([]*clientv3.Event, int64) {
		t.Helper()
		select {
		case <-f.Ready():
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatalf("nothing delivered within 10s: want %s", what)
		}
		return f.Take()
	}
	if _, at := take(d, "the first start"); at == 0 {
		t.Fatal("the watch's first start was not reported as a restart")
	}
	all, from := w.Subscribe("/r/lock/a/", true)
	defer all.Stop()
	type change struct {
		key string
		rev int64
		put bool
	}
	var wantDel, wantAll []change
	for _, k := range []string{"/r/lock/a/q/1", "/r/lock/a/q/2", "/r/lock/a/marker", "/r/lock/b/q/1", "/r/lock/ab/q/1"} {
		rev := put(t, cli, k)
		if strings.HasPrefix(k, "/r/lock/a/") {
			wantAll = append(wantAll, change{k, rev, true})
		}
		if rev <= from {
			t.Fatalf("a put at %d after subscribing, at or below the feed's position %d", rev, from)
		}
	}
	for _, k := range []string{"/r/lock/a/marker", "/r/lock/a/q/2", "/r/lock/b/q/1", "/r/lock/ab/q/1", "/r/lock/a/q/1"} {
		resp, err := cli.Delete(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		c := change{k, resp.Header.Revision, false}
		if strings.HasPrefix(k, "/r/lock/a/q/") {
			wantDel = append(wantDel, c)
		}
		if strings.HasPrefix(k, "/r/lock/a/") {
			wantAll = append(wantAll, c)
		}
	}
	collect := func(f *grantwatch.Feed, n int, what string) []change {
		t.Helper()
		var got []change
		for len(got) < n {
			evs, at := take(f, what)
			if at != 0 {
				t.Fatalf("%s: a restart reported while the watch ran", what)
			}
			for _, ev := range evs {
				got = append(got, change{string(ev.Kv.Key), ev.Kv.ModRevision, ev.Type == clientv3.EventTypePut})
			}
		}
		return got
	}
	if got := collect(d, len(wantDel), "the deletions under /r/lock/a/q/"); !slices.Equal(got, wantDel) {
		t.Fatalf("deletions feed delivered %v, want %v", got, wantDel)
	}
	if got := collect(all, len(wantAll), "the changes under /r/lock/a/"); !slices.Equal(got, wantAll) {
		t.Fatalf("changes feed delivered %v, want %v", got, wantAll)
	}
	d.Stop()
	put(t, cli, "/r/lock/a/q/3")
	put(t, cli, "/r/lock/b/q/2")
	del(t, cli, "/r/lock/a/q/3")
	del(t, cli, "/r/lock/b/q/2") // dispatched after a/q/3's
	wait.For(t, "a later deletion reaching the other subscriber", func() bool {
		evs, _ := other.Take()
		return slices.ContainsFunc(evs, func(e *clientv3.Event) bool { return string(e.Kv.Key) == "/r/lock/b/q/2" })
	})
	if evs, _ := d.Take(); len(evs) != 0 {
		t.Fatalf("delivered %v after Stop", evs)
	}
}

// synced returns once w has dispatched every change made before it was
// called (a marker's deletion is reported only after them).
func synced(t *testing.T, cli *clientv3.Client, w *grantwatch.Watcher) {
	t.Helper()
	rev := put(t, cli, "/r/lock/sync-marker")
	var seen counter
	stop, err := w.Watch(t.Context(), "/r/lock/sync-marker", rev, seen.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	del(t, cli, "/r/lock/sync-marker")
	wait.For(t, "the watcher to catch up", func() bool { return seen.get() == 1 })
}

// An entry known alive at a recent revision is watched without a read:
// its deletion since is remembered (reported at once), its life goes on
// otherwise (reported when it ends); one known alive only at a revision
// older than what is remembered is read, as is one with no revision.
func TestWatchFromARecentRevisionNeedsNoRead(t *testing.T) {
	// Not parallel: it changes a package setting.
	defer grantwatch.SetRecentDeletions(8)()
	cli := start(t)
	gets := etcdtest.CountGets(cli)
	w := grantwatch.New(cli, "/r/lock/")
	run(t, w)
	synced(t, cli, w)

	gone := put(t, cli, "/r/lock/gone")
	alive := put(t, cli, "/r/lock/alive")
	del(t, cli, "/r/lock/gone")
	synced(t, cli, w) // the deletion is dispatched: only the memory knows it
	reads := gets.Load()
	var g, a counter
	stopG, err := w.WatchFrom(t.Context(), "/r/lock/gone", gone, gone, g.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stopG()
	stopA, err := w.WatchFrom(t.Context(), "/r/lock/alive", alive, alive, a.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	if got := gets.Load() - reads; got != 0 {
		t.Fatalf("%d reads to watch entries known alive at a remembered revision, want 0", got)
	}
	if g.get() != 1 || a.get() != 0 {
		t.Fatalf("reports: deleted entry %d, live entry %d; want 1, 0", g.get(), a.get())
	}
	del(t, cli, "/r/lock/alive")
	wait.For(t, "the live entry's deletion reported", func() bool { return a.get() == 1 })

	// More deletions than remembered since the revision named: read.
	old := put(t, cli, "/r/lock/old")
	del(t, cli, "/r/lock/old")
	for i := range 10 {
		put(t, cli, "/r/lock/churn/"+string(rune('a'+i)))
	}
	if _, err := cli.Delete(t.Context(), "/r/lock/churn/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	synced(t, cli, w)
	reads = gets.Load()
	var o counter
	stopO, err := w.WatchFrom(t.Context(), "/r/lock/old", old, old, o.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stopO()
	if got := gets.Load() - reads; got != 1 || o.get() != 1 {
		t.Fatalf("an entry deleted among forgotten deletions: %d reads, %d reports; want 1, 1", got, o.get())
	}
	// No revision: read, as Watch does.
	kept := put(t, cli, "/r/lock/kept")
	reads = gets.Load()
	var k counter
	stopK, err := w.WatchFrom(t.Context(), "/r/lock/kept", kept, 0, k.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stopK()
	if got := gets.Load() - reads; got != 1 || k.get() != 0 {
		t.Fatalf("a watch without a revision: %d reads, %d reports; want 1, 0", got, k.get())
	}
}

// A Set reports each ended entry once, with its report, after Ready; an
// entry removed before its end is taken is not reported; adding one that
// is watched already watches nothing more; after Close nothing is added.
func TestSetReportsEachEndOnce(t *testing.T) {
	t.Parallel()
	cli := start(t)
	w := grantwatch.New(cli, "/s/lock/")
	run(t, w)
	set := grantwatch.NewSet[string](w)
	t.Cleanup(set.Close)
	a := grantwatch.Entry{Key: "/s/lock/a", Token: put(t, cli, "/s/lock/a")}
	b := grantwatch.Entry{Key: "/s/lock/b", Token: put(t, cli, "/s/lock/b")}
	for _, e := range []grantwatch.Entry{a, b, a} {
		if ok, err := set.Add(t.Context(), e, 0, e.Key); err != nil || !ok {
			t.Fatalf("Add %s = %v, %v", e.Key, ok, err)
		}
	}
	del(t, cli, "/s/lock/a")
	<-set.Ready()
	if got := set.Take(); len(got) != 1 || got[0] != "/s/lock/a" {
		t.Fatalf("Take after a's end = %v, want [/s/lock/a] once", got)
	}
	// b ends, but is removed (given up) before its end is taken.
	del(t, cli, "/s/lock/b")
	<-set.Ready()
	set.Remove(b)
	if got := set.Take(); len(got) != 0 {
		t.Fatalf("Take after b was removed = %v, want nothing", got)
	}
	set.Close()
	if ok, err := set.Add(t.Context(), grantwatch.Entry{Key: "/s/lock/c", Token: put(t, cli, "/s/lock/c")}, 0, "c"); ok || err != nil {
		t.Fatalf("Add after Close = %v, %v; want false, nil", ok, err)
	}
}

// A revocation mark of a watched entry is reported once, as it is
// written or at once when it was there before the watch; marks of other
// entries, or of another incarnation, are not; an entry whose mark came
// after the revision a watch names is read, not taken from memory.
func TestRevocationMarksAreReportedToTheirEntry(t *testing.T) {
	t.Parallel()
	cli := start(t)
	prefixes := []string{"/r/lock/"}
	w := grantwatch.New(cli, prefixes...)
	run(t, w)
	synced(t, cli, w)
	mark := func(key string, token int64) {
		t.Helper()
		if _, err := cli.Put(t.Context(), grantwatch.MarkKey(prefixes, key, token), `{"key":"`+key+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	const key = "/r/lock/a/q/1/r"
	token := put(t, cli, key)
	var ended, asked counter
	stop, err := w.WatchRevocable(t.Context(), key, token, token, ended.ended, asked.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mark(key, token+1000)          // another incarnation's
	mark("/r/lock/a/q/2/r", token) // another entry's
	mark(key, token)
	mark(key, token) // written again: still one report
	synced(t, cli, w)
	if asked.get() != 1 || ended.get() != 0 {
		t.Fatalf("reports: asked %d, ended %d; want 1, 0", asked.get(), ended.get())
	}
	del(t, cli, key)
	wait.For(t, "the end reported", func() bool { return ended.get() == 1 })

	// Marked before the watch: reported at once, also from a revision
	// the member's memory covers.
	other := "/r/lock/b/q/1/r"
	tok := put(t, cli, other)
	mark(other, tok)
	synced(t, cli, w)
	var asked2 counter
	stop2, err := w.WatchRevocable(t.Context(), other, tok, tok, func() {}, asked2.ended)
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if asked2.get() != 1 {
		t.Fatalf("a mark written before the watch: %d reports, want 1", asked2.get())
	}
	if got := grantwatch.MarkKey(prefixes, "/r/other/x", 1); got != "" {
		t.Fatalf("MarkKey of a key under no prefix = %q, want empty", got)
	}
}
