package configcenter_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/configcenter"
)

// BenchmarkReleaseReachesSubscriber times a release from the publish call
// to its subscriber's Next, with the cache watching etcd through its client
// and watching the member's store in place (CacheOptions.Local). etcd runs
// without fsync, so the figure is the path after the commit, not the disk.
// It reports the p50 and p99 of one release's trip and of the part after
// the publish call returned.
func BenchmarkReleaseReachesSubscriber(b *testing.B) {
	for _, feed := range []string{"client", "local"} {
		b.Run(feed, func(b *testing.B) {
			e := newEnv(b, configcenter.Limits{})
			opts := configcenter.CacheOptions{}
			if feed == "local" {
				opts.Local = e.local
			}
			c := configcenter.NewCache(e.s, opts)
			b.Cleanup(runCache(c))
			ctx := b.Context()
			sub, err := c.Subscribe(ctx, []string{"bench/ns"}, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			if _, err := sub.Next(ctx); err != nil { // the first snapshot
				b.Fatal(err)
			}
			var trips, after []time.Duration
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				r, err := e.s.Put(ctx, "bench/ns", "k", fmt.Sprint(i), 0, "", "")
				if err != nil {
					b.Fatal(err)
				}
				called := time.Now()
				for {
					ev, err := sub.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if ev.Type == configcenter.EventChange && ev.Revision == r.Revision {
						break
					}
				}
				trips, after = append(trips, time.Since(start)), append(after, time.Since(called))
			}
			b.StopTimer()
			for _, m := range []struct {
				name string
				d    []time.Duration
			}{{"trip", trips}, {"after-call", after}} {
				slices.Sort(m.d)
				b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds()), m.name+"-p50-us")
				b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds()), m.name+"-p99-us")
			}
		})
	}
}
