package clientlib_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// flakyConfig answers UNAVAILABLE to the first failFirst reads of each
// key (all of them for key "down") and to every put, as a member
// whose etcd is electing a leader would. It counts the calls.
type flakyConfig struct {
	coorddv1.UnimplementedConfigServiceServer
	failFirst int64
	retried   chan struct{} // if set, closed as the key "slow" is asked again

	gets, publishes atomic.Int64
}

func (f *flakyConfig) Get(ctx context.Context, req *coorddv1.GetRequest) (*coorddv1.GetResponse, error) {
	n := f.gets.Add(1)
	if req.GetKey() == "slow" && n > 1 {
		if n == 2 && f.retried != nil {
			close(f.retried)
		}
		<-ctx.Done() // the retry outlives the caller's context
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if n <= f.failFirst || req.GetKey() == "down" || req.GetKey() == "slow" {
		return nil, status.Error(codes.Unavailable, "etcd's leader changed while the request was in flight; retry")
	}
	return &coorddv1.GetResponse{Value: "v", ModRevision: 7}, nil
}

func (f *flakyConfig) Put(context.Context, *coorddv1.PutRequest) (*coorddv1.PutResponse, error) {
	f.publishes.Add(1)
	return nil, status.Error(codes.Unavailable, "no quorum")
}

// A read that fails with UNAVAILABLE is made again until it succeeds
// (within readRetryFor) or ctx ends, when its last error is returned; a
// write that is not idempotent is not repeated.
func TestReadsRetryWhileUnavailable(t *testing.T) {
	cfg := &flakyConfig{failFirst: 3}
	c := fakeServer(t, func(srv *grpc.Server) { coorddv1.RegisterConfigServiceServer(srv, cfg) })

	v, rev, err := c.ConfigCenter().Get(t.Context(), "app", "k", 0)
	if err != nil || v != "v" || rev != 7 {
		t.Fatalf("Get = %q, %d, %v; want v, 7 after the server's three UNAVAILABLE answers", v, rev, err)
	}
	if n := cfg.gets.Load(); n != 4 {
		t.Fatalf("the server saw %d reads, want 4", n)
	}

	// Long enough for a first answer on a loaded machine: a deadline that
	// ends the first attempt leaves no UNAVAILABLE answer to report.
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Second))
	defer cancel()
	before := cfg.gets.Load()
	if _, _, err := c.ConfigCenter().Get(ctx, "app", "down", 0); !errors.Is(err, clientlib.ErrUnavailable) {
		t.Fatalf("Get of a key that stays unavailable = %v, want ErrUnavailable (the last answer) when ctx ends", err)
	}
	if n := cfg.gets.Load() - before; n < 2 {
		t.Fatalf("the server saw %d reads of the unavailable key, want the read repeated", n)
	}

	// A retry that the caller's context cuts short reports why it was
	// retried, not that the context ended: the member was unavailable.
	// The context ends once the retry is in flight (the first attempt may
	// take as long as a loaded machine makes it).
	slow := &flakyConfig{retried: make(chan struct{})}
	sc := fakeServer(t, func(srv *grpc.Server) { coorddv1.RegisterConfigServiceServer(srv, slow) })
	sctx, scancel := context.WithCancel(t.Context())
	defer scancel()
	go func() {
		select {
		case <-slow.retried:
			scancel()
		case <-sctx.Done():
		}
	}()
	if _, _, err := sc.ConfigCenter().Get(sctx, "app", "slow", 0); !errors.Is(err, clientlib.ErrUnavailable) {
		t.Fatalf("Get whose retry outlives ctx = %v, want ErrUnavailable (the answer that made it retry)", err)
	}

	if _, err := c.ConfigCenter().Put(t.Context(), "app", "k", "v2", clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrUnavailable) {
		t.Fatalf("Put = %v, want ErrUnavailable", err)
	}
	if n := cfg.publishes.Load(); n != 1 {
		t.Fatalf("the server saw %d publishes, want 1: a publish is not repeated", n)
	}
}

// flakySessions answers UNAVAILABLE to the first failFirst CreateSession
// calls, as a member whose etcd is electing a leader would, then creates.
type flakySessions struct {
	coorddv1.UnimplementedSessionServiceServer
	failFirst atomic.Int64
	failCode  atomic.Int32 // the refusals' code: UNAVAILABLE when 0
	creates   atomic.Int64
}

func (f *flakySessions) CreateSession(_ context.Context, req *coorddv1.CreateSessionRequest) (*coorddv1.CreateSessionResponse, error) {
	if n := f.creates.Add(1); n <= f.failFirst.Load() {
		code := codes.Code(f.failCode.Load())
		if code == codes.OK {
			code = codes.Unavailable
		}
		return nil, status.Error(code, "coordd: etcd's leader changed while the request was in flight; retry")
	}
	return &coorddv1.CreateSessionResponse{Session: &coorddv1.Session{Id: "7", Ttl: req.GetTtl()}}, nil
}

// NewSession is made again after UNAVAILABLE, as a read is: at worst the
// lost answer leaves an orphan session that holds nothing and ends with
// its TTL. (A caller had to retry it, and tests did, around every etcd
// leader change.)
func TestNewSessionRetriesWhileUnavailable(t *testing.T) {
	srv := &flakySessions{}
	srv.failFirst.Store(2)
	c := fakeServer(t, func(g *grpc.Server) { coorddv1.RegisterSessionServiceServer(g, srv) })
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("NewSession after two UNAVAILABLE answers: %v", err)
	}
	if s.ID() != "7" {
		t.Fatalf("session %q, want 7", s.ID())
	}
	if n := srv.creates.Load(); n != 3 {
		t.Fatalf("the server saw %d creates, want 3", n)
	}
	// A server that names itself in its message is not named twice. (A
	// refusal that is not retried: a retried one that outlives a short
	// context ends with the context's error instead, whenever the
	// deadline falls during an attempt.)
	srv.failFirst.Store(1 << 30)
	srv.failCode.Store(int32(codes.FailedPrecondition))
	_, err = c.NewSession(t.Context())
	if err == nil || strings.Count(err.Error(), "coordd:") != 1 {
		t.Fatalf("NewSession refused by a member = %v; want its message with one \"coordd:\"", err)
	}
}
