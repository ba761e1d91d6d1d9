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
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// olderSessions speaks the keep-alive protocol of a server that predates
// batches of renewals: it never says it takes them, and renews the one
// session each request names. It counts what it is sent.
type olderSessions struct {
	coorddv1.UnimplementedSessionServiceServer

	next     atomic.Int64
	renewals atomic.Int64
	batches  atomic.Int64
}

func (o *olderSessions) CreateSession(_ context.Context, req *coorddv1.CreateSessionRequest) (*coorddv1.CreateSessionResponse, error) {
	id := fmt.Sprintf("%016x", o.next.Add(1))
	return &coorddv1.CreateSessionResponse{Session: &coorddv1.Session{Id: id, Ttl: req.GetTtl()}}, nil
}

func (o *olderSessions) CloseSession(context.Context, *coorddv1.CloseSessionRequest) (*coorddv1.CloseSessionResponse, error) {
	return &coorddv1.CloseSessionResponse{}, nil
}

func (o *olderSessions) KeepAliveStream(st coorddv1.SessionService_KeepAliveStreamServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if len(req.GetSessionIds()) > 0 {
			o.batches.Add(1) // an older server would not see them at all
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

// An SDK talking to a server that does not take batches of renewals (one
// from before them) renews each session in a message of its own, and its
// sessions live on.
func TestSessionsRenewOneByOneOnAnOlderServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	old := &olderSessions{}
	coorddv1.RegisterSessionServiceServer(srv, old)
	var served sync.WaitGroup
	served.Go(func() { _ = srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); served.Wait() })

	ctx := t.Context()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{lis.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	var ss []*clientlib.Session
	for range 20 {
		s, err := c.NewSession(ctx, clientlib.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
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
	if n := old.batches.Load(); n > 0 {
		t.Fatalf("the SDK sent %d batches of renewals to a server that never said it takes them", n)
	}
	for _, s := range ss {
		if err := s.Err(); err != nil {
			t.Fatalf("session %s ended with %v", s.ID(), err)
		}
		_ = s.Close(ctx)
	}
}
