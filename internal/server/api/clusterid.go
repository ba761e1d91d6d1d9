package api

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ClusterHeader is the header with which every answer of a member names
// its cluster: a random id the cluster keeps in etcd, the same on every
// member. A client given the endpoints of two clusters sees two ids and
// refuses to go on (it would hold a lock on one cluster while another
// client holds it on the other).
const ClusterHeader = "coordd-cluster"

// ClusterIdentity adds ClusterHeader to every call's answer once Set has
// named the cluster. Its interceptors cost a header per call (a stream
// sends it once; HTTP/2's header compression makes a repeat about a byte).
type ClusterIdentity struct{ md atomic.Pointer[metadata.MD] }

// Set names the cluster.
func (c *ClusterIdentity) Set(id string) {
	md := metadata.Pairs(ClusterHeader, id)
	c.md.Store(&md)
}

// Unary is the unary interceptor.
func (c *ClusterIdentity) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if md := c.md.Load(); md != nil {
			_ = grpc.SetHeader(ctx, *md) // fails only once headers went out, which they have not
		}
		return handler(ctx, req)
	}
}

// Stream is the stream interceptor.
func (c *ClusterIdentity) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if md := c.md.Load(); md != nil {
			_ = ss.SetHeader(*md) // as above
		}
		return handler(srv, ss)
	}
}
