package api

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Parked calls.
//
// An acquisition on a Calls stream that has to wait for its turn does not
// keep a goroutine (with its stack, grown through the interceptors and
// etcd's client) for as long as it waits: its handler parks the wait with
// the member's queue view (lock.Manager.AcquireLater) and returns a
// *later in place of its answer. Each interceptor it returned through adds
// what it does after a handler (map the error, audit, count, see
// afterward) to the later, and the stream sends the answer when the later
// completes. A crowd of 10,000 waiters then costs the member their
// registrations and contexts, not 10,000 stacks.
//
// Only calls on a Calls stream park (a unary RPC's goroutine is held by
// gRPC until it answers anyway), and only where the CallServer lets them
// (parkableCall).

// later is a parked call's answer, to come.
type later struct {
	mu     sync.Mutex
	posts  []func(any, error) (any, error) // innermost interceptor's first
	answer func(any, error)                // set once the handler returned through every interceptor
	ended  bool                            // the outcome came before answer was set:
	resp   any                             // it is kept here until then
	err    error
}

// then adds post to what is done with the outcome before it is answered.
// Interceptors call it (through afterward) while the handler's return
// unwinds through them, before the stream sets the answer.
func (l *later) then(post func(any, error) (any, error)) {
	l.mu.Lock()
	l.posts = append(l.posts, post)
	l.mu.Unlock()
}

// complete gives the call's outcome, once; it is answered now, or as soon
// as the stream takes the later.
func (l *later) complete(resp any, err error) {
	l.mu.Lock()
	answer := l.answer
	if answer == nil {
		l.ended, l.resp, l.err = true, resp, err
	}
	l.mu.Unlock()
	if answer != nil {
		l.deliver(answer, resp, err)
	}
}

// answerWith sets how the outcome is answered, and answers at once if the
// outcome came already.
func (l *later) answerWith(answer func(any, error)) {
	l.mu.Lock()
	l.answer = answer
	ended, resp, err := l.ended, l.resp, l.err
	l.resp, l.err = nil, nil
	l.mu.Unlock()
	if ended {
		l.deliver(answer, resp, err)
	}
}

func (l *later) deliver(answer func(any, error), resp any, err error) {
	for _, post := range l.posts { // no then after answerWith: no lock needed
		resp, err = post(resp, err)
	}
	answer(resp, err)
}

// afterward applies post, what an interceptor does with a handler's
// outcome, now or, for a parked call, when its outcome comes.
func afterward(resp any, err error, post func(any, error) (any, error)) (any, error) {
	if l, ok := resp.(*later); ok && err == nil {
		l.then(post)
		return l, nil
	}
	return post(resp, err)
}

// parkableKey is the context key of a call that may park: its value is
// the call's own context on its stream (see parkableCall).
type parkableKey struct{}

// parkableCall returns, for a call that may park its wait, the context that
// governs the call until it is answered: it ends when the client cancels
// the call, the stream ends, or the daemon stops (with ErrStopping as its
// cause), but not when the handler returns. ok is false for any other
// call: unary RPCs and calls that must answer before they return.
func parkableCall(ctx context.Context) (context.Context, bool) {
	c, ok := ctx.Value(parkableKey{}).(context.Context)
	return c, ok
}

// Deferring runs in, an interceptor that knows nothing of parked calls,
// around calls that cannot park, and for those that may park, after the
// handler, with its outcome: at once if it answered, when the outcome
// comes if it parked. Such a call then takes no time as in sees it: for a
// metrics interceptor, its code is counted but no duration, whether it
// parked or not (its time to grant is in coordd_lock_wait_seconds).
func Deferring(in grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := parkableCall(ctx); !ok {
			return in(ctx, req, info, handler)
		}
		resp, err := handler(ctx, req)
		return afterward(resp, err, func(resp any, err error) (any, error) {
			return in(ctx, req, info, func(context.Context, any) (any, error) { return resp, err })
		})
	}
}

// begin starts a call that may wait for its turn (an acquisition, a
// campaign, a barrier's enter or leave): the request's wait (bound) bounds
// it from now, both bounded, the context of the work done now, and wait,
// that of a parked wait (call, for a call on the stream, with the same
// deadline); the caller's principal takes one of its waiting places (see
// Waiters). The caller defers cancel, and calls finish once the call is
// answered (it ends wait's bound and frees the place).
func (w *Waiters) begin(ctx, call context.Context, bound *durationpb.Duration) (bounded, wait context.Context, cancel, finish func(), err error) {
	bounded, cancelBound, err := withWait(ctx, bound)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	wait, cancelWait := call, context.CancelFunc(func() {})
	if deadline, ok := bounded.Deadline(); ok && call != nil && bound != nil {
		wait, cancelWait = context.WithDeadline(call, deadline)
	}
	done, err := w.enter(bounded)
	if err != nil {
		cancelWait()
		cancelBound()
		return nil, nil, nil, nil, err
	}
	return bounded, wait, cancelBound, func() { done(); cancelWait() }, nil
}
