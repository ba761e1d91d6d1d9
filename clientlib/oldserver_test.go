package clientlib_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// olderSessions speaks the keep-alive protocol of a server that predates
// batches of renewals (header empty): it never says it takes them, and
// renews the one session each request names; or, with header set, that of
// a server that takes batches of at most that many sessions. It counts
// what it is sent.
type olderSessions struct {
	coorddv1.UnimplementedSessionServiceServer
	header string

	next     atomic.Int64
	renewals atomic.Int64
	batches  atomic.Int64

	mu      sync.Mutex
	largest int // sessions in the largest batch
}

func (o *olderSessions) CreateSession(_ context.Context, req *coorddv1.CreateSessionRequest) (*coorddv1.CreateSessionResponse, error) {
	id := fmt.Sprintf("%016x", o.next.Add(1))
	return &coorddv1.CreateSessionResponse{Session: &coorddv1.Session{Id: id, Ttl: req.GetTtl()}}, nil
}

func (o *olderSessions) CloseSession(context.Context, *coorddv1.CloseSessionRequest) (*coorddv1.CloseSessionResponse, error) {
	return &coorddv1.CloseSessionResponse{}, nil
}

func (o *olderSessions) KeepAliveStream(st coorddv1.SessionService_KeepAliveStreamServer) error {
	if o.header != "" {
		if err := st.SendHeader(metadata.Pairs("coordd-keepalive-batches", o.header)); err != nil {
			return err
		}
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if ids := req.GetSessionIds(); len(ids) > 0 {
			o.batches.Add(1) // an older server would not see them at all
			o.mu.Lock()
			o.largest = max(o.largest, len(ids))
			o.mu.Unlock()
			resp := &coorddv1.KeepAliveStreamResponse{}
			for _, id := range ids {
				resp.Renewals = append(resp.Renewals, &coorddv1.Renewal{SessionId: id, Ttl: durationpb.New(3 * time.Second)})
			}
			if err := st.Send(resp); err != nil {
				return err
			}
			continue
		}
		if req.GetWatchOnly() {
			continue
		}
		o.renewals.Add(1)
		if err := st.Send(&coorddv1.KeepAliveStreamResponse{SessionId: req.GetSessionId(), Ttl: durationpb.New(3 * time.Second)}); err != nil {
			return err
		}
	}
}

// fakeServer serves the services register adds on loopback, until the
// test ends, and returns a client of it.
func fakeServer(t *testing.T, register func(*grpc.Server)) *clientlib.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	var served sync.WaitGroup
	served.Go(func() { _ = srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); served.Wait() })
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{lis.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// serve starts o on loopback and returns a client of it with n sessions
// of TTL 3s, and waits until every session renewed twice.
func serve(t *testing.T, o *olderSessions, n int) []*clientlib.Session {
	t.Helper()
	c := fakeServer(t, func(srv *grpc.Server) { coorddv1.RegisterSessionServiceServer(srv, o) })
	ctx := t.Context()
	var ss []*clientlib.Session
	for range n {
		s, err := c.NewSession(ctx, clientlib.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	at := time.Now()
	wait.Within(t, 10*time.Second, "every session to renew twice", func() bool {
		for _, s := range ss {
			// The deadline moves past at + TTL - margin only by a renewal
			// sent after at; the first one after joining names holdings.
			if !s.Deadline().After(at.Add(2700*time.Millisecond + 600*time.Millisecond)) {
				return false
			}
		}
		return true
	})
	for _, s := range ss {
		if err := s.Err(); err != nil {
			t.Fatalf("session %s ended with %v", s.ID(), err)
		}
	}
	return ss
}

// An SDK talking to a server that does not take batches of renewals (one
// from before them) renews each session in a message of its own, and its
// sessions live on.
func TestSessionsRenewOneByOneOnAnOlderServer(t *testing.T) {
	old := &olderSessions{}
	serve(t, old, 20)
	if n := old.batches.Load(); n > 0 {
		t.Fatalf("the SDK sent %d batches of renewals to a server that never said it takes them", n)
	}
}

// A batch holds no more sessions than the server says fit in a message.
func TestBatchesHoldNoMoreThanTheServerTakes(t *testing.T) {
	small := &olderSessions{header: "3"}
	serve(t, small, 60)
	small.mu.Lock()
	n := small.largest
	small.mu.Unlock()
	if n < 2 || n > 3 {
		t.Fatalf("the largest batch named %d sessions; the server takes 3 (and batches of 2 or 3 should have gone)", n)
	}
}

// callsServer serves the call stream with the bound header says (none:
// a server from before the bound was said), holding every call it is
// sent without answering, and unary Acquire calls the same way; it
// counts both.
type callsServer struct {
	olderSessions
	coorddv1.UnimplementedLockServiceServer
	header          string
	onStream, unary atomic.Int64
}

func (c *callsServer) Calls(st coorddv1.SessionService_CallsServer) error {
	md := metadata.Pairs("coordd-calls", "1")
	if c.header != "" {
		md.Append("coordd-calls-max", c.header)
	}
	if err := st.SendHeader(md); err != nil {
		return err
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if req.GetAcquire() != nil {
			c.onStream.Add(1)
		}
	}
}

func (c *callsServer) Acquire(ctx context.Context, _ *coorddv1.AcquireRequest) (*coorddv1.AcquireResponse, error) {
	c.unary.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A client pipelines on one call stream as many calls as its server says
// it runs at once (coordd-calls-max), and the rest as unary RPCs; a server
// that does not say runs 4,096.
func TestCallsInFlightFollowTheServersBound(t *testing.T) {
	for _, tc := range []struct {
		header   string
		onStream int64
	}{{"3", 3}, {"", 4096}} {
		t.Run("max="+tc.header, func(t *testing.T) {
			srv := &callsServer{header: tc.header}
			c := fakeServer(t, func(g *grpc.Server) {
				coorddv1.RegisterSessionServiceServer(g, srv)
				coorddv1.RegisterLockServiceServer(g, srv)
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s, err := c.NewSession(ctx, clientlib.WithTTL(3*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			n := tc.onStream + 2
			var calls sync.WaitGroup
			defer calls.Wait()
			defer cancel()
			for i := range n {
				calls.Go(func() { _, _ = s.Lock(ctx, "l", clientlib.WithRequestID(fmt.Sprintf("r%d", i))) })
			}
			wait.For(t, "every call to reach the server", func() bool {
				return srv.onStream.Load()+srv.unary.Load() == n
			})
			if got := srv.onStream.Load(); got != tc.onStream {
				t.Fatalf("%d calls on the stream, %d unary; want %d on the stream", got, srv.unary.Load(), tc.onStream)
			}
		})
	}
}
