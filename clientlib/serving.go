package clientlib

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// A client given several endpoints watches the health of the member it
// uses (the gRPC health service's overall status, on the client's own
// connection: the member pushes each change). A member says NOT_SERVING
// while it cannot commit: no etcd leader, or cut off from its peers while
// its clients still reach it (see the daemon's leader watch). When it has
// said so for notServingFor, the client leaves it (see avoid) until a probe
// finds it SERVING again: new calls, the keep-alive stream and streams that
// reopen (config subscriptions, observations) go to another member, and
// calls waiting there (acquires, campaigns, barrier entries) are ended by
// the member itself with Unavailable, which the SDK retries where it now
// is, under the same request ids.
//
// Without this, a client that renews no session through the member (a
// subscriber only) or whose renewals still get through (a member that
// hears its peers but is not heard) would stay on a member that cannot
// commit for as long as the cut lasts.
const (
	// notServingFor is how long a member must keep saying NOT_SERVING
	// before the client leaves it: an etcd election makes every member say
	// so for about an election timeout, and leaving then would only move
	// every client's streams for nothing.
	notServingFor = 500 * time.Millisecond
	// servingWatchRetry paces the watch's reopening after it fails.
	servingWatchRetry = 100 * time.Millisecond
)

// followServing owns the client's watch of its member's health; it runs
// until the client closes.
func (c *Client) followServing() {
	defer c.probes.Done()
	for {
		if addr, ok := c.watchServing(); ok {
			if c.sleep(notServingFor) {
				return
			}
			if c.stillNotServing(addr) {
				c.avoidFor(addr, false, whyNotServing)
			}
			continue
		}
		if c.sleep(servingWatchRetry) {
			return
		}
	}
}

// watchServing watches the overall health of the member the client uses
// until the member says it does not serve (its endpoint, true), the client
// moves, or the watch fails (false).
func (c *Client) watchServing() (string, bool) {
	ctx, cancel := context.WithCancel(c.movedContext())
	defer cancel()
	st, err := healthpb.NewHealthClient(c.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return "", false
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return "", false
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			continue
		}
		if p, ok := peer.FromContext(st.Context()); ok && p.Addr != nil {
			return p.Addr.String(), true
		}
	}
}

// stillNotServing asks again, on the client's connection, and reports
// whether the member at addr still says NOT_SERVING.
func (c *Client) stillNotServing(addr string) bool {
	ctx, cancel := context.WithTimeout(c.ctx, probeTimeout)
	defer cancel()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false), grpc.Peer(&p))
	if p.Addr == nil || p.Addr.String() != addr {
		return false // the client moved meanwhile
	}
	return status.Code(err) == codes.OK && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
}
