package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// productionRaft is etcd's default raft timing (100 ms heartbeat, 1 s
// election timeout) instead of the tests' fast one, so that an etcd leader
// election takes as long as it does in production.
func productionRaft(cfg *daemon.Config) {
	cfg.HeartbeatMs = 100
	cfg.ElectionMs = 1000
}

// After the member that is the etcd leader crashes, and stays down, a new
// session and lock succeed within about one election: requests the
// survivors had forwarded to the dead leader end when they see the leader
// change (they used to wait 7 s for etcd's request timeout), and survivors
// the SDK left out during the election are used again as soon as they
// serve (they used to be left out for 10 s). Sessions of 4 s live through
// it.
//
// The crash (crashMember): the member's raft stops without handing
// leadership over and its peer and client links are reset and refuse new
// connections, as after kill -9.
func TestSDKFailsOverWhenTheLeaderMemberCrashes(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	var peers []*tcpproxy.Proxy
	ds := startCluster(t, 3, productionRaft, peerProxies(t, &peers))
	leader := etcdLeader(t, ds)
	proxies, endpoints := grpcProxies(t, ds)
	// Several clients, each on a member of its own choosing (the SDK
	// shuffles endpoints), each with a short-TTL session: their keep-alives
	// fail during the election. 4 s sessions have 2.9 s of room (TTL -
	// margin - renewal period) for an election that takes 1-2 s; make chaos
	// counts 3 s sessions (2.2 s of room) over 20 crashes.
	const clients = 6
	cs := make([]*clientlib.Client, clients)
	short := make([]*clientlib.Session, clients)
	for i := range cs {
		cs[i] = newClient(t, endpoints...)
		s, err := cs[i].NewSession(t.Context(), clientlib.WithTTL(4*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		short[i] = s
		t.Cleanup(func() { closeBounded(s) })
	}

	crashMember(ds[leader], peers[leader], proxies[leader])
	crash := time.Now()

	// Each client, at once: a new session and a lock on it. Measured from
	// the crash; the survivors elect a leader after 1–2 election timeouts.
	took := make([]time.Duration, clients)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(20*time.Second))
			defer cancel()
			s, err := newSessionRetrying(ctx, c)
			if err != nil {
				t.Errorf("client %d: NewSession after the crash: %v", i, err)
				return
			}
			defer func() { _ = s.Close(context.Background()) }()
			l, err := s.Lock(ctx, fmt.Sprintf("failover/%d", i))
			if err != nil {
				t.Errorf("client %d: Lock after the crash: %v", i, err)
				return
			}
			took[i] = time.Since(crash)
			_ = l.Release(ctx) // the session's close releases it anyway
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The 4 s sessions live through the election: their keep-alives fail
	// over and are answered before their local deadline (TTL - margin).
	for i, s := range short {
		if err := s.Err(); err != nil {
			t.Errorf("client %d: its 4 s session was lost in the leader change: %v", i, err)
		}
	}
	sort.Slice(took, func(a, b int) bool { return took[a] < took[b] })
	t.Logf("new session + lock after the etcd leader member crashed (election timeout 1s): %v", took)
	// Bound: the election (at most 2 election timeouts) plus a probe and a
	// retry, well below the 10 s for which the SDK used to leave the
	// survivors out.
	if worst := took[len(took)-1]; worst > 4*time.Second {
		t.Fatalf("slowest client took %s after the crash, want <= 4s", worst)
	}

	// With the crashed member still down, new work keeps flowing at once.
	for i, c := range cs {
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
		s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
		if err == nil {
			_, err = s.Lock(ctx, "failover/later")
			_ = s.Close(ctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("client %d, %s after the crash: %v", i, time.Since(crash).Round(time.Millisecond), err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("client %d: session and lock took %s with the crashed member down, want <= 1s", i, d)
		}
	}
}

// etcdLeader is the index of the member of ds that leads etcd.
func etcdLeader(t *testing.T, ds []*daemon.Daemon) int {
	t.Helper()
	for i, d := range ds {
		if d.Etcd().Server.Leader() == d.Etcd().Server.MemberID() {
			return i
		}
	}
	t.Fatal("no member is the etcd leader")
	return -1
}

// grpcProxies puts a proxy in front of each member's gRPC listener (so a
// test can cut clients off from a member) and returns them with their
// addresses, in member order.
func grpcProxies(t *testing.T, ds []*daemon.Daemon) ([]*tcpproxy.Proxy, []string) {
	proxies := make([]*tcpproxy.Proxy, len(ds))
	endpoints := make([]string, len(ds))
	for i, d := range ds {
		proxies[i] = tcpproxy.Start(t, d.GRPCAddr())
		endpoints[i] = proxies[i].Addr()
	}
	return proxies, endpoints
}

// newSessionRetrying retries NewSession while coordd is unavailable (etcd
// has no leader yet), as a program would: the SDK does not retry it by
// itself, because a create that may have reached the server is
// indeterminate.
func newSessionRetrying(ctx context.Context, c *clientlib.Client) (*clientlib.Session, error) {
	for {
		s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
		if !errors.Is(err, clientlib.ErrUnavailable) {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// healthOf is d's gRPC health status.
func healthOf(t *testing.T, d *daemon.Daemon) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn := dialRaw(t, d.GRPCAddr())
	resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.GetStatus()
}

// closeBounded closes a session at the end of a test, giving up after 5s:
// by then members may have stopped (Close retries while coordd is
// unavailable), and the session's TTL ends it anyway.
func closeBounded(s *clientlib.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), wait.Bound(5*time.Second))
	defer cancel()
	_ = s.Close(ctx)
}

// peerProxies is a startCluster option that puts each member's peer
// traffic behind a proxy (the member advertises the proxy's address), so a
// test can cut a member off from its peers as a crash would. The proxies
// are appended to *ps in member order.
func peerProxies(t *testing.T, ps *[]*tcpproxy.Proxy) func(*daemon.Config) {
	return func(cfg *daemon.Config) {
		p := tcpproxy.Start(t, strings.TrimPrefix(cfg.ListenPeerURLs[0], "http://"))
		cfg.AdvertisePeerURLs = []string{"http://" + p.Addr()}
		*ps = append(*ps, p)
	}
}

// crashMember stops d's etcd member as kill -9 would, as far as its peers
// and clients can tell: raft stops without handing leadership over, its
// peer links are reset and refuse new connections (a member whose raft
// stopped but whose peer listener still served would go on renewing leases
// for the others, which a killed process does not), and so are its client
// links. The daemon itself stays up, cut off; Stop it before restarting.
func crashMember(d *daemon.Daemon, peer, client *tcpproxy.Proxy) {
	peer.Down()
	client.Down()
	d.Etcd().Server.HardStop()
}

// A session the SDK gave up on during an etcd outage (no quorum anywhere)
// is closed on the server as soon as a member answers again, so its lock
// goes to the next waiter at once. Without that, the lock would wait for a
// holder that is gone: etcd gives every lease its whole TTL again when a
// leader is elected after the outage.
func TestGivenUpSessionIsClosedWhenQuorumReturns(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	const ttl = 5 * time.Second
	var peers []*tcpproxy.Proxy
	ds := startCluster(t, 3, peerProxies(t, &peers))
	endpoints := grpcAddrs(ds)
	ctx := t.Context()
	holder, waiter := newClient(t, endpoints...), newClient(t, endpoints...)
	hs, err := holder.NewSession(ctx, clientlib.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer closeBounded(hs)
	if _, err := hs.Lock(ctx, "given-up"); err != nil {
		t.Fatal(err)
	}
	ws, err := waiter.NewSession(ctx, clientlib.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer closeBounded(ws)
	granted := make(chan error, 1)
	var grantedAt time.Time
	go func() {
		_, err := ws.Lock(ctx, "given-up") // retried through the outage
		grantedAt = time.Now()
		granted <- err
	}()
	wait.Within(t, 10*time.Second, "the waiter to queue", func() bool {
		d, err := waiter.Admin().DescribeLock(ctx, "given-up")
		return err == nil && len(d.Waiters) == 1
	})

	for _, p := range peers {
		p.Down()
	}
	wait.Within(t, 2*ttl, "the SDK to give the holder's session up", func() bool { return hs.Err() != nil })
	if !errors.Is(hs.Err(), clientlib.ErrSessionExpired) {
		t.Fatalf("holder's session ended with %v, want ErrSessionExpired", hs.Err())
	}
	healed := time.Now()
	for _, p := range peers {
		p.Up()
	}
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		took := grantedAt.Sub(healed)
		t.Logf("waiter granted %s after quorum returned (session TTL %s)", took.Round(time.Millisecond), ttl)
		if took >= ttl-time.Second {
			t.Fatalf("waiter granted %s after quorum returned: the given-up session was left to expire (TTL %s)", took.Round(time.Millisecond), ttl)
		}
	case <-time.After(wait.Bound(3 * ttl)):
		t.Fatal("waiter never granted")
	}
}

// A member that stops answering altogether (paused, cut off) is left at
// once: a keep-alive unanswered for 200ms is followed by a health check on
// the same connection, and when that goes unanswered too, the client moves
// to another endpoint and ends the calls it had in flight there with
// ErrUnavailable instead of letting them wait for the member. Here a fenced
// write is sent to a member already cut off; it must end well before its
// own 10s deadline (without the check, it waits for it), and the session
// goes on through the other endpoint.
func TestCallsOnASilentMemberEndWhenTheClientLeaves(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	d := start(t, testConfig(t))
	a, b := tcpproxy.Start(t, d.GRPCAddr()), tcpproxy.Start(t, d.GRPCAddr())
	c := newClient(t, a.Addr(), b.Addr())
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(t.Context(), "silent")
	if err != nil {
		t.Fatal(err)
	}
	using, other := a, b
	if b.Active() > 0 && a.Active() == 0 {
		using, other = b, a
	}
	using.Freeze()
	frozenAt := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
	defer cancel()
	_, err = l.Put(ctx, "silent/key", []byte("v"))
	took := time.Since(frozenAt)
	if !errors.Is(err, clientlib.ErrUnavailable) || !strings.Contains(err.Error(), "outcome is unknown") {
		t.Fatalf("fenced write to a silent member after %s: %v, want ErrUnavailable with an unknown outcome", took, err)
	}
	// One keep-alive interval (at most 0.55s for a 3s TTL), the suspicion
	// (0.2s) and the health check (0.3s), with room for a busy machine;
	// the keep-alive's own wait would end it no sooner than 1s after it
	// was sent, and would leave the write waiting.
	if took > wait.Bound(2*time.Second) {
		t.Fatalf("the fenced write ended %s after the member went silent, want < %s", took, wait.Bound(2*time.Second))
	}
	// The only way left is the other endpoint.
	if _, err := l.Put(t.Context(), "silent/key", []byte("v2")); err != nil || other.Active() == 0 {
		t.Fatalf("fenced write through the other endpoint: %v (connections through it: %d)", err, other.Active())
	}
	if s.Err() != nil {
		t.Fatalf("session lost: %v", s.Err())
	}
	t.Logf("left the silent member and ended the write in flight after %s", took.Round(time.Millisecond))
	using.Thaw()
}
