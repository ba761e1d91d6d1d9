package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"go.etcd.io/etcd/client/pkg/v3/types"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// cutPeers cuts member i off from every other member, in both directions,
// while its clients still reach it: raft's messages between them are
// dropped on both sides (etcd's own test hook), as a switch port or a
// security group between the members would. mendPeers undoes it.
func cutPeers(ds []*daemon.Daemon, i int) {
	forPeers(ds, i, func(d *daemon.Daemon, peer types.ID) { d.Etcd().Server.CutPeer(peer) })
}

func mendPeers(ds []*daemon.Daemon, i int) {
	forPeers(ds, i, func(d *daemon.Daemon, peer types.ID) { d.Etcd().Server.MendPeer(peer) })
}

func forPeers(ds []*daemon.Daemon, i int, f func(d *daemon.Daemon, peer types.ID)) {
	self := ds[i].Etcd().Server.MemberID()
	for j, d := range ds {
		if j == i {
			continue
		}
		f(ds[i], d.Etcd().Server.MemberID())
		f(d, self)
	}
}

// A member cut off from its peers while its clients still reach it (a
// gray failure: alive, answering, unable to commit) must not keep its
// clients' waiting calls: it says NOT_SERVING and ends them (UNAVAILABLE),
// and the SDK retries them on a member that can commit, where each retry
// takes its first attempt's entry over. Two shapes of the cut:
//
//   - the member's peer port frozen (a switch port or a security group on
//     that port): raft's streams run over connections the receiver dialed,
//     so the member still hears its peers, follows the new leader they
//     elect and reports it, while nothing it sends arrives. Without the
//     read probe (see leaderWatch) it says SERVING for the whole cut and
//     its waiters wait for etcd's request timeouts, or for the heal;
//   - raft cut both ways (etcd's own CutPeer hook): the member hears
//     nothing, steps down or loses its leader.
//
// Under way on the cut member: a lock waiter, an election candidate, a
// barrier participant and a config subscription, each of whose clients
// uses that member. The holder, the leader and the last participant act
// after the cut (through whichever member answers); every waiting call
// must then be answered while the cut lasts. How long it took is logged;
// the bound (TTL + 1 s) is the fault matrix's (make chaos), not a test's.
func TestWaitingCallsLeaveAMemberCutFromItsPeers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		leader bool // cut the etcd leader's member, else a follower's
		frozen bool // freeze its peer port, else cut raft both ways
	}{
		{"etcd leader's member, its peer port frozen", true, true},
		{"a follower's member, its peer port frozen", false, true},
		{"etcd leader's member, raft cut both ways", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testCutFromPeers(t, tc.leader, tc.frozen)
		})
	}
}

func testCutFromPeers(t *testing.T, leader, frozen bool) {
	var peers []*tcpproxy.Proxy
	ds := startCluster(t, 3, peerProxies(t, &peers))
	proxies, endpoints := grpcProxies(t, ds)
	cut := etcdLeader(t, ds)
	if !leader {
		cut = (cut + 1) % len(ds)
	}
	ctx := t.Context()
	on := func() *clientlib.Client { return clientOn(t, proxies, endpoints, cut) }
	// The sessions must outlive the client's move off the cut member:
	// their TTL stretches with the machine. On a loaded one, 3 s was
	// sometimes shorter than noticing the cut and renewing elsewhere, and
	// beside stress-ng under -race (6 s) a waiter's member went 6.4 s with
	// no log line of any member in the process, then its session had
	// expired. Nothing here waits for a TTL, so a long one costs nothing.
	session := func(c *clientlib.Client) *clientlib.Session {
		s, err := c.NewSession(ctx, clientlib.WithTTL(wait.Bound(10*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeBounded(s) })
		return s
	}
	holder, waiter := session(on()), session(on())
	held, err := holder.Lock(ctx, "gray/lock")
	if err != nil {
		t.Fatal(err)
	}
	leading, err := holder.Campaign(ctx, "gray/election", "first")
	if err != nil {
		t.Fatal(err)
	}
	sub := on()
	config := sub.ConfigCenter()
	if _, err := config.Put(ctx, "gray/ns", "k", "before", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	subscription, err := config.Subscribe(ctx, []string{"gray/ns"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(subscription.Close)

	// The waits, all on the member about to be cut off.
	answered := make(chan string, 3)
	var granted *clientlib.Lock
	var elected *clientlib.Leadership
	go func() {
		l, err := waiter.Lock(ctx, "gray/lock")
		granted = l
		answered <- fmt.Sprintf("lock waiter: %v", err)
	}()
	go func() {
		l, err := waiter.Campaign(ctx, "gray/election", "second")
		elected = l
		answered <- fmt.Sprintf("election candidate: %v", err)
	}()
	go func() {
		_, err := waiter.EnterBarrier(ctx, "gray/barrier", 2)
		answered <- fmt.Sprintf("barrier participant: %v", err)
	}()
	admin := sub.Admin()
	wait.Within(t, time.Minute, "the three waits to be under way", func() bool {
		l, err := admin.DescribeLock(ctx, "gray/lock")
		if err != nil || len(l.Waiters) != 1 {
			return false
		}
		r := call(t, "GET", "http://"+ds[(cut+1)%3].HTTPAddr()+"/v1/elections:candidates?name=gray/election", "")
		if c, _ := r.body["candidates"].([]any); len(c) != 1 { // the leader is not listed
			return false
		}
		b, err := admin.DescribeBarrier(ctx, "gray/barrier")
		return err == nil && len(b.Participants) == 1
	})

	if frozen {
		peers[cut].Freeze()
		defer peers[cut].Thaw()
	} else {
		cutPeers(ds, cut)
		defer mendPeers(ds, cut)
	}
	cutAt := time.Now()
	wait.Within(t, time.Minute, "the cut-off member to say NOT_SERVING", func() bool {
		return healthOf(t, ds[cut]) == healthpb.HealthCheckResponse_NOT_SERVING
	})
	t.Logf("member %d says NOT_SERVING %s after the cut", cut, time.Since(cutAt).Round(time.Millisecond))

	// The holder, the leader and a second participant act through
	// whichever member answers; a client of the majority publishes.
	majority := newClient(t, endpoints[(cut+1)%3], endpoints[(cut+2)%3])
	retrying(t, "the holder's release", func(ctx context.Context) error { return held.Release(ctx) })
	retrying(t, "the leader's resignation", func(ctx context.Context) error { return leading.Resign(ctx) })
	other := session(majority)
	go func() {
		_, err := other.EnterBarrier(ctx, "gray/barrier", 2)
		answered <- fmt.Sprintf("second participant: %v", err)
	}()
	if _, err := majority.ConfigCenter().Put(ctx, "gray/ns", "k", "during the cut", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	acted := time.Now()

	for range 4 {
		select {
		case a := <-answered:
			if !strings.HasSuffix(a, "<nil>") {
				t.Fatal(a)
			}
			t.Logf("%s %s after the cut", a, time.Since(cutAt).Round(time.Millisecond))
		case <-time.After(wait.Bound(time.Minute)):
			t.Fatalf("a wait not answered a minute after the holder, the leader and the last participant acted (the cut lasts)")
		}
	}
	if granted.Token() <= held.Token() || elected.Term() <= leading.Term() {
		t.Fatalf("lock token %d after %d, term %d after %d", granted.Token(), held.Token(), elected.Term(), leading.Term())
	}
	wait.Within(t, time.Minute, "the subscription to see the release made during the cut", func() bool {
		v, _ := subscription.Snapshot().Get("gray/ns", "k")
		return v == "during the cut"
	})
	t.Logf("all answered %s after acting, %s after the cut", time.Since(acted).Round(time.Millisecond), time.Since(cutAt).Round(time.Millisecond))

	if frozen {
		peers[cut].Thaw()
	} else {
		mendPeers(ds, cut)
	}
	wait.Within(t, time.Minute, "the healed member to say SERVING", func() bool {
		return healthOf(t, ds[cut]) == healthpb.HealthCheckResponse_SERVING
	})
}

// clientOn is a client of every endpoint that uses endpoints[i]: the
// others refuse connections while it connects, and it keeps to the member
// it connected to (AnyMember).
func clientOn(t *testing.T, proxies []*tcpproxy.Proxy, endpoints []string, i int) *clientlib.Client {
	t.Helper()
	for j, p := range proxies {
		if j != i {
			p.Down()
		}
	}
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: endpoints, AnyMember: true})
	for j, p := range proxies {
		if j != i {
			p.Up()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// retrying calls f, each try bounded by a second, until it succeeds.
func retrying(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	wait.Within(t, time.Minute, what, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Second))
		defer cancel()
		return f(ctx) == nil
	})
}
