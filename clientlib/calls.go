package clientlib

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// calls is a client's one Calls stream (SessionService.Calls): the SDK's
// lock and election calls (acquire, release, campaign, proclaim, resign,
// fenced writes) go on it as messages, pipelined, instead of one HTTP/2
// stream each. A call on it fails and retries exactly as its unary RPC
// would: the server runs it as that RPC, and a call in flight when the
// stream breaks ends with codes.Unavailable (outcome unknown), which the
// SDK's retries treat as a lost answer. Against a server without the
// stream (UNIMPLEMENTED), for a principal the policy does not let open it
// (PERMISSION_DENIED: it lacks the session action), with
// Config.UnaryCalls, or with maxPipelined calls in flight already, calls
// go as unary RPCs.
type calls struct {
	c   *Client
	off bool // Config.UnaryCalls

	ids atomic.Uint64 // call ids, unique per client

	mu      sync.Mutex
	cur     *callStream   // the open stream, or nil
	opening chan struct{} // closed when the open under way ends; nil if none
	// unaryUntil: the server refused the Calls stream; until then, calls
	// go as unary RPCs (the client may move to a member that has it, or
	// the policy may change).
	unaryUntil time.Time

	receivers sync.WaitGroup // every stream's receiver
}

// maxPipelined bounds the calls in flight on one stream when the server
// does not say its bound (coordd before it said so ran 4,096); more go as
// unary RPCs.
const maxPipelined = 4096

// unsupportedFor is how long a client sends unary RPCs after a member
// refused the Calls stream, before it asks again.
const unsupportedFor = time.Minute

// callStream is one open Calls stream.
type callStream struct {
	k      *calls
	st     grpc.BidiStreamingClient[coorddv1.CallsRequest, coorddv1.CallsResponse]
	cancel context.CancelFunc
	max    int // calls in flight at most (the server's bound)

	sendMu sync.Mutex // Send is not safe for concurrent use

	mu      sync.Mutex
	pending map[uint64]chan *coorddv1.CallsResponse // guarded by mu
	retired bool                                    // takes no new calls; closes once pending is empty
	err     error                                   // why it broke; set before done closes
	done    chan struct{}
	stop    func() // stops watching for the client moving; nil until set
}

// errStreamBroke answers the calls in flight on a Calls stream that broke:
// codes.Unavailable, as a unary call whose connection failed.
func errStreamBroke(cause error) error {
	return status.Errorf(codes.Unavailable, "coordd: the call stream broke during the call (%v); its outcome is unknown", cause)
}

// do runs req's call on the stream: ok is false when it should go as a
// unary RPC instead (see calls), and err is then nil.
func (k *calls) do(ctx context.Context, req *coorddv1.CallsRequest) (resp *coorddv1.CallsResponse, ok bool, err error) {
	if k.off {
		return nil, false, nil
	}
	cs, err := k.stream(ctx)
	if cs == nil {
		return nil, err != nil, err
	}
	id := k.ids.Add(1)
	req.CallId = id
	answer := make(chan *coorddv1.CallsResponse, 1)
	for {
		cs.mu.Lock()
		switch {
		case cs.retired || cs.err != nil:
			// It broke, or the client moved, before the call was sent:
			// take the next stream.
			cs.mu.Unlock()
			if cs, err = k.stream(ctx); cs == nil {
				return nil, err != nil, err
			}
			continue
		case len(cs.pending) >= cs.max:
			cs.mu.Unlock()
			return nil, false, nil
		}
		cs.pending[id] = answer
		cs.mu.Unlock()
		break
	}
	if err := cs.send(req); err != nil {
		cs.forget(id)
		return nil, true, errStreamBroke(err)
	}
	select {
	case r := <-answer:
		return answered(r)
	case <-cs.done:
		// An answer may have arrived just before the stream broke.
		select {
		case r := <-answer:
			return answered(r)
		default:
		}
		return nil, true, errStreamBroke(cs.cause())
	case <-ctx.Done():
		cs.forget(id)
		// As a unary call cancels its HTTP/2 stream; the server cancels
		// the call unless it finished already.
		_ = cs.send(&coorddv1.CallsRequest{CallId: id, Call: &coorddv1.CallsRequest_Cancel{Cancel: &coorddv1.CancelCall{}}})
		return nil, true, status.FromContextError(ctx.Err()).Err()
	}
}

// answered is a call's outcome from its answer: the response, or the
// error as the unary RPC would have returned it.
func answered(r *coorddv1.CallsResponse) (*coorddv1.CallsResponse, bool, error) {
	if e := r.GetError(); e != nil {
		return nil, true, status.ErrorProto(&spb.Status{Code: e.GetCode(), Message: e.GetMessage(), Details: e.GetDetails()})
	}
	return r, true, nil
}

// stream returns the open stream, opening one if there is none: nil, nil
// when calls go as unary RPCs for now.
func (k *calls) stream(ctx context.Context) (*callStream, error) {
	for {
		k.mu.Lock()
		if time.Now().Before(k.unaryUntil) {
			k.mu.Unlock()
			return nil, nil
		}
		if cs := k.cur; cs != nil && !cs.broken() {
			k.mu.Unlock()
			return cs, nil
		}
		if wait := k.opening; wait != nil {
			k.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		done := make(chan struct{})
		k.opening = done
		k.mu.Unlock()
		cs, unsupported, err := k.open(ctx)
		k.mu.Lock()
		k.opening = nil
		close(done)
		switch {
		case unsupported:
			k.unaryUntil = time.Now().Add(unsupportedFor)
		case err == nil:
			k.cur = cs
		}
		k.mu.Unlock()
		if err != nil && !unsupported {
			return nil, err
		}
	}
}

// open starts a stream and its receiver. The stream lives until it
// breaks, the client moves to another member (leaving one, or moving to
// the one that leads etcd), or the client closes;
// opening gives up when ctx ends. unsupported: the server has no Calls
// stream.
func (k *calls) open(ctx context.Context) (cs *callStream, unsupported bool, err error) {
	c := k.c
	c.mu.Lock()
	moved, rerouted := c.moved, c.rerouted
	c.mu.Unlock()
	sctx, cancel := context.WithCancel(c.ctx)
	stop := context.AfterFunc(ctx, cancel)
	st, err := c.sessions.Calls(sctx)
	if err == nil {
		_, err = st.Header()
	}
	if !stop() && err == nil {
		err = status.FromContextError(ctx.Err()).Err()
	}
	if err == nil && !hasCallsHeader(st) {
		// A server that refused the stream answered without the header:
		// its status comes with the first Recv.
		if _, rerr := st.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			err = rerr
		} else {
			err = status.Error(codes.Unimplemented, "coordd: the server did not take the call stream")
		}
	}
	if err != nil {
		cancel()
		// A principal without the session action may not open the stream
		// (an operator allowed only to release): its unary calls are
		// authorized one by one.
		code := status.Code(err)
		return nil, code == codes.Unimplemented || code == codes.PermissionDenied, err
	}
	cs = &callStream{k: k, st: st, cancel: cancel, max: callsMax(st), pending: map[uint64]chan *coorddv1.CallsResponse{}, done: make(chan struct{})}
	// When the client leaves this member, new calls go on a new stream
	// (to the member it uses now), and this one closes once its calls are
	// answered; when it left because the member went silent, the calls in
	// flight end at once, as unary ones do (Client.leaveSilent).
	silent, leave := c.joinSilent()
	stopMoved := context.AfterFunc(moved, cs.retire)
	stopRerouted := context.AfterFunc(rerouted, cs.retire)
	stopSilent := context.AfterFunc(silent.ctx, func() { cs.fail(errLeftSilent) })
	cs.mu.Lock()
	cs.stop = func() { stopMoved(); stopRerouted(); stopSilent(); leave() }
	failed := cs.err != nil // either may have run already
	cs.mu.Unlock()
	if failed {
		cs.stop()
	}
	k.receivers.Go(cs.receive)
	return cs, false, nil
}

// hasCallsHeader reports whether the stream's header says the server
// serves calls on it (api.CallsHeader).
func hasCallsHeader(st grpc.ClientStream) bool {
	md, err := st.Header()
	return err == nil && len(md.Get(callsHeader)) > 0
}

// callsMax is how many calls the server runs at once on st, as its header
// says (api.CallsMaxHeader), or maxPipelined.
func callsMax(st grpc.ClientStream) int {
	md, err := st.Header()
	if err != nil {
		return maxPipelined
	}
	if v := md.Get(callsMaxHeader); len(v) > 0 {
		if n, err := strconv.Atoi(v[0]); err == nil && n > 0 {
			return n
		}
	}
	return maxPipelined
}

// callsHeader and callsMaxHeader are api.CallsHeader and api.CallsMaxHeader.
const (
	callsHeader    = "coordd-calls"
	callsMaxHeader = "coordd-calls-max"
)

// receive owns Recv: it hands each answer to its call, until the stream
// breaks.
func (cs *callStream) receive() {
	for {
		r, err := cs.st.Recv()
		if err != nil {
			cs.fail(err)
			return
		}
		cs.mu.Lock()
		answer := cs.pending[r.GetCallId()]
		delete(cs.pending, r.GetCallId())
		idle := cs.retired && len(cs.pending) == 0
		cs.mu.Unlock()
		if answer != nil {
			answer <- r // buffered: one answer per call
		}
		if idle {
			cs.fail(errStreamIdle)
		}
	}
}

// send sends req on the stream; it fails with why the stream broke.
func (cs *callStream) send(req *coorddv1.CallsRequest) error {
	cs.sendMu.Lock()
	err := cs.st.Send(req)
	cs.sendMu.Unlock()
	if errors.Is(err, io.EOF) {
		// On a broken stream Send says only io.EOF; the receiver gets the
		// status from Recv.
		<-cs.done
		return cs.cause()
	}
	if err != nil {
		cs.fail(err)
	}
	return err
}

// forget drops a call that no longer waits for its answer.
func (cs *callStream) forget(id uint64) {
	cs.mu.Lock()
	delete(cs.pending, id)
	idle := cs.retired && len(cs.pending) == 0
	cs.mu.Unlock()
	if idle {
		cs.fail(errStreamIdle)
	}
}

// retire takes the stream out of use: the client moved to another member.
// It closes once its calls in flight are answered.
func (cs *callStream) retire() {
	k := cs.k
	k.mu.Lock()
	if k.cur == cs {
		k.cur = nil
	}
	k.mu.Unlock()
	cs.mu.Lock()
	cs.retired = true
	idle := len(cs.pending) == 0
	cs.mu.Unlock()
	if idle {
		cs.fail(errStreamIdle)
	}
}

// fail breaks the stream (the first reason wins): the calls in flight end
// with errStreamBroke.
func (cs *callStream) fail(err error) {
	cs.mu.Lock()
	first := cs.err == nil
	if first {
		cs.err = err
		close(cs.done)
	}
	stop := cs.stop
	cs.mu.Unlock()
	if first {
		cs.cancel()
		if stop != nil {
			stop() // else open calls it once set
		}
	}
}

// broken reports whether the stream failed or was retired.
func (cs *callStream) broken() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.err != nil || cs.retired
}

// cause is why the stream broke (after done is closed).
func (cs *callStream) cause() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.err
}

// shutdown waits for every stream's receiver (Client.Close, after the
// client's context ended, which ends the streams).
func (k *calls) shutdown() {
	k.receivers.Wait()
}

// pipelined makes the call req on the Calls stream, or as its unary RPC
// (unary) when the stream cannot take it.
func pipelined[Req, Resp proto.Message](ctx context.Context, k *calls, req Req, unary func(context.Context, Req, ...grpc.CallOption) (Resp, error), opts []grpc.CallOption) (Resp, error) {
	r, ok, err := k.do(ctx, coorddv1.NewCall(0, req))
	if !ok {
		return unary(ctx, req, opts...)
	}
	var resp Resp
	if err == nil {
		resp, _ = r.Response().(Resp)
	}
	return resp, err
}

// lockCalls is the client's LockService: the calls with a session go on
// the Calls stream when it can.
type lockCalls struct {
	coorddv1.LockServiceClient
	k *calls
}

func (l lockCalls) Acquire(ctx context.Context, req *coorddv1.AcquireRequest, opts ...grpc.CallOption) (*coorddv1.AcquireResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.Acquire, opts)
}

func (l lockCalls) TryAcquire(ctx context.Context, req *coorddv1.TryAcquireRequest, opts ...grpc.CallOption) (*coorddv1.TryAcquireResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.TryAcquire, opts)
}

func (l lockCalls) Release(ctx context.Context, req *coorddv1.ReleaseRequest, opts ...grpc.CallOption) (*coorddv1.ReleaseResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.Release, opts)
}

func (l lockCalls) ValidateFence(ctx context.Context, req *coorddv1.ValidateFenceRequest, opts ...grpc.CallOption) (*coorddv1.ValidateFenceResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.ValidateFence, opts)
}

func (l lockCalls) FencedPut(ctx context.Context, req *coorddv1.FencedPutRequest, opts ...grpc.CallOption) (*coorddv1.FencedPutResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.FencedPut, opts)
}

func (l lockCalls) FencedDelete(ctx context.Context, req *coorddv1.FencedDeleteRequest, opts ...grpc.CallOption) (*coorddv1.FencedDeleteResponse, error) {
	return pipelined(ctx, l.k, req, l.LockServiceClient.FencedDelete, opts)
}

// electionCalls is the client's ElectionService: the calls with a session
// go on the Calls stream when it can.
type electionCalls struct {
	coorddv1.ElectionServiceClient
	k *calls
}

func (e electionCalls) Campaign(ctx context.Context, req *coorddv1.CampaignRequest, opts ...grpc.CallOption) (*coorddv1.CampaignResponse, error) {
	return pipelined(ctx, e.k, req, e.ElectionServiceClient.Campaign, opts)
}

func (e electionCalls) Proclaim(ctx context.Context, req *coorddv1.ProclaimRequest, opts ...grpc.CallOption) (*coorddv1.ProclaimResponse, error) {
	return pipelined(ctx, e.k, req, e.ElectionServiceClient.Proclaim, opts)
}

func (e electionCalls) Resign(ctx context.Context, req *coorddv1.ResignRequest, opts ...grpc.CallOption) (*coorddv1.ResignResponse, error) {
	return pipelined(ctx, e.k, req, e.ElectionServiceClient.Resign, opts)
}

// barrierCalls is the client's BarrierService: entering and leaving go on
// the Calls stream when it can (an Enter that waits parks on the member).
type barrierCalls struct {
	coorddv1.BarrierServiceClient
	k *calls
}

func (b barrierCalls) EnterBarrier(ctx context.Context, req *coorddv1.EnterBarrierRequest, opts ...grpc.CallOption) (*coorddv1.EnterBarrierResponse, error) {
	return pipelined(ctx, b.k, req, b.BarrierServiceClient.EnterBarrier, opts)
}

func (b barrierCalls) LeaveBarrier(ctx context.Context, req *coorddv1.LeaveBarrierRequest, opts ...grpc.CallOption) (*coorddv1.LeaveBarrierResponse, error) {
	return pipelined(ctx, b.k, req, b.BarrierServiceClient.LeaveBarrier, opts)
}
