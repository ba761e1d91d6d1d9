package configcenter_test

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/coordd/coordd/internal/configcenter"
)

// recordNumbers lists the numbers of ns's kept release records, oldest
// first.
func recordNumbers(t *testing.T, s *configcenter.Store, ns string) []int64 {
	t.Helper()
	rels, err := s.Releases(t.Context(), ns, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, r := range slices.Backward(rels) {
		out = append(out, r.Number)
	}
	return out
}

// publishN makes n releases of ns, each a new value of key k.
func publishN(t *testing.T, s *configcenter.Store, ns string, n int) {
	t.Helper()
	for range n {
		if _, err := s.Put(t.Context(), ns, "k", fmt.Sprint(published.Add(1)), 0, "", ""); err != nil {
			t.Fatal(err)
		}
	}
}

// A release deletes only the records not deleted yet: its range starts
// after the last one trimmed. A range from the first record visits every
// record trimmed since etcd's last compaction (etcd keeps a deleted key in
// its index until then), a cost per release that grew with the releases.
func TestReleaseTrimsOnlyRecordsNotYetTrimmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{HistoryReleases: 3})
	for _, c := range []struct {
		number, trimmed int64
		from, end       int64 // record numbers
		ok              bool
	}{
		{number: 3, trimmed: 0},                            // nothing beyond the limit yet
		{number: 4, trimmed: 0, from: 1, end: 2, ok: true}, // a meta without Trimmed: from the first
		{number: 5, trimmed: 1, from: 2, end: 3, ok: true},
		{number: 5000, trimmed: 4996, from: 4997, end: 4998, ok: true},
		{number: 9, trimmed: 2, from: 3, end: 7, ok: true}, // the limit was lowered: the rest at once
		{number: 9, trimmed: 7},                            // the limit was raised: nothing
	} {
		from, end, ok := configcenter.TrimRange(e.s, "app", c.number, c.trimmed)
		wantFrom := configcenter.RelKey(e.s, "app", c.from)
		if ok != c.ok || (ok && (from != wantFrom || end != configcenter.RelKey(e.s, "app", c.end))) {
			t.Errorf("release %d after %d trimmed: deletes [%q, %q) %v, want [%q, %q) %v", c.number, c.trimmed, from, end, ok,
				wantFrom, configcenter.RelKey(e.s, "app", c.end), c.ok)
		}
	}
}

// The history keeps the last Limits.HistoryReleases records through a
// lowered and a raised limit, and from a meta written before Trimmed was
// kept.
func TestReleaseHistoryFollowsItsLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{HistoryReleases: 5})
	publishN(t, e.s, "app", 8)
	if got := recordNumbers(t, e.s, "app"); !slices.Equal(got, []int64{4, 5, 6, 7, 8}) {
		t.Fatalf("records after 8 releases, limit 5 = %v", got)
	}
	lower := configcenter.NewStore(e.cli, "/coordd/", configcenter.Limits{HistoryReleases: 2})
	publishN(t, lower, "app", 1)
	if got := recordNumbers(t, e.s, "app"); !slices.Equal(got, []int64{8, 9}) {
		t.Fatalf("records after the limit went down to 2 = %v, want 8 9", got)
	}
	higher := configcenter.NewStore(e.cli, "/coordd/", configcenter.Limits{HistoryReleases: 4})
	publishN(t, higher, "app", 3)
	if got := recordNumbers(t, e.s, "app"); !slices.Equal(got, []int64{9, 10, 11, 12}) {
		t.Fatalf("records after the limit went up to 4 = %v, want 9 10 11 12", got)
	}

	// A meta of an older coordd, without Trimmed, over records 1..6.
	publishN(t, higher, "old", 6)
	for n := int64(1); n <= 6; n++ {
		if _, err := e.cli.Put(t.Context(), configcenter.RelKey(e.s, "old", n), fmt.Sprintf(`{"number":%d}`, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.cli.Put(t.Context(), "/coordd/config/ns/old/meta", `{"release":6}`); err != nil {
		t.Fatal(err)
	}
	publishN(t, higher, "old", 1)
	if got := recordNumbers(t, e.s, "old"); !slices.Equal(got, []int64{4, 5, 6, 7}) {
		t.Fatalf("records after a release over an old meta = %v, want 4 5 6 7", got)
	}
	resp, err := e.cli.Get(t.Context(), "/coordd/config/ns/old/meta")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != `{"release":7,"trimmed":3}` {
		t.Fatalf("meta = %v, %v", resp.Kvs, err)
	}
}

// BenchmarkPublishAfterReleases is one release's publish on a namespace
// that made n releases since etcd's last compaction (the test member
// never compacts), with a history of 10.
func BenchmarkPublishAfterReleases(b *testing.B) {
	for _, n := range []int{0, 5000} {
		b.Run(fmt.Sprintf("after=%d", n), func(b *testing.B) {
			e := newEnv(b, configcenter.Limits{HistoryReleases: 10})
			ctx := b.Context()
			for i := range n {
				if _, err := e.s.Put(ctx, "app", "k", fmt.Sprint("v", i), 0, "", ""); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; b.Loop(); i++ { // b.Loop times only the loop
				if _, err := e.s.Put(ctx, "app", "k", fmt.Sprint("w", i), 0, "", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var published atomic.Int64
