package clientlib

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A client given several endpoints keeps to the member whose etcd member
// leads (see Config.AnyMember). It watches the leader health status
// (coorddv1.LeaderHealthService) of the member it uses, on its own
// connection: the member pushes each change, so a client on the leading
// member costs nothing while the leadership stays. When the member says it
// does not lead, the client asks each other endpoint (one health check on
// a connection of its own) and moves to the one that leads.
//
// Guarantees: moving loses no call. A unary call in flight finishes on the
// member it went to; the call stream takes no new calls and closes once
// its calls are answered; the keep-alive stream is reopened on the new
// member at once (each session renews on it within a quarter of its
// interval, well inside its TTL). Non-guarantees: config watches and
// observations already open stay on their member until they end; while no
// member leads (an etcd election), the client stays where it is.
const (
	// leaderSearchFirst and leaderSearchEvery pace the search for the
	// leading member while none is found (an election under way, the
	// leader among the avoided endpoints): from 100ms, backing off to 2s.
	leaderSearchFirst = 100 * time.Millisecond
	leaderSearchEvery = 2 * time.Second
	// leaderUnknownWait is how long a client waits before asking again a
	// member that does not report which member leads (an external etcd, a
	// server older than the report).
	leaderUnknownWait = time.Minute
	// minRerouteGap spaces the client's moves: a leadership that flaps
	// moves each client at most once a second (a move reopens its
	// keep-alive stream, and every session renews on the new one).
	minRerouteGap = time.Second
)

// errRerouted ends the keep-alive stream when the client moves to the
// member that leads etcd: its sessions rejoin a new stream there at once.
var errRerouted = errors.New("coordd: the client moved to the member that leads etcd")

// followLeader owns the client's preference for the leading member; it
// runs until the client closes.
func (c *Client) followLeader() {
	defer c.probes.Done()
	wait := time.Duration(0)
	var moved time.Time // the last move
	for {
		if c.sleep(wait) {
			return
		}
		switch leads, addr, err := c.watchLeader(); {
		case c.ctx.Err() != nil:
			return
		case leads && status.Code(err) == codes.Canceled:
			wait = 0 // the client moved while on the leading member: watch where it is now
		case leads:
			wait = leaderSearchFirst // the stream broke while the member led: watch again, without spinning
		case status.Code(err) == codes.Unimplemented, errors.Is(err, errLeaderUnknown):
			wait = leaderUnknownWait
		case err != nil:
			wait = max(leaderSearchFirst, min(2*wait, leaderSearchEvery))
		default:
			if ep := c.findLeader(addr); ep != "" {
				if c.sleep(minRerouteGap - time.Since(moved)) {
					return
				}
				c.prefer(ep, addr)
				moved, wait = time.Now(), 0
				continue
			}
			wait = max(leaderSearchFirst, min(2*wait, leaderSearchEvery))
		}
	}
}

// errLeaderUnknown: the member does not report whether it leads.
var errLeaderUnknown = errors.New("coordd: the member does not report whether it leads etcd")

// watchLeader watches the leader status of the member the client uses. It
// returns leads=false with the member's endpoint as soon as the member says
// it does not lead; leads=true when the watch ends while it led (the client
// moved or avoided the member, or the stream broke); or an error.
func (c *Client) watchLeader() (leads bool, addr string, err error) {
	c.mu.Lock()
	moved, rerouted := c.moved, c.rerouted
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	stopMoved := context.AfterFunc(moved, cancel)
	defer stopMoved()
	stopRerouted := context.AfterFunc(rerouted, cancel)
	defer stopRerouted()
	st, err := healthpb.NewHealthClient(c.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: coorddv1.LeaderHealthService})
	if err != nil {
		return false, "", err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return leads, addr, err
		}
		if p, ok := peer.FromContext(st.Context()); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		switch resp.GetStatus() {
		case healthpb.HealthCheckResponse_SERVING:
			leads = true
		case healthpb.HealthCheckResponse_SERVICE_UNKNOWN:
			return false, addr, errLeaderUnknown
		default:
			return false, addr, nil
		}
	}
}

// findLeader asks every endpoint but current and the avoided ones whether
// its member leads, and returns the first that does ("" if none).
func (c *Client) findLeader(current string) string {
	c.mu.Lock()
	var ask []string
	for _, ep := range c.endpoints {
		if _, avoided := c.avoided[ep]; !avoided && ep != current {
			ask = append(ask, ep)
		}
	}
	c.mu.Unlock()
	for _, ep := range ask {
		if c.leads(ep) {
			return ep
		}
	}
	return ""
}

// leads asks endpoint, on a connection of its own, whether its member leads.
func (c *Client) leads(endpoint string) bool {
	st, ok := c.askHealth(endpoint, coorddv1.LeaderHealthService)
	return ok && st == healthpb.HealthCheckResponse_SERVING
}

// askHealth asks endpoint, on a connection of its own (at most
// probeTimeout), for the health status of service; false when it did not
// answer.
func (c *Client) askHealth(endpoint, service string) (healthpb.HealthCheckResponse_ServingStatus, bool) {
	conn, err := grpc.NewClient("passthrough:///"+endpoint, c.probeDial...)
	if err != nil {
		return 0, false
	}
	defer func() { _ = conn.Close() }() // a probe connection; nothing to report
	ctx, cancel := context.WithTimeout(c.ctx, probeTimeout)
	defer cancel()
	var md metadata.MD
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Header(&md))
	if err == nil {
		_ = c.clusters.note(endpoint, md) // a second cluster refuses every call from now on
	}
	return resp.GetStatus(), err == nil
}

// prefer moves the client from the endpoint it uses to endpoint, the
// member leading etcd: new calls go there once it is connected (they wait
// meanwhile), the call stream and the keep-alive stream follow, calls in
// flight finish where they are, watched by watchLeftBehind. The other
// endpoints stay behind it for fail-over.
func (c *Client) prefer(endpoint, from string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.lg.Info("coordd: moving to the member that leads etcd", "endpoint", endpoint)
	c.preferred = endpoint
	// pick_first keeps a connected endpoint that is still in the list, so
	// the first update leaves the others out; the second puts them back
	// behind the leader's while pick_first connects to it.
	c.resolver.UpdateState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{c.addrs[endpoint]}}}})
	c.updateAddressesLocked()
	c.reroutedEnded()
	c.rerouted, c.reroutedEnded = context.WithCancel(c.ctx)
	c.stats.moves.Add(1)
	left := c.silent
	c.silent = newCallGroup()
	c.probes.Add(1)
	c.mu.Unlock()
	go c.watchLeftBehind(from, left)
	c.keepAlives.reroute()
}

// leftBehindEvery paces the health checks of a member the client moved
// away from while calls are still in flight there.
const leftBehindEvery = 500 * time.Millisecond

// watchLeftBehind watches the member the client moved away from while
// calls sent there are in flight (a lock acquire waiting its turn may wait
// for minutes). The keep-alive stream, which notices a member that stops
// answering, moved with the client; without this, a member paused or cut
// off after the move would leave those calls waiting for their deadline.
// It asks the member, on a connection of its own, for a health check
// every leftBehindEvery; one unanswered within probeTimeout ends the calls
// as when the client leaves a silent member (see avoid): unary ones with
// ErrUnavailable or a retry, those on the call stream likewise. It returns
// once no call is left there, or the client closes.
func (c *Client) watchLeftBehind(endpoint string, left *callGroup) {
	defer c.probes.Done()
	if endpoint == "" {
		return
	}
	if c.sleep(leftBehindEvery) || left.inFlight.Load() == 0 {
		return
	}
	conn, err := grpc.NewClient("passthrough:///"+endpoint, c.probeDial...)
	if err != nil {
		return // cannot happen with a valid target
	}
	defer func() { _ = conn.Close() }() // a probe connection; nothing to report
	health := healthpb.NewHealthClient(conn)
	for {
		ctx, cancel := context.WithTimeout(c.ctx, probeTimeout)
		_, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if c.ctx.Err() == nil && status.Code(err) == codes.DeadlineExceeded {
			c.lg.Warn("coordd: the member the client moved away from stopped answering; its calls in flight end", "endpoint", endpoint)
			left.end()
			return
		}
		if c.sleep(leftBehindEvery) || left.inFlight.Load() == 0 {
			return
		}
	}
}
