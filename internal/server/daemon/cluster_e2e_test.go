package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/pkg/v3/featuregate"
	"go.etcd.io/etcd/server/v3/features"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/daemontest"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
	"github.com/coordd/coordd/internal/verify"
)

// Session expiry: with keep-alives black-holed, Done closes no later than
// the local deadline, and the server drops the session only after its TTL.
func TestSessionExpiry(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	proxy := tcpproxy.Start(t, d.GRPCAddr())
	c := newClient(t, proxy.Addr())
	direct := newClient(t, d.GRPCAddr())

	s, err := c.NewSession(t.Context(), clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Wait for one acknowledged keep-alive, then cut the network.
	first := s.Deadline()
	wait.Within(t, 5*time.Second, "a first keep-alive", func() bool { return s.Deadline().After(first) })
	proxy.Freeze()
	frozenAt := time.Now()

	var lastAckSent time.Time
	select {
	case <-s.Done():
		deadline := s.Deadline()
		// The watchdog fires at the deadline; a busy machine may run it a
		// little late (175 ms once, beside the whole suite), but what is
		// safe is that it fires before the server can end the session: at
		// most the margin after the deadline.
		if late := time.Since(deadline); late > margin(s.TTL()) {
			t.Fatalf("Done closed %s after the local deadline, past the margin %s", late, margin(s.TTL()))
		}
		// The last acknowledged keep-alive was sent before the cut, so the
		// deadline must fall at least the margin before cut + TTL.
		if latest := frozenAt.Add(s.TTL() - margin(s.TTL())); deadline.After(latest) {
			t.Fatalf("local deadline %s after cut+TTL-margin: the safety margin is missing", deadline.Sub(latest))
		}
		lastAckSent = deadline.Add(-s.TTL() + margin(s.TTL()))
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("Done not closed 10s after the network was cut")
	}
	if !errors.Is(s.Err(), clientlib.ErrSessionExpired) {
		t.Fatalf("Err = %v, want ErrSessionExpired", s.Err())
	}
	// The server must still have the session at the local deadline: that is
	// the whole point of the margin.
	if _, err := direct.Admin().GetSession(t.Context(), s.ID()); err != nil {
		t.Fatalf("server dropped the session before the SDK's local deadline: %v", err)
	}
	wait.Within(t, 10*time.Second, "the server to drop the session", func() bool {
		_, err := direct.Admin().GetSession(t.Context(), s.ID())
		return errors.Is(err, clientlib.ErrSessionNotFound)
	})
	if alive := time.Since(lastAckSent); alive < s.TTL() {
		t.Fatalf("server dropped the session %s after the last keep-alive was sent, before its %s TTL", alive, s.TTL())
	}
	t.Logf("network cut at +0; Done at local deadline; server dropped the session %s after the cut", time.Since(frozenAt).Round(time.Millisecond))
	proxy.Thaw()
}

// margin is the SDK's safety margin for a TTL (clientlib's doc):
// the local deadline falls this long before send time + TTL.
func margin(ttl time.Duration) time.Duration { return max(250*time.Millisecond, ttl/10) }

// startCluster starts an n-member cluster and stops it when the test ends.
func startCluster(t *testing.T, n int, opts ...func(*daemon.Config)) []*daemon.Daemon {
	return daemontest.Cluster(t, n, opts...)
}

// grpcAddrs are the members' gRPC addresses, in order.
func grpcAddrs(ds []*daemon.Daemon) []string { return daemontest.GRPCAddrs(ds) }

// clusterConfigs returns the configurations of an n-member cluster.
func clusterConfigs(t *testing.T, n int, opts ...func(*daemon.Config)) []daemon.Config {
	return daemontest.ClusterConfigs(t, n, opts...)
}

// startConfigs starts the members of a cluster at once and stops them
// when the test ends.
func startConfigs(t *testing.T, cfgs []daemon.Config) []*daemon.Daemon {
	return daemontest.StartAll(t, cfgs)
}

// Three members: a session kept alive through one member survives that
// member failing, because the SDK renews through another member before its
// local deadline. The member either stops (its connections close) or is
// partitioned (it stops answering, connections stay open).
func TestThreeMemberFailover(t *testing.T) {
	// Not parallel: it bounds how long a fail-over takes (sessions of 5-6 s
	// must survive it), which tests running beside it stretched past the
	// TTL in a run of three packages at twice each.
	faults := []struct {
		name  string
		fault func(t *testing.T, d *daemon.Daemon, p *tcpproxy.Proxy)
	}{
		{"member stops", func(t *testing.T, d *daemon.Daemon, _ *tcpproxy.Proxy) {
			if err := d.Stop(context.Background()); err != nil {
				t.Fatalf("stopping the member: %v", err)
			}
		}},
		{"member partitioned", func(_ *testing.T, _ *daemon.Daemon, p *tcpproxy.Proxy) { p.Freeze() }},
	}
	for _, tt := range faults {
		t.Run(tt.name, func(t *testing.T) {
			ds := startCluster(t, 3)
			proxies := make([]*tcpproxy.Proxy, len(ds))
			var endpoints []string
			for i, d := range ds {
				proxies[i] = tcpproxy.Start(t, d.GRPCAddr())
				endpoints = append(endpoints, proxies[i].Addr())
			}
			c := newClient(t, endpoints...)
			s, err := c.NewSession(t.Context(), clientlib.WithTTL(6*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			victim := -1
			for i, p := range proxies {
				if p.Active() > 0 {
					victim = i
				}
			}
			if victim < 0 {
				t.Fatal("the client has no connection through any proxy")
			}
			tt.fault(t, ds[victim], proxies[victim])
			faultAt := time.Now()
			// A keep-alive sent after the fault and acknowledged proves the
			// failover.
			wait.Within(t, 15*time.Second, "a keep-alive through another member", func() bool {
				select {
				case <-s.Done():
					t.Fatalf("session lost after member %d failed: %v", victim, s.Err())
				default:
				}
				return s.Deadline().After(faultAt.Add(s.TTL() - margin(s.TTL())))
			})
			t.Logf("failed over from member %d within %s", victim, time.Since(faultAt).Round(time.Millisecond))
			if _, err := c.Admin().GetSession(t.Context(), s.ID()); err != nil {
				t.Fatalf("GetSession after failover: %v", err)
			}
			proxies[victim].Thaw()
			if err := s.Close(t.Context()); err != nil {
				t.Fatalf("Close after failover: %v", err)
			}
		})
	}
}

// Lease checkpointing is on in the running member. etcd 3.7's embed package
// fixes the checkpoint interval at 5 minutes, so a behavioural test (age a
// session past a checkpoint, move the etcd leader, see the remaining TTL
// kept) would take over 5 minutes; this checks the switch instead.
func TestLeaseCheckpointingEnabled(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	gates := d.Etcd().Server.Cfg.ServerFeatureGate
	for _, f := range []featuregate.Feature{features.LeaseCheckpoint, features.LeaseCheckpointPersist} {
		if !gates.Enabled(f) {
			t.Errorf("etcd feature gate %s is off", f)
		}
	}
}

// External etcd: coordd as a stateless API layer over a separately started
// etcd, with two daemons sharing it.
func TestExternalEtcd(t *testing.T) {
	t.Parallel()
	m := etcdtest.Start(t)
	var ds []*daemon.Daemon
	for range 2 {
		cfg := testConfig(t)
		cfg.EtcdEndpoints = []string{m.ClientURL}
		ds = append(ds, start(t, cfg))
	}
	if ds[0].Etcd() != nil {
		t.Fatal("daemon embedded etcd despite EtcdEndpoints")
	}
	a, b := newClient(t, ds[0].GRPCAddr()), newClient(t, ds[1].GRPCAddr())
	s, err := a.NewSession(t.Context(), clientlib.WithTTL(5*time.Second), clientlib.WithOwner("ext"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Admin().GetSession(t.Context(), s.ID())
	if err != nil || info.Owner != "ext" {
		t.Fatalf("session created through one daemon, read through the other: %+v, %v", info, err)
	}
	resp, err := m.Client(t).Get(t.Context(), "/coordd/session/"+s.ID())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("session metadata not in the external etcd: %v, %v", resp, err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Three members: stop the etcd leader's member while clients contend for
// one lock through the others. Safety holds throughout: no two holders
// overlap, and the guard never sees a token out of order.
func TestLockSafetyWhenTheLeaderStops(t *testing.T) {
	// Not parallel: it bounds how long a fail-over takes (sessions of 5-6 s
	// must survive it), which tests running beside it stretched past the
	// TTL in a run of three packages at twice each.
	ds := startCluster(t, 3)
	var leader int
	for i, d := range ds {
		if d.Etcd().Server.Leader() == d.Etcd().Server.MemberID() {
			leader = i
		}
	}
	var endpoints []string
	for i, d := range ds {
		if i != leader {
			endpoints = append(endpoints, d.GRPCAddr())
		}
	}
	const clients = 4
	var (
		guard            fencing.Guard
		inside, overlaps atomic.Int32
		grants           atomic.Int32
		stale            atomic.Int32
		wg               sync.WaitGroup
	)
	ctx, stop := context.WithCancel(t.Context())
	for i := range clients {
		c := newClient(t, endpoints...)
		// A busy machine may move etcd's leadership under the first call:
		// that is refused as unavailable, and a user tries again.
		var s *clientlib.Session
		wait.Within(t, 10*time.Second, "a session", func() bool {
			var err error
			if s, err = c.NewSession(t.Context(), clientlib.WithTTL(5*time.Second)); err != nil && !errors.Is(err, clientlib.ErrUnavailable) {
				t.Fatal(err)
			}
			return err == nil
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := clientlib.RunLocked(ctx, s, "contended", func(_ context.Context, l *clientlib.Lock) error {
					token := l.Token()
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					defer inside.Add(-1)
					grants.Add(1)
					if err := guard.Check("contended", token); err != nil {
						stale.Add(1)
					}
					return nil
				})
				if err != nil && ctx.Err() == nil && !errors.Is(err, clientlib.ErrUnavailable) {
					t.Logf("client %d: %v (retrying)", i, err)
				}
			}
		}()
	}
	wait.Within(t, 10*time.Second, "contention to start", func() bool { return grants.Load() > 20 })
	before := grants.Load()
	if err := ds[leader].Stop(context.Background()); err != nil {
		t.Fatalf("stopping the leader's member: %v", err)
	}
	wait.Within(t, 20*time.Second, "grants to continue under the new leader", func() bool { return grants.Load() > before+20 })
	stop()
	wg.Wait()
	if overlaps.Load() != 0 || stale.Load() != 0 {
		t.Fatalf("%d overlapping holders, %d tokens out of order, in %d grants", overlaps.Load(), stale.Load(), grants.Load())
	}
	t.Logf("%d grants, %d before the leader stopped; no overlap, tokens in order", grants.Load(), before)
}

// A member cut off from its peers (here: the other two stopped) says so in
// its gRPC health (NOT_SERVING), and must not leave lock waiters hanging on it: they fail with Unavailable within a few
// election timeouts, so clients retry elsewhere. The embedded etcd's
// in-process client skips etcd's own require-leader check, so the daemon
// watches for leader loss itself.
func TestWaitersFailWhenTheMemberLosesQuorum(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	survivor := ds[2]
	// A new cluster's member serves once its quorum probe has confirmed a
	// read through its leader: a moment on a loaded machine.
	wait.For(t, "a member of a new cluster to serve", func() bool {
		return healthOf(t, survivor) == healthpb.HealthCheckResponse_SERVING
	})
	base := "http://" + survivor.HTTPAddr()
	newSession := func() string {
		r := call(t, "POST", base+"/v1/sessions", `{"ttl":"60s"}`)
		if r.status != 200 {
			t.Fatalf("create session = %d %v", r.status, r.body)
		}
		return r.body["session"].(map[string]any)["id"].(string)
	}
	holder, waiter := newSession(), newSession()
	// 503 is the API's "retry": etcd's leadership may still settle on a
	// new three-member cluster on a loaded machine. The request id makes a
	// retry resume the same acquisition if the refused one took effect.
	wait.Within(t, 10*time.Second, "the holder's acquire", func() bool {
		r := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"q","sessionId":%q,"requestId":"holder-1"}`, holder))
		if r.status != 200 && r.status != 503 {
			t.Fatalf("acquire = %d %v", r.status, r.body)
		}
		return r.status == 200
	})
	done := make(chan int, 1)
	var queued atomic.Bool
	go func() {
		// Not call(): it may not Fatal outside the test goroutine. An
		// acquire refused before it queued (UNAVAILABLE while etcd's
		// leadership settles on a loaded machine) is tried again.
		hc := &http.Client{Timeout: time.Minute}
		for {
			resp, err := hc.Post(base+"/v1/locks:acquire", "application/json",
				strings.NewReader(fmt.Sprintf(`{"name":"q","sessionId":%q,"wait":"60s"}`, waiter)))
			if err != nil {
				done <- 0
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && !queued.Load() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			done <- resp.StatusCode
			return
		}
	}()
	wait.Within(t, 10*time.Second, "the waiter to queue", func() bool {
		r := call(t, "GET", base+"/v1/locks/q", "")
		w, _ := r.body["waiters"].([]any)
		return len(w) == 1
	})
	queued.Store(true)
	for _, d := range ds[:2] {
		if err := d.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	lost := time.Now()
	select {
	case status := <-done:
		if status != http.StatusServiceUnavailable {
			t.Fatalf("waiter on a member without quorum = %d, want 503", status)
		}
		t.Logf("waiter failed %s after the member lost quorum", time.Since(lost).Round(time.Millisecond))
	case <-time.After(wait.Bound(15 * time.Second)):
		t.Fatal("waiter still hanging 15s after its member lost quorum")
	}
	// Its gRPC health says so (clients probe it before using the member
	// again); health calls are not refused for the missing leader.
	if st := healthOf(t, survivor); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health of a member without quorum = %s, want NOT_SERVING", st)
	}
	// Stopping a member without quorum must not hang on clean-ups that
	// cannot reach etcd.
	stopStart := time.Now()
	if err := survivor.Stop(context.Background()); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if took := time.Since(stopStart); took > wait.Bound(10*time.Second) {
		t.Errorf("stopping the member without quorum took %s", took)
	}
}

// coordctl verify's check (clientlib/verify) passes across the stop of the
// member that leads etcd in the middle of the run, and its report shows
// the fail-over as the longest gap between grants.
func TestVerifyPassesAcrossTheLeadersStop(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	leader := etcdLeader(t, ds)
	c := newClient(t, grpcAddrs(ds)...)
	type result struct {
		rep verify.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The run lasts longer on a slower machine (wait.Bound): it must
		// make enough grants to say anything.
		rep, err := verify.Run(t.Context(), c, verify.Options{Duration: wait.Bound(6 * time.Second), TTL: 3 * time.Second})
		done <- result{rep, err}
	}()
	// Stop the leader's member once the run has made grants.
	// (Its fenced writes: the probe before the run takes the lock too.)
	wait.Within(t, 10*time.Second, "verify's first fenced writes", func() bool {
		page, err := c.KV().List(t.Context(), "coordd-verify/", clientlib.ListOptions{KeysOnly: true})
		return err == nil && len(page.KVs) > 0
	})
	if err := ds[leader].Stop(context.Background()); err != nil {
		t.Fatalf("stopping the leader's member: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("across the leader's stop: lock %d grants, longest gap %s; election %d grants, longest gap %s; errors %v %v",
		r.rep.Lock.Grants, r.rep.Lock.LongestGap, r.rep.Election.Grants, r.rep.Election.LongestGap, r.rep.Lock.Errors, r.rep.Election.Errors)
	if !r.rep.Passed {
		t.Fatalf("verify failed across the leader's stop: %v", r.rep.Violations)
	}
	if r.rep.Lock.Grants < 10 || r.rep.Election.Grants < 10 {
		t.Errorf("too few grants to say anything: %+v", r.rep)
	}
}

// A client given the endpoints of two clusters refuses them: a lock it
// took on one would not exclude a holder on the other. Each cluster names
// itself in every answer (a random id it keeps in etcd, the same on all
// its members, and across restarts); New asks every endpoint and fails
// clearly. It fails when the members do not name their cluster.
func TestAClientRefusesEndpointsOfTwoClusters(t *testing.T) {
	t.Parallel()
	a, b := start(t, testConfig(t)), start(t, testConfig(t))
	_, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{a.GRPCAddr(), b.GRPCAddr()}})
	if !errors.Is(err, clientlib.ErrInvalidArgument) || !strings.Contains(err.Error(), "two clusters") {
		t.Fatalf("New with the endpoints of two clusters = %v; want ErrInvalidArgument naming two clusters", err)
	}
	t.Logf("refused: %v", err)
	// One cluster's members name the same one.
	ds := startCluster(t, 3)
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: grpcAddrs(ds)})
	if err != nil {
		t.Fatalf("New with the endpoints of one cluster: %v", err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Admin().ListSessions(t.Context()); err != nil {
		t.Fatalf("a call through one cluster's members: %v", err)
	}
}
