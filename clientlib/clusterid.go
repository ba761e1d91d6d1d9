package clientlib

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// clusterHeader is the header with which a member names its cluster in
// every answer (api.ClusterHeader): a random id each cluster keeps.
const clusterHeader = "coordd-cluster"

// clusters remembers the cluster the client's endpoints answered for. A
// client whose endpoints answer for two clusters refuses every call from
// then on: it would take a lock on one cluster while another client, or
// its own next call, takes it on the other.
type clusters struct {
	mu    sync.Mutex
	id    string // the first cluster an endpoint named
	from  string // that endpoint
	mixed error  // set once another endpoint named another cluster
}

// note records that endpoint answered with md; it returns the refusal
// once two clusters were seen. An answer without the header (a server
// before it) is no evidence either way.
func (cs *clusters) note(endpoint string, md metadata.MD) error {
	v := md.Get(clusterHeader)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	switch {
	case cs.mixed != nil || len(v) == 0 || v[0] == "":
	case cs.id == "":
		cs.id, cs.from = v[0], endpoint
	case v[0] != cs.id:
		cs.mixed = fmt.Errorf("%w: Config.Endpoints name members of two clusters: %s answers for cluster %s, %s for cluster %s; give a client the endpoints of one cluster",
			ErrInvalidArgument, cs.from, cs.id, endpoint, v[0])
	}
	return cs.mixed
}

func (cs *clusters) err() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.mixed
}

// checkCluster is the connection's innermost unary interceptor: it notes
// the cluster each answer comes from, and refuses the call once the
// endpoints answered for two (the call's own answer too: it may have
// acted on the wrong cluster).
func (c *Client) checkCluster(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := c.clusters.err(); err != nil {
		return err
	}
	var md metadata.MD
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&md), grpc.Peer(&p))...)
	if p.Addr != nil {
		if merr := c.clusters.note(p.Addr.String(), md); merr != nil {
			return merr
		}
	}
	return err
}

// checkClusterStream is the connection's stream interceptor: a stream is
// refused once the endpoints answered for two clusters, and notes its
// member's cluster with its first message.
func (c *Client) checkClusterStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := c.clusters.err(); err != nil {
		return nil, err
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &clusterStream{ClientStream: cs, c: c}, nil
}

// clusterStream notes its member's cluster when its first message comes
// (its header has come by then, so reading it does not wait).
type clusterStream struct {
	grpc.ClientStream
	c       *Client
	checked atomic.Bool
}

func (s *clusterStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || s.checked.Swap(true) {
		return err
	}
	md, herr := s.Header()
	if p, ok := peer.FromContext(s.Context()); ok && herr == nil && p.Addr != nil {
		if merr := s.c.clusters.note(p.Addr.String(), md); merr != nil {
			return merr
		}
	}
	return nil
}

// checkEndpoints asks every endpoint, at once, which cluster it belongs
// to, and returns the refusal if they named two; endpoints that have not
// answered within wait are left to later answers (a member that is down
// does not hold New up).
func (c *Client) checkEndpoints(wait time.Duration) error {
	done := make(chan struct{})
	var asked sync.WaitGroup
	for _, ep := range c.endpoints {
		c.probes.Add(1)
		asked.Go(func() {
			defer c.probes.Done()
			c.askHealth(ep, "")
		})
	}
	c.probes.Add(1)
	go func() { // ends with the last answer (each within probeTimeout)
		defer c.probes.Done()
		asked.Wait()
		close(done)
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return c.clusters.err()
}
