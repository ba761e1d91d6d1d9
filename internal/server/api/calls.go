package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/coordd/coordd/internal/base/errkind"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// CallServer serves SessionService.Calls: the calls a client makes with
// its sessions, pipelined over one stream. Each call runs, on a worker,
// through the same unary interceptors, and the same handler, as the unary
// RPC whose request it carries, so it is authorized, rate limited, audited,
// timed and answered exactly as that RPC would be; only the transport is
// shared. What a call saves against its unary RPC is the HTTP/2 stream,
// its headers and trailers, and authenticating the caller again.
//
// Guarantees: every call is answered once, with its call id, unless the
// stream ends first; a call's failure answers that call and leaves the
// stream open; calls in flight when the stream ends are cancelled (their
// outcome is unknown to the client, as after a lost unary answer). No
// guarantee of order between calls in flight at once. An acquisition
// that has to wait holds no goroutine while it waits (see park.go).
type CallServer struct {
	routes   map[protoreflect.FullName]callRoute // by request type
	stopping <-chan struct{}
	disabled bool
	metrics  *Metrics

	work    chan func()  // calls for idle workers (unbuffered)
	workers atomic.Int32 // workers running
}

// callRoute is how one kind of call runs: its unary RPC's full method
// name, and the interceptors wrapped around that RPC's handler.
type callRoute struct {
	method   string
	run      grpc.UnaryHandler
	parkable bool // its handler may park the call's wait (see park.go)
}

// routeOf is the route of method, served by h, keyed by h's request type.
func routeOf[Req proto.Message, Resp any](method string, h func(context.Context, Req) (Resp, error)) (protoreflect.FullName, callRoute) {
	var req Req // a nil message still has its descriptor
	return req.ProtoReflect().Descriptor().FullName(), callRoute{method: method, run: func(ctx context.Context, m any) (any, error) { return h(ctx, m.(Req)) }}
}

// CallsHeader is the header metadata key with which a server says, as soon
// as a Calls stream opens, that it serves calls on it (value "1").
// CallsMaxHeader says how many calls it runs at once on one stream (see
// maxCallsInFlight); a server without it ran 4,096.
const (
	CallsHeader    = "coordd-calls"
	CallsMaxHeader = "coordd-calls-max"
)

// maxCallsInFlight bounds the calls one stream runs at once; more are
// answered RATE_LIMITED at once (the SDK keeps under it, and sends unary
// RPCs beyond). Waiting acquisitions and campaigns count against it, and
// per principal against Waiters as their unary RPCs do. A parked
// acquisition costs about 10 KiB, so that a client's crowd of 10,000
// waiters fits on its stream (beyond, each would be a unary call with its
// goroutine, about 30 KiB) while a full stream holds about what 4,096
// waits with a goroutine each did (160 MB against 120).
const maxCallsInFlight = 1 << 14

// CallOptions is what a CallServer is built from (NewCallServer).
type CallOptions struct {
	// Locks, Elections and Barriers serve the calls of their services;
	// all three are required.
	Locks     *LockServer
	Elections *ElectionServer
	Barriers  *BarrierServer
	// Interceptors (outermost first) wrap each call, as they wrap the
	// unary RPC of its name on the server whose interceptors they are;
	// nil: none.
	Interceptors []grpc.UnaryServerInterceptor
	// Metrics counts the calls served; nil: nothing is counted.
	Metrics *Metrics
	// Stopping, once closed, ends streams with ErrStopping; nil: they end
	// only with their callers.
	Stopping <-chan struct{}
	// Disabled ends every Calls stream with UNIMPLEMENTED, so clients
	// fall back to unary RPCs (coordd --no-call-stream); false: calls
	// are served.
	Disabled bool
}

// NewCallServer returns the Calls server for locks, elections and
// barriers: each call runs through o.Interceptors, as the unary RPC of
// its name would.
func NewCallServer(o CallOptions) *CallServer {
	s := &CallServer{routes: map[protoreflect.FullName]callRoute{}, stopping: o.Stopping, disabled: o.Disabled, metrics: o.Metrics, work: make(chan func())}
	add := func(req protoreflect.FullName, r callRoute) {
		r.run = chainUnary(o.Interceptors, r.method, r.run)
		s.routes[req] = r
	}
	acquire, r := routeOf(coorddv1.LockService_Acquire_FullMethodName, o.Locks.acquireOnStream)
	r.parkable = true
	add(acquire, r)
	add(routeOf(coorddv1.LockService_TryAcquire_FullMethodName, o.Locks.TryAcquire))
	add(routeOf(coorddv1.LockService_Release_FullMethodName, o.Locks.Release))
	add(routeOf(coorddv1.LockService_ValidateFence_FullMethodName, o.Locks.ValidateFence))
	add(routeOf(coorddv1.LockService_FencedPut_FullMethodName, o.Locks.FencedPut))
	add(routeOf(coorddv1.LockService_FencedDelete_FullMethodName, o.Locks.FencedDelete))
	campaign, r := routeOf(coorddv1.ElectionService_Campaign_FullMethodName, o.Elections.campaignOnStream)
	r.parkable = true
	add(campaign, r)
	enter, r := routeOf(coorddv1.BarrierService_EnterBarrier_FullMethodName, o.Barriers.enterOnStream)
	r.parkable = true
	add(enter, r)
	leave, r := routeOf(coorddv1.BarrierService_LeaveBarrier_FullMethodName, o.Barriers.leaveOnStream)
	r.parkable = true
	add(leave, r)
	add(routeOf(coorddv1.ElectionService_Proclaim_FullMethodName, o.Elections.Proclaim))
	add(routeOf(coorddv1.ElectionService_Resign_FullMethodName, o.Elections.Resign))
	return s
}

// chainUnary wraps h, the handler of method, in interceptors (the first
// outermost), as grpc.ChainUnaryInterceptor does for a unary call.
func chainUnary(interceptors []grpc.UnaryServerInterceptor, method string, h grpc.UnaryHandler) grpc.UnaryHandler {
	info := &grpc.UnaryServerInfo{FullMethod: method}
	for i := len(interceptors) - 1; i >= 0; i-- {
		in, next := interceptors[i], h
		h = func(ctx context.Context, req any) (any, error) { return in(ctx, req, info, next) }
	}
	return h
}

// Serve serves one Calls stream until the client ends it, it breaks, or
// the daemon stops; it returns once every call it started has returned.
func (s *CallServer) Serve(stream coorddv1.SessionService_CallsServer) error {
	if s == nil || s.disabled {
		return status.Error(codes.Unimplemented, "coordd: this server takes no calls on a stream (it runs with --no-call-stream); use the unary RPCs")
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	cs := &callStream{stream: stream, inflight: make(map[uint64]context.CancelFunc)}
	defer cs.calls.Wait() // every call returns once ctx ends
	defer cancel(nil)
	defer cs.close()
	if err := stream.SendHeader(metadata.Pairs(CallsHeader, "1", CallsMaxHeader, strconv.Itoa(maxCallsInFlight))); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	// The receiver starts each call as it arrives. It exits when Recv
	// fails, which gRPC guarantees once this handler returns (the stream's
	// context is then cancelled).
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			s.start(ctx, cs, req)
		}
	}()
	select {
	case <-s.stopping:
		// The calls in flight are answered UNAVAILABLE, which the client
		// retries elsewhere (or here, once restarted), not CANCELLED,
		// which it would take for its own caller's cancellation.
		cancel(ErrStopping)
		return ErrStopping
	case <-ctx.Done():
		return ctx.Err()
	case err := <-recvErr:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}

// callStream is the state of one Calls stream.
type callStream struct {
	stream coorddv1.SessionService_CallsServer
	calls  sync.WaitGroup // the stream's calls in flight

	sendMu sync.Mutex // Send is not safe for concurrent use

	mu       sync.Mutex
	inflight map[uint64]context.CancelFunc // by call id
	closed   bool                          // the handler is returning: start no more calls
}

// close makes start refuse further calls, so that calls.Wait may begin.
func (cs *callStream) close() {
	cs.mu.Lock()
	cs.closed = true
	cs.mu.Unlock()
}

// start runs req's call on a worker, or answers at once when it is a
// cancellation or cannot run. Every answer is sent before the handler
// returns: each counts in cs.calls, which the handler waits for.
func (s *CallServer) start(ctx context.Context, cs *callStream, req *coorddv1.CallsRequest) {
	id := req.GetCallId()
	if req.GetCancel() != nil {
		cs.mu.Lock()
		stop := cs.inflight[id]
		cs.mu.Unlock()
		if stop != nil {
			stop()
		}
		return
	}
	msg := req.Request()
	var r callRoute
	known := false
	if msg != nil {
		r, known = s.routes[msg.ProtoReflect().Descriptor().FullName()]
	}
	var refusal error
	switch {
	case id == 0:
		refusal = invalid("call_id is required (non-zero)")
	case !known:
		refusal = invalid("call: name one of acquire, try_acquire, release, campaign, proclaim, resign, validate_fence, fenced_put, fenced_delete, enter_barrier, leave_barrier, cancel")
	}
	cctx, stop := context.WithCancel(ctx)
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		stop()
		return // the stream is ending: nobody reads an answer
	}
	cs.calls.Add(1) // before Wait can begin (close); done once answered
	if refusal == nil {
		if _, dup := cs.inflight[id]; dup {
			refusal = invalid("call_id: a call with this id is in flight on the stream")
		} else if len(cs.inflight) >= maxCallsInFlight {
			refusal = errkind.RateLimited.New(fmt.Sprintf("coordd: %d calls are in flight on this stream; wait for some to finish or use another stream", maxCallsInFlight))
		} else {
			cs.inflight[id] = stop
		}
	}
	cs.mu.Unlock()
	if refusal != nil {
		stop()
		cs.answer(id, nil, refusal)
		cs.calls.Done()
		return
	}
	s.metrics.streamCall()
	finish := func(resp any, err error) {
		defer cs.calls.Done()
		if err != nil {
			// A parked call ended by its stream's end says why the stream
			// ended, as its unary RPC would have.
			if cause := context.Cause(cctx); errors.Is(cause, ErrStopping) || errors.Is(cause, ErrNoQuorum) {
				resp, err = nil, cause
			}
		}
		cs.mu.Lock()
		delete(cs.inflight, id)
		cs.mu.Unlock()
		stop()
		cs.answer(id, resp, err)
	}
	s.run(func() {
		rctx := cctx
		if r.parkable {
			rctx = context.WithValue(cctx, parkableKey{}, cctx)
		}
		resp, err := r.run(rctx, msg)
		if l, ok := resp.(*later); ok && err == nil {
			// Parked: answered when its wait ends (on another goroutine),
			// which the call's cancellation, the stream's end and the
			// daemon's stop all bring about through cctx.
			l.answerWith(finish)
			return
		}
		finish(resp, err)
	})
}

// run runs call on an idle worker, or on a new worker when none is idle
// (past maxCallWorkers, on a goroutine of its own). Workers keep the
// stacks they grew through the interceptors and etcd's client: a new
// goroutine per call grows its stack anew. (With 16 fixed workers, most
// calls of 64 clients on 64 locks ran on new goroutines, and
// runtime.newstack was 5.6 % of the daemon's CPU.)
func (s *CallServer) run(call func()) {
	select {
	case s.work <- call:
		return
	default:
	}
	if s.workers.Add(1) <= maxCallWorkers {
		go s.worker(call)
		return
	}
	s.workers.Add(-1)
	go call()
}

// A waiting campaign holds its worker (a waiting acquisition parks, see
// park.go, and lets its worker go), so the workers grow with the calls in
// flight, up to maxCallWorkers; one idle for callWorkerIdle exits.
const (
	maxCallWorkers = 256
	callWorkerIdle = time.Minute
)

// worker runs call, then calls handed to it, until it has idled for
// callWorkerIdle or the server is stopping (calls started after that run
// on new workers, and end at once).
func (s *CallServer) worker(call func()) {
	defer s.workers.Add(-1)
	idle := time.NewTimer(callWorkerIdle)
	defer idle.Stop()
	for {
		call()
		idle.Reset(callWorkerIdle)
		select {
		case <-s.stopping:
			return
		case <-idle.C:
			return
		case call = <-s.work:
		}
	}
}

// answer sends a call's outcome. A stream that cannot send any more is
// ending: its receiver sees that too, and the handler returns.
func (cs *callStream) answer(id uint64, resp any, err error) {
	var out *coorddv1.CallsResponse
	if m, ok := resp.(proto.Message); ok && err == nil {
		out = coorddv1.NewAnswer(id, m)
	}
	if out == nil {
		if err == nil {
			err = errInternal().Err() // a route answered with no response of its RPC
		}
		// Errors from the interceptors are statuses already; a refusal
		// before them (start) is mapped here.
		st, ok := status.FromError(err)
		if !ok {
			st, _ = ToStatus(err)
		}
		p := st.Proto()
		out = &coorddv1.CallsResponse{CallId: id, Result: &coorddv1.CallsResponse_Error{Error: &coorddv1.CallStatus{Code: p.GetCode(), Message: p.GetMessage(), Details: p.GetDetails()}}}
	}
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	_ = cs.stream.Send(out) // a failed Send ends the stream; Recv reports it
}
