package clientlib

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A callback's keys come from the release's changes, made once per
// client and filtered per callback: they must be what diffing the two
// releases' values for that callback gives.
func TestKeptChangesMatchTheDiff(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	show := func(cs []KeyChange) string {
		var b strings.Builder
		for _, c := range cs {
			fmt.Fprintf(&b, "%s:", c.Key)
			for _, p := range []*string{c.Old, c.New} {
				if p == nil {
					b.WriteString("<nil>:")
				} else {
					b.WriteString(*p + ":")
				}
			}
		}
		return b.String()
	}
	filters := map[string]func(string) bool{
		"all": keepAll, "one": func(k string) bool { return k == "k3" },
		"prefix": func(k string) bool { return strings.HasPrefix(k, "k1") }, "none": func(string) bool { return false },
	}
	for range 2000 {
		a, b := map[string]string{}, map[string]string{}
		for i := range 20 {
			k := fmt.Sprintf("k%d", i)
			if rng.IntN(2) == 0 {
				a[k] = fmt.Sprint(rng.IntN(3))
			}
			if rng.IntN(2) == 0 {
				b[k] = fmt.Sprint(rng.IntN(3))
			}
		}
		// The keys a release's changes touched: every key that differs,
		// and some that do not (a release may set a key to its value).
		var keys []string
		for i := range 20 {
			k := fmt.Sprintf("k%d", i)
			av, had := a[k]
			bv, has := b[k]
			if had != has || av != bv || rng.IntN(4) == 0 {
				keys = append(keys, k)
			}
		}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		shared := changedKeys(a, b, keys, keepAll)
		for name, keep := range filters {
			got, want := kept(shared, keep), diffKeys(a, b, keep)
			if show(got) != show(want) {
				t.Fatalf("filter %s: kept %s\nthe diff gives %s", name, show(got), show(want))
			}
			if len(got) > 0 && len(shared) > 0 && &got[0] == &shared[0] {
				t.Fatalf("filter %s: a callback's keys share the release's array", name)
			}
		}
	}
	if !slices.IsSortedFunc(changedKeys(map[string]string{"b": "1", "a": "1"}, map[string]string{}, []string{"b", "a"}, keepAll),
		func(x, y KeyChange) int { return strings.Compare(x.Key, y.Key) }) {
		t.Fatal("a release's changes are not sorted by key")
	}
}
