package daemon_test

import (
	"fmt"
	"math"
	"net/url"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/trends"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// trendsOf reads a TrendService answer over REST: each series' points,
// summed as events (a rate's points times the interval) and at its last
// point.
type trendSeries struct {
	sum, last float64
	points    int
}

func trendsOf(t *testing.T, addr, path string) (map[string]trendSeries, bool) {
	t.Helper()
	r := call(t, "GET", "http://"+addr+path, "")
	if r.status != 200 {
		t.Fatalf("GET %s: %d %v", path, r.status, r.body)
	}
	tr, _ := r.body["trends"].(map[string]any)
	secs := 0.0
	if d, ok := tr["interval"].(string); ok {
		if v, err := time.ParseDuration(d); err == nil {
			secs = v.Seconds()
		}
	}
	out := map[string]trendSeries{}
	series, _ := tr["series"].([]any)
	for _, s := range series {
		m, _ := s.(map[string]any)
		pts, _ := m["points"].([]any)
		var ts trendSeries
		for _, p := range pts {
			v, _ := p.(float64)
			if m["unit"] == "per second" {
				v *= secs
			}
			ts.sum += v
			ts.last = v
			ts.points++
		}
		out[fmt.Sprint(m["name"])] = ts
	}
	tracked, _ := tr["tracked"].(bool)
	return out, tracked
}

// The member's trends count every grant of a lock, every new leader of an
// election and every release of a namespace, whichever client made them,
// and show the queue that waits: the console's charts read them.
func TestTrendsCountGrantsLeadersAndReleases(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Trends = trends.Options{Every: 50 * time.Millisecond, Points: 1000}
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	wait.For(t, "the first sample", func() bool {
		s, _ := trendsOf(t, d.HTTPAddr(), "/v1/trends")
		return s["sessions"].points > 0
	})

	a, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const cycles = 5
	for range cycles {
		l, err := a.Lock(ctx, "charted")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// One holds and one waits: a depth of two.
	held, err := a.Lock(ctx, "charted")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		l, err := b.Lock(ctx, "charted")
		if err == nil {
			err = l.Release(ctx)
		}
		waiting <- err
	}()
	lockPath := "/v1/locks:trends?name=" + url.QueryEscape("charted")
	wait.For(t, "a sample of the lock held with one waiting", func() bool {
		s, _ := trendsOf(t, d.HTTPAddr(), lockPath)
		return s["queue depth"].last == 2
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	var lock map[string]trendSeries
	wait.For(t, "every grant counted", func() bool {
		lock, _ = trendsOf(t, d.HTTPAddr(), lockPath)
		return math.Round(lock["grants"].sum) >= cycles+2
	})
	if got := math.Round(lock["grants"].sum); got != cycles+2 {
		t.Errorf("the lock's trends count %v grants, want %d", got, cycles+2)
	}

	for i := range 3 {
		if _, err := c.ConfigCenter().Put(ctx, "charted/ns", "k", fmt.Sprint(i), clientlib.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		ld, err := []*clientlib.Session{a, b}[i].Campaign(ctx, "charted-election", "v")
		if err != nil {
			t.Fatal(err)
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	nsPath := "/v1/config:trends?namespace=" + url.QueryEscape("charted/ns")
	elPath := "/v1/elections:trends?name=" + url.QueryEscape("charted-election")
	wait.For(t, "the releases and the leaders counted", func() bool {
		ns, _ := trendsOf(t, d.HTTPAddr(), nsPath)
		el, _ := trendsOf(t, d.HTTPAddr(), elPath)
		return ns["releases"].sum >= 3 && math.Round(el["leadership changes"].sum) >= 2
	})
	ns, _ := trendsOf(t, d.HTTPAddr(), nsPath)
	el, _ := trendsOf(t, d.HTTPAddr(), elPath)
	if ns["releases"].sum != 3 || math.Round(el["leadership changes"].sum) != 2 {
		t.Errorf("releases %v (want 3), leadership changes %v (want 2)", ns["releases"].sum, el["leadership changes"].sum)
	}
	if _, tracked := trendsOf(t, d.HTTPAddr(), "/v1/locks:trends?name=never-used"); tracked {
		t.Error("a lock never used is tracked")
	}
	if r := call(t, "GET", "http://"+d.HTTPAddr()+"/v1/locks:trends?name=", ""); r.status != 400 {
		t.Errorf("trends of no lock: %d %v, want 400", r.status, r.body)
	}
}
