package daemon_test

// The Go SDK's config-center tests are in clientlib/configcenter_e2e_test.go.
// The one here needs a three-member cluster (startCluster), whose etcd peer
// connections outlive it: this package's TestMain lets goleak ignore them,
// clientlib's does not. configTestConfig and fast serve this package's other
// config tests too.

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// configTestConfig is testConfig with quick bookmarks, so stalls are told
// apart from quiet namespaces fast.
func configTestConfig(t *testing.T) daemon.Config {
	cfg := testConfig(t)
	cfg.ConfigCache.Bookmark = 100 * time.Millisecond
	cfg.ConfigCache.Progress = 50 * time.Millisecond
	return cfg
}

// fast are subscription options for tests: short stall timeout and
// reconnect backoff.
var fast = []clientlib.SubscribeOption{
	clientlib.WithStallTimeout(time.Second),
	clientlib.WithReconnectBackoff(50*time.Millisecond, 500*time.Millisecond),
}

// storm publishes multi-key releases to ns until stop is closed, retrying
// while coordd is unavailable, and records each release's content.
type storm struct {
	mu       sync.Mutex
	contents map[int64]map[string]string
	last     int64
	done     chan struct{} // closed when the writer has stopped
}

func (s *storm) content(n int64) (map[string]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contents[n]
	return c, ok
}

func runStorm(ctx context.Context, c *clientlib.Client, ns string, stop <-chan struct{}) *storm {
	s := &storm{contents: map[int64]map[string]string{0: {}}, done: make(chan struct{})}
	cur := map[string]string{}
	go func() {
		defer close(s.done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ms := []clientlib.ConfigMutation{{Key: "a", Value: fmt.Sprint(i)}, {Key: "b", Value: fmt.Sprint(i)}}
			if i%3 == 0 {
				ms = append(ms, clientlib.ConfigMutation{Key: "c", Delete: true})
			} else {
				ms = append(ms, clientlib.ConfigMutation{Key: "c", Value: fmt.Sprint(i)})
			}
			var r clientlib.ConfigRelease
			var err error
			for {
				// A retry whose first attempt landed sets the same values
				// again: no second release.
				r, err = c.ConfigCenter().Publish(ctx, ns, ms, clientlib.PublishOptions{})
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				return
			}
			if len(r.Changes) == 0 {
				continue
			}
			for _, ch := range r.Changes {
				if ch.New == nil {
					delete(cur, ch.Key)
				} else {
					cur[ch.Key] = *ch.New
				}
			}
			s.mu.Lock()
			s.contents[r.Number], s.last = maps.Clone(cur), r.Number
			s.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return s
}

// observer checks what a subscription shows through one channel (its
// callbacks, or polls of Snapshot): every snapshot holds a complete
// release, never older than one shown before on that channel. Callbacks
// run behind Snapshot, so each channel has its own observer, used from
// one goroutine.
type observer struct {
	t       *testing.T
	name    string
	s       *storm
	ns      string
	release atomic.Int64
	bad     atomic.Int32
}

func (o *observer) check(snap *clientlib.ConfigSnapshot) {
	n := snap.Release(o.ns)
	if prev := o.release.Load(); n < prev {
		o.bad.Add(1)
		o.t.Errorf("%s: release %d shown after release %d", o.name, n, prev)
	}
	o.release.Store(n)
	want, ok := o.s.content(n)
	if !ok {
		return // the writer has not recorded it yet (its answer is in flight)
	}
	if got := snap.Values(o.ns); !maps.Equal(got, want) {
		o.bad.Add(1)
		o.t.Errorf("%s: release %d shows %v, it was %v", o.name, n, got, want)
	}
}

func (s *storm) lastRelease() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// TestSubscribersSurviveAMemberStopping: the same as clientlib's
// TestSubscribersSurviveRestartDuringStorm, across a stopped member of a
// three-member cluster (the one the subscribers use first).
func TestSubscribersSurviveAMemberStopping(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	endpoints := grpcAddrs(ds)
	ctx := t.Context()
	writer := newClient(t, endpoints...)
	stop := make(chan struct{})
	s := runStorm(ctx, writer, "storm", stop)
	var subs []*clientlib.Subscription
	var polls []*observer // Snapshot() polled by the test; callbacks have their own
	for i := range 3 {
		// Each subscriber knows every member and connects to one of them at
		// random (the SDK shuffles its endpoints), so the stopped member
		// serves at least one subscriber in about 70% of runs; the others
		// check that a member's stop is invisible to those it did not serve.
		sub, err := newClient(t, endpoints...).ConfigCenter().Subscribe(ctx, []string{"storm"}, fast...)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		cb := &observer{t: t, name: fmt.Sprintf("subscriber %d callbacks", i), s: s, ns: "storm"}
		sub.OnNamespace("storm", func(ch clientlib.ConfigChange) { cb.check(ch.Snapshot) })
		poll := &observer{t: t, name: fmt.Sprintf("subscriber %d snapshots", i), s: s, ns: "storm"}
		subs, polls = append(subs, sub), append(polls, poll)
	}
	wait.Within(t, 10*time.Second, "releases", func() bool { return s.lastRelease() > 20 })
	if err := ds[0].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := s.lastRelease()
	wait.Within(t, 20*time.Second, "releases after the stop", func() bool { return s.lastRelease() > before+20 })
	close(stop)
	<-s.done
	final, err := writer.ConfigCenter().Snapshot(ctx, "storm", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, sub := range subs {
		wait.Within(t, 10*time.Second, "subscribers to converge", func() bool {
			snap := sub.Snapshot()
			polls[i].check(snap)
			return snap.Release("storm") == final.Release && maps.Equal(snap.Values("storm"), final.Values)
		})
	}
}
