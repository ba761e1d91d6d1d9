package clientlib

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestGoodViewsFollowAcceptedReleases checks goodViews against the plain
// rule it implements (a map written for every namespace of every
// delivery): random deliveries, each changing some namespaces' views,
// with random rejections, from a start with or without a cache file's
// views.
func TestGoodViewsFollowAcceptedReleases(t *testing.T) {
	namespaces := []string{"a", "b", "c"}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		view := func() *nsView { return &nsView{release: rng.Int64N(1000)} }
		snap := func(from *ConfigSnapshot) *ConfigSnapshot {
			s := &ConfigSnapshot{spaces: map[string]*nsView{}}
			for _, ns := range namespaces {
				if from != nil && rng.IntN(3) > 0 {
					s.spaces[ns] = from.spaces[ns] // unchanged
				} else {
					s.spaces[ns] = view()
				}
			}
			return s
		}
		var g goodViews
		want := map[string]*nsView{}
		if rng.IntN(2) == 0 { // a cache file's last accepted views
			file := map[string]*nsView{}
			for _, ns := range namespaces {
				file[ns] = view()
			}
			g.pins, want = file, clone(file)
		}
		delivered := snap(nil)
		if rng.IntN(2) == 0 {
			// The file's views may be those of the snapshot started from.
			for ns, v := range g.pins {
				if rng.IntN(2) == 0 {
					delivered.spaces[ns] = v
				}
			}
		}
		g.start(delivered)
		for ns, v := range delivered.spaces {
			if want[ns] == nil {
				want[ns] = v
			}
		}
		for step := range 30 {
			cur := snap(delivered)
			var rejected map[string]error
			for _, ns := range namespaces {
				if rng.IntN(4) == 0 {
					if rejected == nil {
						rejected = map[string]error{}
					}
					rejected[ns] = fmt.Errorf("rejected")
				}
			}
			g.delivered(delivered, cur, rejected)
			for ns, v := range cur.spaces {
				if _, bad := rejected[ns]; !bad && v != delivered.spaces[ns] {
					want[ns] = v
				}
			}
			delivered = cur
			for _, ns := range namespaces {
				if got := g.of(ns); got != want[ns] {
					t.Fatalf("seed %d, step %d: good view of %s is %p (release %d), want %p", seed, step, ns, got, got.release, want[ns])
				}
			}
			if all := g.all(namespaces); len(all) != len(want) {
				t.Fatalf("seed %d, step %d: all() = %d views, want %d", seed, step, len(all), len(want))
			}
		}
	}
}

func clone(m map[string]*nsView) map[string]*nsView {
	out := map[string]*nsView{}
	for k, v := range m {
		out[k] = v
	}
	return out
}
