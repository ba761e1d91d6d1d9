package configcenter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// batch is what the tests compare of a WatchBatch.
type batch struct {
	ids     []int64
	typ     configcenter.EventType
	release int64 // CHANGE: the release number; SNAPSHOT: the first namespace's
	ns      string
	refused bool
}

func (b batch) String() string {
	if b.refused {
		return fmt.Sprintf("%v refused", b.ids)
	}
	typ := map[configcenter.EventType]string{configcenter.EventSnapshot: "SNAPSHOT", configcenter.EventChange: "CHANGE", configcenter.EventBookmark: "BOOKMARK"}[b.typ]
	return fmt.Sprintf("%v %s %s#%d", b.ids, typ, b.ns, b.release)
}

func summarize(b configcenter.WatchBatch) batch {
	out := batch{ids: b.IDs, typ: b.Event.Type, refused: b.Err != nil}
	switch b.Event.Type {
	case configcenter.EventChange:
		out.release, out.ns = b.Event.Release.Number, b.Event.Release.Namespace
	case configcenter.EventSnapshot:
		out.release, out.ns = b.Event.Snapshots[0].Release, b.Event.Snapshots[0].Namespace
	}
	return out
}

// nextOf returns m's next batch, skipping bookmarks unless keep is set.
func nextOf(t *testing.T, m *configcenter.WatchMux, keep bool) configcenter.WatchBatch {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
		b, err := m.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if keep || b.Event.Type != configcenter.EventBookmark {
			return b
		}
	}
}

// releaseTo reads m's batches until release n of ns has reached exactly
// the watches want (in one batch, or in several when it raced a round).
func releaseTo(t *testing.T, m *configcenter.WatchMux, ns string, n int64, want ...int64) {
	t.Helper()
	var got []int64
	for len(got) < len(want) {
		b := summarize(nextOf(t, m, false))
		if b.typ != configcenter.EventChange || b.ns != ns || b.release != n {
			t.Fatalf("%s, want release %d of %s for %v", b, n, ns, want)
		}
		got = append(got, b.ids...)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("release %d of %s went to %v, want %v", n, ns, got, want)
	}
}

// TestWatchMuxRoundsAndBatches drives a WatchMux against a real cache:
// resumed watches replay their backlogs one event per watch per round, a
// release several caught-up watches wait for is one batch naming them all,
// a refused start is a batch of its own and the others go on, and a stop or
// a refused restart ends a watch.
func TestWatchMuxRoundsAndBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour})
	ctx := t.Context()
	put := func(ns string, v int) int64 {
		t.Helper()
		r, err := e.s.Put(ctx, ns, "k", fmt.Sprint(v), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return r.Revision
	}
	a := map[int]int64{} // release -> revision
	for i := 1; i <= 5; i++ {
		a[i] = put("a", i)
	}
	b1 := put("b", 1)
	put("b", 2)
	last := put("b", 3)
	wait.For(t, "every release in the cache's history", func() bool { return cache.Revision() >= last })

	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	for _, st := range []struct {
		id   int64
		ns   string
		from int64
	}{
		{1, "a", a[1] + 1}, // replays a2..a5
		{2, "a", a[3] + 1}, // replays a4, a5
		{3, "b", b1 + 1},   // replays b2, b3
		{4, "bad//ns", 0},  // refused
		{5, "a", 0},        // a snapshot
		{6, "a", a[3] + 1}, // as 2
	} {
		if err := m.Start(st.id, []string{st.ns}, st.from, nil); err != nil {
			t.Fatal(err)
		}
	}
	refused := nextOf(t, m, true)
	if !slices.Equal(refused.IDs, []int64{4}) || !errors.Is(refused.Err, configcenter.ErrInvalid) {
		t.Fatalf("refused start: %+v", refused)
	}
	want := []string{
		// Round 1: the snapshot, then the changes in the order of their
		// first watch; 2 and 6 share theirs.
		"[5] SNAPSHOT a#5", "[1] CHANGE a#2", "[2 6] CHANGE a#4", "[3] CHANGE b#2",
		"[1] CHANGE a#3", "[2 6] CHANGE a#5", "[3] CHANGE b#3", // round 2
		"[1] CHANGE a#4", // rounds 3 and 4: 1 alone
		"[1] CHANGE a#5",
	}
	for i, w := range want {
		if got := summarize(nextOf(t, m, true)).String(); got != w {
			t.Fatalf("batch %d = %s, want %s", i, got, w)
		}
	}

	// Caught up: a release goes to every watch of its namespace once (in
	// one batch unless it raced a round in progress).
	put("a", 6)
	releaseTo(t, m, "a", 6, 1, 2, 5, 6)
	// A stop takes effect in order with the requests after it: once 7's
	// snapshot is in, 2 is gone.
	if err := m.Stop(2); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(7, []string{"b"}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if got := summarize(nextOf(t, m, false)).String(); got != "[7] SNAPSHOT b#3" {
		t.Fatalf("after a stop: %s", got)
	}
	put("a", 7)
	releaseTo(t, m, "a", 7, 1, 5, 6)
	// A refused restart still ends the watch it would have replaced.
	if err := m.Start(1, []string{"a", "a"}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if got := summarize(nextOf(t, m, false)).String(); got != "[1] refused" {
		t.Fatalf("a refused restart: %s", got)
	}
	put("a", 8)
	releaseTo(t, m, "a", 8, 5, 6)
	put("a", 9) // nothing else was due: the next batch is this one
	releaseTo(t, m, "a", 9, 5, 6)
}

// TestWatchMuxBatchesManyReleasesInARound: a round whose watches are at
// more releases than a mux searches one by one still makes one batch per
// release, naming every watch at it.
func TestWatchMuxBatchesManyReleasesInARound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour})
	ctx := t.Context()
	const n = 12 // releases the first round's watches are at
	rev := map[int]int64{}
	for i := 1; i <= n+1; i++ {
		r, err := e.s.Put(ctx, "a", "k", fmt.Sprint(i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		rev[i] = r.Revision
	}
	wait.For(t, "every release in the cache's history", func() bool { return cache.Revision() >= rev[n+1] })
	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	// Watches i and n+i resume after release i: their next is release i+1.
	for i := 1; i <= n; i++ {
		for _, id := range []int64{int64(i), int64(n + i)} {
			if err := m.Start(id, []string{"a"}, rev[i]+1, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 1; i <= n; i++ {
		want := fmt.Sprintf("[%d %d] CHANGE a#%d", i, n+i, i+1)
		if got := summarize(nextOf(t, m, false)).String(); got != want {
			t.Fatalf("batch %d of the first round = %s, want %s", i, got, want)
		}
	}
}

// TestWatchMuxBookmarksOverflowAndLimits: bookmarks of watches at one
// revision are one batch; a watch whose queue overflows gets a fresh
// snapshot while the mux is not read; requests past the limit are refused;
// Next ends with its context.
func TestWatchMuxBookmarksOverflowAndLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{QueueLimit: 4, Bookmark: 50 * time.Millisecond, Progress: time.Hour})
	ctx := t.Context()
	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	for id, ns := range map[int64]string{1: "a", 2: "b"} {
		if err := m.Start(id, []string{ns}, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []string{"[1] SNAPSHOT a#0", "[2] SNAPSHOT b#0"} {
		if got := summarize(nextOf(t, m, true)).String(); got != w {
			t.Fatalf("first batches: %s, want %s", got, w)
		}
	}
	if b := nextOf(t, m, true); b.Event.Type != configcenter.EventBookmark || !slices.Equal(b.IDs, []int64{1, 2}) {
		t.Fatalf("idle watches at one revision: %+v, want one bookmark for both", b)
	}

	// Ten releases while nobody reads: watch 1's queue (4) overflows.
	var last int64
	for i := range 10 {
		r, err := e.s.Put(ctx, "a", "k", fmt.Sprint(i), 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		last = r.Revision
	}
	wait.For(t, "the cache to reach the last release", func() bool { return cache.Revision() >= last })
	if got := summarize(nextOf(t, m, false)).String(); got != "[1] SNAPSHOT a#10" {
		t.Fatalf("after an overflow: %s, want a snapshot at release 10", got)
	}

	// The request queue is bounded: a mux that is not served refuses the
	// request past the bound.
	idle := configcenter.NewWatchMux(cache)
	defer idle.Close()
	for i := range configcenter.MaxQueuedWatchRequests {
		if err := idle.Stop(int64(100 + i)); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if err := idle.Start(3, []string{"a"}, 0, nil); !errors.Is(err, configcenter.ErrInvalid) {
		t.Fatalf("one request too many: %v, want ErrInvalid", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := idle.Next(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with an ended context: %v", err)
	}
}

// TestWatchMuxStartsSeeWritesBeforeThem: a watch started from the current
// state, alone or with others in one lot, gets a snapshot with every
// release published before its Start, even when the cache has not heard
// of it yet (the mux reads etcd's revision once per lot and waits for the
// cache to get there).
func TestWatchMuxStartsSeeWritesBeforeThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour})
	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	id := int64(0)
	for i := int64(1); i <= 30; i++ {
		if _, err := e.s.Put(t.Context(), "a", "k", fmt.Sprint(i), 0, "", ""); err != nil {
			t.Fatal(err)
		}
		lot := 1 + int(i%3) // one start, or several in one lot
		for range lot {
			id++
			if err := m.Start(id, []string{"a"}, 0, nil); err != nil {
				t.Fatal(err)
			}
		}
		for seen := 0; seen < lot; {
			b := summarize(nextOf(t, m, false))
			if b.typ == configcenter.EventChange && b.ids[0] <= id-int64(lot) {
				continue // the earlier watches hearing release i
			}
			if b.typ != configcenter.EventSnapshot || b.release != i || b.ids[0] <= id-int64(lot) {
				t.Fatalf("watches %d to %d started after release %d was published; got %s", id-int64(lot)+1, id, i, b)
			}
			seen++
		}
	}
}

// TestWatchMuxRefuseEndsOneWatch: a refused start (the caller may not
// watch) ends that watch alone, live or not, with its reason; the others
// go on.
func TestWatchMuxRefuseEndsOneWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour, Progress: time.Hour})
	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	for id, ns := range map[int64]string{1: "a", 2: "b"} {
		if err := m.Start(id, []string{ns}, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		nextOf(t, m, false) // the snapshots
	}
	denied := errors.New("not allowed")
	if err := m.Refuse(2, denied); err != nil {
		t.Fatal(err)
	}
	if b := nextOf(t, m, false); !slices.Equal(b.IDs, []int64{2}) || !errors.Is(b.Err, denied) {
		t.Fatalf("the refusal: %+v", b)
	}
	for _, ns := range []string{"b", "a"} {
		if _, err := e.s.Put(t.Context(), ns, "k", "v", 0, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	// b's release reaches nobody: watch 2 ended; a's reaches watch 1.
	releaseTo(t, m, "a", 1, 1)
}

// TestWatchMuxRevealingFollowsTheWatchNotTheID: a watch restarted under
// its id to reveal secrets reveals only from its own start: batches of the
// watch it replaced, even ones returned after the restart was asked, are
// never marked revealing.
func TestWatchMuxRevealingFollowsTheWatchNotTheID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{Bookmark: time.Hour, Progress: time.Hour})
	m := configcenter.NewWatchMux(cache)
	defer m.Close()
	if err := m.Start(1, []string{"a"}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if b := nextOf(t, m, false); m.Revealing(1) {
		t.Fatalf("a plain start reveals: %+v", b)
	}
	for i := range 3 {
		if _, err := e.s.Put(t.Context(), "a", "k", fmt.Sprint(i), 0, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.StartRevealing(1, []string{"b"}, 0, nil); err != nil {
		t.Fatal(err)
	}
	for {
		b := summarize(nextOf(t, m, false))
		if b.ns == "a" && m.Revealing(1) {
			t.Fatalf("a batch of the replaced watch is marked revealing: %s", b)
		}
		if b.ns == "b" {
			if !m.Revealing(1) {
				t.Fatal("the revealing watch is not marked")
			}
			return
		}
	}
}
