package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

// configTestConfig and fast are daemontest's.
func configTestConfig(t *testing.T) daemon.Config { return daemontest.ConfigTestConfig(t) }

var fast = daemontest.FastSubscribe

type svcConfig struct {
	Port   int    `json:"port"`
	Name   string `json:"name"`
	Limits struct {
		RPS int `json:"rps"`
	} `json:"limits"`
	Debug bool `json:"debug"`
}

func TestConfigThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	if _, err := c.ConfigCenter().Publish(ctx, "svc/prod", []clientlib.ConfigMutation{
		{Key: "port", Value: "8080"}, {Key: "name", Value: `"web"`}, {Key: "limits", Value: `{"rps": 10}`},
	}, clientlib.PublishOptions{Author: "test"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.ConfigCenter().Subscribe(ctx, []string{"bad//ns"}, fast...); !errors.Is(err, clientlib.ErrInvalidArgument) || time.Since(t0) > wait.Bound(5*time.Second) {
		t.Fatalf("Subscribe to a bad namespace = %v after %s; want ErrInvalidArgument at once", err, time.Since(t0))
	}
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"svc/prod", "svc/yaml"}, append(fast, clientlib.WithInstance("test-1", map[string]string{"zone": "a"}))...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Close()
	snap := sub.Snapshot()
	if v, ok := snap.Get("svc/prod", "port"); !ok || v != "8080" || snap.Release("svc/prod") != 1 || snap.Release("svc/yaml") != 0 {
		t.Fatalf("first snapshot: port %q %v, releases %d %d", v, ok, snap.Release("svc/prod"), snap.Release("svc/yaml"))
	}
	if st := sub.Status(); st.State != clientlib.StateLive || st.Revision == 0 {
		t.Fatalf("Status = %+v", st)
	}
	var mu sync.Mutex
	var nsChanges, portChanges, limitChanges []clientlib.ConfigUpdate
	var errs []error
	sub.OnNamespace("svc/prod", func(ch clientlib.ConfigUpdate) { mu.Lock(); nsChanges = append(nsChanges, ch); mu.Unlock() })
	sub.OnKey("svc/prod", "port", func(ch clientlib.ConfigUpdate) { mu.Lock(); portChanges = append(portChanges, ch); mu.Unlock() })
	sub.OnPrefix("svc/prod", "lim", func(ch clientlib.ConfigUpdate) { mu.Lock(); limitChanges = append(limitChanges, ch); mu.Unlock() })
	sub.OnError(func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })

	b, err := clientlib.Bind(sub, "svc/prod", clientlib.JSON,
		clientlib.BindDefaults(svcConfig{Debug: true}),
		clientlib.BindValidate(func(s svcConfig) error {
			if s.Port <= 0 {
				return fmt.Errorf("port %d is not positive", s.Port)
			}
			return nil
		}))
	if err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if v := b.Load(); v.Port != 8080 || v.Name != "web" || v.Limits.RPS != 10 || !v.Debug {
		t.Fatalf("bound value = %+v", v)
	}
	doc, err := clientlib.Bind(sub, "svc/yaml", clientlib.YAML, clientlib.BindKey[svcConfig]("app.yaml"), clientlib.BindStrict[svcConfig]())
	if err != nil {
		t.Fatalf("Bind YAML: %v", err)
	}
	if _, err := c.ConfigCenter().Put(ctx, "svc/yaml", "app.yaml", "port: 9090\nname: api\nlimits:\n  rps: 5\n", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "the YAML binding", func() bool { return doc.Load().Port == 9090 && doc.Load().Limits.RPS == 5 })

	if _, err := c.ConfigCenter().Put(ctx, "svc/prod", "port", "8081", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "port 8081", func() bool { return b.Load().Port == 8081 })
	mu.Lock()
	if len(nsChanges) != 1 || len(portChanges) != 1 || len(limitChanges) != 0 || nsChanges[0].Keys[0].Key != "port" || *nsChanges[0].Keys[0].Old != "8080" || nsChanges[0].Release != 2 {
		t.Fatalf("callbacks: namespace %+v, port %d, limits %d", nsChanges, len(portChanges), len(limitChanges))
	}
	mu.Unlock()

	// A release the binding refuses: the last good value stays, the
	// refusal is reported to OnError and to the server.
	bad, err := c.ConfigCenter().Put(ctx, "svc/prod", "port", "0", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "the rejection", func() bool { mu.Lock(); defer mu.Unlock(); return len(errs) > 0 })
	if b.Load().Port != 8081 || !strings.Contains(errs[0].Error(), "rejected") {
		t.Fatalf("after a bad release: value %+v, error %v", b.Load(), errs[0])
	}
	wait.Within(t, 5*time.Second, "the server to count the rejection", func() bool {
		st, err := c.ConfigCenter().AppliedStatus(ctx, "svc/prod")
		return err == nil && len(st.Instances) == 1 && st.Instances[0].Instance == "test-1" &&
			st.Instances[0].Rejected == bad.Number && st.Applied[2] == 1 && st.Rejected[bad.Number] == 1
	})
	// A schema failure lists every problem.
	if err := c.ConfigCenter().SetSchema(ctx, "svc/prod", `{"type":"object","properties":{"port":{"type":"integer"},"name":{"type":"string"}}}`); err != nil {
		t.Fatal(err)
	}
	_, err = c.ConfigCenter().Publish(ctx, "svc/prod", []clientlib.ConfigMutation{{Key: "port", Value: `"x"`}, {Key: "name", Value: "7"}}, clientlib.PublishOptions{})
	var cerr *clientlib.Error
	if !errors.Is(err, clientlib.ErrValidationFailed) || !errors.As(err, &cerr) || len(cerr.Problems) != 2 {
		t.Fatalf("publish against the schema = %v", err)
	}
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

// TestSubscribersSurviveRestartDuringStorm restarts coordd under a publish
// storm: every subscriber shows only complete releases, never an older one,
// and ends equal to the store.
func TestSubscribersSurviveRestartDuringStorm(t *testing.T) {
	t.Parallel()
	cfg := configTestConfig(t)
	cfg.GRPCAddr = freeport.Addr(t)
	// Stopped at the test's end even after a failure (start); the restart
	// below stops it earlier, which Stop allows (it is idempotent).
	d := start(t, cfg)
	ctx := t.Context()
	writer := newClient(t, cfg.GRPCAddr)
	stop := make(chan struct{})
	s := runStorm(ctx, writer, "storm", stop)
	// Two clients with two subscriptions each: subscriptions of one client
	// share a stream and, in the same state, their snapshots.
	clients := []*clientlib.Client{newClient(t, cfg.GRPCAddr), newClient(t, cfg.GRPCAddr)}
	subs, polls := subscribeToStorm(t, s, clients[0], clients[0], clients[1], clients[1])
	sample := func() {
		for i, sub := range subs {
			polls[i].check(sub.Snapshot())
		}
	}
	wait.Within(t, 10*time.Second, "releases before the restart", func() bool { sample(); return s.lastRelease() > 20 })
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
	before := s.lastRelease()
	wait.Within(t, 20*time.Second, "releases after the restart", func() bool { sample(); return s.lastRelease() > before+20 })
	stopAndConverge(t, writer, s, stop, subs, polls)
}

// subscribeToStorm subscribes through each client to the storm's
// namespace, each subscription's callbacks checked by an observer of its
// own; it returns the subscriptions (closed when the test ends) and, for
// each, an observer for the snapshots the test polls.
func subscribeToStorm(t *testing.T, s *storm, clients ...*clientlib.Client) (subs []*clientlib.Subscription, polls []*observer) {
	t.Helper()
	for i, c := range clients {
		sub, err := c.ConfigCenter().Subscribe(t.Context(), []string{"storm"}, fast...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close)
		cb := &observer{t: t, name: fmt.Sprintf("subscriber %d callbacks", i), s: s, ns: "storm"}
		sub.OnNamespace("storm", func(ch clientlib.ConfigUpdate) { cb.check(ch.Snapshot) })
		poll := &observer{t: t, name: fmt.Sprintf("subscriber %d snapshots", i), s: s, ns: "storm"}
		subs, polls = append(subs, sub), append(polls, poll)
	}
	return subs, polls
}

// stopAndConverge stops the storm and waits until every subscription
// holds the namespace as the store has it, checking each snapshot on the
// way.
func stopAndConverge(t *testing.T, writer *clientlib.Client, s *storm, stop chan struct{}, subs []*clientlib.Subscription, polls []*observer) {
	t.Helper()
	close(stop)
	<-s.done
	final, err := writer.ConfigCenter().Snapshot(t.Context(), "storm", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, sub := range subs {
		wait.Within(t, 10*time.Second, "subscribers to converge", func() bool {
			snap := sub.Snapshot()
			polls[i].check(snap)
			return snap.Release("storm") == final.Release && maps.Equal(snap.Values("storm"), final.Values)
		})
		st := sub.Status()
		t.Logf("subscriber %d: %d reconnects, %d relists", i, st.Reconnects, st.Relists)
	}
}

func (s *storm) lastRelease() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// TestCompactionWhileDisconnected: a subscriber cut off while more releases
// than the cache's history happen (and etcd compacts) comes back with a
// snapshot, and its callbacks fire once per real difference.
func TestCompactionWhileDisconnected(t *testing.T) {
	t.Parallel()
	cfg := configTestConfig(t)
	cfg.ConfigCache.History = 4
	d := start(t, cfg)
	ctx := t.Context()
	writer := newClient(t, d.GRPCAddr())
	put := func(key, value string) {
		t.Helper()
		if _, err := writer.ConfigCenter().Put(ctx, "app", key, value, clientlib.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "1")
	put("c", "1")
	proxy := tcpproxy.Start(t, d.GRPCAddr())
	sub, err := newClient(t, proxy.Addr()).ConfigCenter().Subscribe(ctx, []string{"app"}, fast...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var mu sync.Mutex
	calls := map[string]int{}
	for _, k := range []string{"a", "b", "c", "marker"} {
		sub.OnKey("app", k, func(clientlib.ConfigUpdate) { mu.Lock(); calls[k]++; mu.Unlock() })
	}
	proxy.Freeze()
	wait.Within(t, 5*time.Second, "the subscription to notice", func() bool { return sub.Status().State == clientlib.StateStale })
	for i := 2; i <= 6; i++ {
		put("a", fmt.Sprint(i))
	}
	put("b", "x")
	if _, err := writer.ConfigCenter().Delete(ctx, "app", "b", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	snap, err := writer.ConfigCenter().Snapshot(ctx, "app", 0)
	if err != nil {
		t.Fatal(err)
	}
	compact(t, cfg.EtcdClientURL, fmt.Sprint(snap.Revision))
	relists := sub.Status().Relists
	proxy.Thaw()
	wait.Within(t, 10*time.Second, "the subscription to catch up", func() bool { return sub.Snapshot().Release("app") == snap.Release })
	// Callbacks run in order: once the marker's has run, every callback of
	// the catch-up has too.
	put("marker", "1")
	wait.Within(t, 5*time.Second, "the marker's callback", func() bool { mu.Lock(); defer mu.Unlock(); return calls["marker"] == 1 })
	mu.Lock()
	defer mu.Unlock()
	if calls["a"] != 1 || calls["b"] != 0 || calls["c"] != 0 {
		t.Fatalf("callbacks after catching up: %v; want a once, b and c never", calls)
	}
	// At least one snapshot (a stall under load may add a reconnect, but
	// the callbacks above saw each real change once all the same).
	if got := sub.Status().Relists; got < relists+1 {
		t.Fatalf("relists %d -> %d: want a snapshot", relists, got)
	}
	if v, _ := sub.Snapshot().Get("app", "a"); v != "6" {
		t.Fatalf("a = %q", v)
	}
}

// TestStartFromCacheFileWhileCoorddIsDown: an app starts from its cache
// file at once, marked stale, and converges when coordd comes up; callbacks
// fire only for what really changed.
func TestStartFromCacheFileWhileCoorddIsDown(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	if testing.Short() {
		t.Skip("starts etcd and the daemon")
	}
	cfg := configTestConfig(t)
	cfg.GRPCAddr = freeport.Addr(t)
	cache := filepath.Join(t.TempDir(), "app.config.json")
	ctx := t.Context()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, cfg.GRPCAddr)
	if _, err := c.ConfigCenter().Publish(ctx, "app", []clientlib.ConfigMutation{{Key: "a", Value: "1"}, {Key: "b", Value: "1"}}, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"app"}, append(fast, clientlib.WithCacheFile(cache))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConfigCenter().Put(ctx, "app", "a", "2", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "the cache file", func() bool {
		data, err := os.ReadFile(cache)
		return err == nil && strings.Contains(string(data), `"a": "2"`)
	})
	sub.Close()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// coordd is down: the app starts from the file.
	app, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{cfg.GRPCAddr}, NoWait: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Close() })
	t0 := time.Now()
	sub, err = app.ConfigCenter().Subscribe(ctx, []string{"app"}, append(fast, clientlib.WithCacheFile(cache), clientlib.WithStartTimeout(300*time.Millisecond))...)
	if err != nil {
		t.Fatalf("Subscribe from the cache file: %v", err)
	}
	defer sub.Close()
	if v, _ := sub.Snapshot().Get("app", "a"); v != "2" || sub.Status().State != clientlib.StateStale || time.Since(t0) > wait.Bound(2*time.Second) {
		t.Fatalf("from the cache file: a=%q, status %+v", v, sub.Status())
	}
	var mu sync.Mutex
	var changes []clientlib.ConfigUpdate
	sub.OnNamespace("app", func(ch clientlib.ConfigUpdate) { mu.Lock(); changes = append(changes, ch); mu.Unlock() })

	// coordd comes back, with one change made meanwhile.
	if d, err = daemon.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	if _, err := c.ConfigCenter().Put(ctx, "app", "b", "2", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 10*time.Second, "convergence", func() bool {
		v, _ := sub.Snapshot().Get("app", "b")
		return v == "2" && sub.Status().State == clientlib.StateLive
	})
	// Callbacks run in order: once the marker's change is seen, so is
	// every change before it.
	if _, err := c.ConfigCenter().Put(ctx, "app", "marker", "1", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	keysSeen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var keys []string
		for _, ch := range changes {
			for _, k := range ch.Keys {
				keys = append(keys, k.Key)
			}
		}
		return keys
	}
	wait.Within(t, 5*time.Second, "the marker", func() bool { return slices.Contains(keysSeen(), "marker") })
	if got := strings.Join(keysSeen(), ","); got != "b,marker" && got != "b" {
		t.Fatalf("callbacks saw keys %v; only b (and the marker) changed", got)
	}
}

// TestPanickingAndSlowCallbacks: a panicking callback is reported and the
// subscription goes on; a very slow one sees coalesced changes, and the
// snapshot stays current meanwhile.
func TestPanickingAndSlowCallbacks(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	ctx := t.Context()
	c := newClient(t, d.GRPCAddr())
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"app"}, fast...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var panics, slowCalls, fastCalls atomic.Int32
	sub.OnError(func(error) { panics.Add(1) })
	sub.OnNamespace("app", func(clientlib.ConfigUpdate) { panic("boom") })
	release := make(chan struct{})
	sub.OnNamespace("app", func(clientlib.ConfigUpdate) {
		if slowCalls.Add(1) == 1 {
			<-release // stuck until the test lets go
		}
	})
	var lastSeen atomic.Value
	sub.OnKey("app", "k", func(ch clientlib.ConfigUpdate) {
		fastCalls.Add(1)
		v, _ := ch.Snapshot.Get("app", "k")
		lastSeen.Store(v)
	})
	for i := range 50 {
		if _, err := c.ConfigCenter().Put(ctx, "app", "k", fmt.Sprint(i), clientlib.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The callbacks are stuck behind the slow one; the snapshot is not.
	wait.Within(t, 5*time.Second, "the snapshot", func() bool { v, _ := sub.Snapshot().Get("app", "k"); return v == "49" })
	close(release)
	wait.Within(t, 5*time.Second, "the callbacks to catch up", func() bool { v, _ := lastSeen.Load().(string); return v == "49" })
	if panics.Load() == 0 {
		t.Fatal("the panic was not reported")
	}
	if n := fastCalls.Load(); n >= 50 {
		t.Fatalf("the key callback ran %d times for 50 releases behind a stuck callback: nothing coalesced", n)
	}
	t.Logf("50 releases: the slow callback ran %d times, the key callback %d, %d panics reported", slowCalls.Load(), fastCalls.Load(), panics.Load())
}

// Callbacks that do not return delay no other subscription of the
// client: its dispatch workers are shared, and one stuck in a callback
// must not leave the others' releases queued behind it. Four
// subscriptions get stuck, a fifth still sees every release. A callback
// that ends its goroutine (runtime.Goexit, as t.FailNow would) stops
// neither its subscription nor the others, and a release that came while
// it ran is not lost.
func TestStuckCallbacksDelayNoOtherSubscription(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	ctx := t.Context()
	c := newClient(t, d.GRPCAddr())
	subscribe := func() *clientlib.Subscription {
		sub, err := c.ConfigCenter().Subscribe(ctx, []string{"app"}, fast...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close) // after release is closed: Close waits for the callbacks
		return sub
	}
	release := make(chan struct{})
	defer close(release)
	var stuck atomic.Int32
	for range 4 {
		subscribe().OnKey("app", "k", func(clientlib.ConfigUpdate) {
			stuck.Add(1)
			<-release
		})
	}
	var exits atomic.Int32
	var exited atomic.Value
	goOn := make(chan struct{})
	letGo := sync.OnceFunc(func() { close(goOn) })
	defer letGo() // if the test fails first: Close waits for the callback
	exiting := subscribe()
	exiting.OnKey("app", "k", func(ch clientlib.ConfigUpdate) {
		v, _ := ch.Snapshot.Get("app", "k")
		exited.Store(v)
		if exits.Add(1) == 1 {
			<-goOn // until the next release reached the subscription
			runtime.Goexit()
		}
	})
	var seen atomic.Value
	subscribe().OnKey("app", "k", func(ch clientlib.ConfigUpdate) {
		v, _ := ch.Snapshot.Get("app", "k")
		seen.Store(v)
	})
	put := func(v string) {
		t.Helper()
		if _, err := c.ConfigCenter().Put(ctx, "app", "k", v, clientlib.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("first")
	wait.Within(t, 5*time.Second, "five callbacks stuck", func() bool { return stuck.Load() == 4 && exits.Load() == 1 })
	put("second")
	wait.Within(t, 5*time.Second, "the release to reach the stuck subscription", func() bool {
		v, _ := exiting.Snapshot().Get("app", "k")
		return v == "second"
	})
	letGo()
	// No release follows: the one that came during the step that ended
	// its goroutine must still reach the callback.
	wait.Within(t, 5*time.Second, "the callback that ended its goroutine, called again with the release that came meanwhile", func() bool {
		v, _ := exited.Load().(string)
		return v == "second" && exits.Load() == 2
	})
	for i := range 20 {
		put(fmt.Sprint(i))
		want := fmt.Sprint(i)
		wait.Within(t, 5*time.Second, "the free subscription's callback at "+want, func() bool { v, _ := seen.Load().(string); return v == want })
	}
	wait.Within(t, 5*time.Second, "the callback that ended its goroutine, at the last release", func() bool { v, _ := exited.Load().(string); return v == "19" })
	if n := stuck.Load(); n != 4 {
		t.Fatalf("the stuck callbacks ran %d times, want 4 (each once, still stuck)", n)
	}
}

// An app restarted while the newest release of its namespace is bad binds
// the last release it accepted before the restart (kept in its cache
// file), instead of failing to start.
func TestBindStartsFromTheLastAcceptedReleaseAfterARestart(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	cache := filepath.Join(t.TempDir(), "app.config.json")
	type appConfig struct {
		Port int `json:"port"`
	}
	validPort := clientlib.BindValidate(func(a appConfig) error {
		if a.Port <= 0 {
			return fmt.Errorf("port %d is not positive", a.Port)
		}
		return nil
	})
	good, err := c.ConfigCenter().Put(ctx, "bind/app", "port", "8080", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bind := func() (*clientlib.Subscription, *clientlib.Binding[appConfig], error) {
		sub, err := c.ConfigCenter().Subscribe(ctx, []string{"bind/app"}, append(fast, clientlib.WithCacheFile(cache))...)
		if err != nil {
			t.Fatal(err)
		}
		b, err := clientlib.Bind(sub, "bind/app", clientlib.JSON, validPort)
		return sub, b, err
	}
	sub, b, err := bind()
	if err != nil {
		t.Fatal(err)
	}
	bad, err := c.ConfigCenter().Put(ctx, "bind/app", "port", "0", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "the bad release in the cache file", func() bool {
		data, err := os.ReadFile(cache)
		return err == nil && strings.Contains(string(data), fmt.Sprintf(`"release": %d`, bad.Number))
	})
	if b.Load().Port != 8080 {
		t.Fatalf("bound %+v after a bad release", b.Load())
	}
	sub.Close()

	// The restart: a new subscription, the bad release still the newest.
	sub, b, err = bind()
	if err != nil {
		t.Fatalf("Bind after a restart with a bad newest release: %v", err)
	}
	defer sub.Close()
	if b.Load().Port != 8080 || b.Release() != good.Number {
		t.Fatalf("bound %+v from release %d, want port 8080 from release %d", b.Load(), b.Release(), good.Number)
	}
	// A good release is taken as usual.
	if _, err := c.ConfigCenter().Put(ctx, "bind/app", "port", "9090", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 5*time.Second, "the next good release", func() bool { return b.Load().Port == 9090 })
}

// A callback is told exactly the keys that changed, with their old and
// new values: from the release it saw to the next one (the changes that
// release lists), and across several releases it missed while it was busy
// (the two states compared). A key set to the value it had is no change.
func TestCallbacksGetTheChangedKeys(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	ctx := t.Context()
	c := newClient(t, d.GRPCAddr())
	set := func(kvs ...string) clientlib.ConfigRelease {
		t.Helper()
		var ms []clientlib.ConfigMutation
		for i := 0; i+1 < len(kvs); i += 2 {
			if kvs[i+1] == "-" {
				ms = append(ms, clientlib.ConfigMutation{Key: kvs[i], Delete: true})
			} else {
				ms = append(ms, clientlib.ConfigMutation{Key: kvs[i], Value: kvs[i+1]})
			}
		}
		r, err := c.ConfigCenter().Publish(ctx, "app", ms, clientlib.PublishOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	set("a", "1", "b", "1", "c", "1")
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"app"}, fast...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	seen := make(chan clientlib.ConfigUpdate, 16)
	hold := make(chan struct{})    // closed: callbacks run freely
	blocked := make(chan struct{}) // closed once a callback waits on hold
	var holding atomic.Bool
	sub.OnNamespace("app", func(ch clientlib.ConfigUpdate) {
		if holding.CompareAndSwap(true, false) {
			close(blocked)
			<-hold
		}
		seen <- ch
	})
	str := func(p *string) string {
		if p == nil {
			return "nil"
		}
		return *p
	}
	describe := func(ch clientlib.ConfigUpdate) string {
		var parts []string
		for _, k := range ch.Keys {
			parts = append(parts, fmt.Sprintf("%s:%s>%s", k.Key, str(k.Old), str(k.New)))
		}
		return strings.Join(parts, " ")
	}
	next := func(what string) clientlib.ConfigUpdate {
		t.Helper()
		select {
		case ch := <-seen:
			return ch
		case <-time.After(wait.Bound(5 * time.Second)):
			t.Fatalf("no callback for %s within 5s", what)
			return clientlib.ConfigUpdate{}
		}
	}

	// One release after the one the callback saw.
	r := set("a", "2", "b", "-", "c", "1", "d", "1")
	ch := next("one release")
	if got, want := describe(ch), "a:1>2 b:1>nil d:nil>1"; got != want || ch.Release != r.Number {
		t.Fatalf("one release: keys %q at release %d, want %q at %d", got, ch.Release, want, r.Number)
	}

	// Two releases while the callback is busy with a third: it then sees
	// both at once, from what it last saw (a changed and changed back: no
	// change; e came and went).
	holding.Store(true)
	set("e", "1")
	select {
	case <-blocked:
	case <-time.After(wait.Bound(5 * time.Second)):
		t.Fatal("no callback for e within 5s")
	}
	set("a", "3", "e", "-")
	r = set("c", "2", "a", "2")
	wait.Within(t, 5*time.Second, "the subscription to get the last release", func() bool { return sub.Snapshot().Release("app") == r.Number })
	close(hold)
	if got, want := describe(next("the release it was busy with")), "e:nil>1"; got != want {
		t.Fatalf("the release it was busy with: keys %q, want %q", got, want)
	}
	ch = next("the releases made while it was busy")
	if got, want := describe(ch), "c:1>2 e:1>nil"; got != want || ch.Release != r.Number {
		t.Fatalf("after the releases made while it was busy: keys %q at release %d, want %q at %d", got, ch.Release, want, r.Number)
	}
}

// TestSubscribersSurviveAMemberStopping: the same as
// TestSubscribersSurviveRestartDuringStorm, across a stopped member of a
// three-member cluster (the one the subscribers use first).
func TestSubscribersSurviveAMemberStopping(t *testing.T) {
	t.Parallel()
	ds := daemontest.Cluster(t, 3)
	endpoints := daemontest.GRPCAddrs(ds)
	ctx := t.Context()
	writer := newClient(t, endpoints...)
	stop := make(chan struct{})
	s := runStorm(ctx, writer, "storm", stop)
	// Each subscriber knows every member and connects to one of them at
	// random (the SDK shuffles its endpoints), so the stopped member
	// serves at least one subscriber in about 70% of runs; the others
	// check that a member's stop is invisible to those it did not serve.
	subs, polls := subscribeToStorm(t, s, newClient(t, endpoints...), newClient(t, endpoints...), newClient(t, endpoints...))
	wait.Within(t, 10*time.Second, "releases", func() bool { return s.lastRelease() > 20 })
	if err := ds[0].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := s.lastRelease()
	wait.Within(t, 20*time.Second, "releases after the stop", func() bool { return s.lastRelease() > before+20 })
	stopAndConverge(t, writer, s, stop, subs, polls)
}
