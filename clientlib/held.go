package clientlib

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// held is what a held lock and a leadership share: a context that ends
// with the session, on loss or when given up, and a channel closed on
// loss. The server reports its end on the session's keep-alive stream
// (the stream follows it from its grant, or the session names it there:
// see Session.watch), so a release or resignation from outside ends it
// too.
type held struct {
	parent context.Context // the session's
	ctx    context.Context // guarded by mu once newHeld returned (see context)
	cancel context.CancelCauseFunc
	lost   chan struct{}
	// gone is the cause of an end from outside, letGo tells the server the
	// holder let go of a holding it was asked to give up (see revoked).
	gone  func() error
	letGo func()

	// endedAt is the etcd revision of the holder's own release's or
	// resignation's commit (0 until one succeeded; see Lock.ReleasedAt).
	endedAt atomic.Int64

	mu      sync.Mutex
	ended   bool        // given up or lost
	untold  bool        // given up, but telling the server failed: the next give-up tries again
	stop    func() bool // stops watching the session; set once newHeld has it
	unwatch func()      // forgets the holding on the stream; set once newHeld has it
	// expected, when set, is the cause of an end the holder itself is
	// bringing about (a hand-over): a report of an end meanwhile is kept
	// in pending until settle says whether it was that end or a loss.
	expected error
	pending  error
	asked    bool // a revocation came while expected was set
}

// context is h's context: the holding's, or after a hand-over the server
// refused, the one that replaced it (see settle).
func (h *held) context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctx
}

// expect marks an end the holder is bringing about, with cause, and ends
// h's context now, before the holder's request leaves: nobody else can
// hold before this holder has stopped. Until settle, a report of an end
// is held back.
func (h *held) expect(cause error) {
	h.mu.Lock()
	h.expected, h.pending, h.asked = cause, nil, false
	cancel := h.cancel
	h.mu.Unlock()
	cancel(cause)
}

// settle ends the expectation: ok, the end happened (h ends with the
// expected cause, as a give-up); otherwise an end reported meanwhile was
// a loss, and is reported now; else the server refused and the holding
// goes on, under a new context (the old one ended in expect).
func (h *held) settle(ok bool) {
	h.mu.Lock()
	cause, pending, asked := h.expected, h.pending, h.asked
	h.expected, h.pending, h.asked = nil, nil, false
	if !ok && pending == nil && !asked && !h.ended {
		h.ctx, h.cancel = context.WithCancelCause(h.parent)
		if h.parent.Err() != nil {
			h.cancel(context.Cause(h.parent))
		}
	}
	h.mu.Unlock()
	switch {
	case ok:
		h.giveUp(cause)
	case pending != nil:
		h.lose(pending)
	case asked:
		h.revoked()
	}
}

// revoked handles the server's request that h be given up (a release or
// resignation from outside): h ends as lost, and only then is the server
// told that the holder let go (letGo), which lets the next holder in.
func (h *held) revoked() {
	h.mu.Lock()
	if h.expected != nil {
		h.asked = true // settle decides: a hand-over under way may end it anyway
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	if h.lose(h.gone()) && h.letGo != nil {
		go h.letGo()
	}
}

// followedOn is what to pass to newHeld: the stream a grant request
// named, if the server follows the grant on it.
func followedOn(f following, followed bool) following {
	if !followed {
		return following{}
	}
	return f
}

// newHeld starts tracking holding (its request id and token as granted),
// which ends with cause gone() when the server reports it ended (built
// then: most holdings are given up, and never need it).
//
// A request from the server that the holding be given up (a release or
// resignation from outside) ends h the same way, and then calls letGo, on
// a goroutine of its own, to tell the server (the holder's own release or
// resignation): the server grants the next holder only then.
func newHeld(s *Session, holding *coorddv1.Holding, gone func() error, on following, letGo func()) *held {
	if holding.GetRevision() < holding.GetToken() {
		holding.Revision = 0 // not one at which it was alive: let the server read
	}
	h := &held{parent: s.ctx, lost: make(chan struct{}), gone: gone, letGo: letGo}
	h.ctx, h.cancel = context.WithCancelCause(s.ctx)
	// Either may end h before newHeld has stored what undoes them: the
	// session may be over already, and the stream may report the end as
	// soon as watch has added it.
	stop := context.AfterFunc(s.ctx, func() { h.lose(nil) })
	unwatch, ended := s.watch(holding, watchedHolding{ended: func() { h.lose(gone()) }, revoking: h.revoked}, on)
	h.mu.Lock()
	h.stop, h.unwatch = stop, unwatch
	over := h.ended
	h.mu.Unlock()
	if over {
		stop()
		unwatch()
	}
	if ended {
		h.lose(gone())
	}
	return h
}

// giveUp ends h because its holder gives it up, with cause as the
// context's cause. It reports whether the caller is to tell the server
// (tell): when this call ended it, or when an earlier give-up failed to
// tell it (see told); again says which. A failed call may still have
// reached the server, so a repeated one that finds the grant gone is done.
func (h *held) giveUp(cause error) (tell, again bool) {
	h.mu.Lock()
	if h.ended {
		again := h.untold
		h.untold = false
		h.mu.Unlock()
		return again, again
	}
	h.ended = true
	stop, unwatch, cancel := h.stop, h.unwatch, h.cancel
	h.mu.Unlock()
	h.undo(stop, unwatch)
	cancel(cause)
	return true, false
}

// told records how telling the server of a give-up went: after a failure
// (ctx ended first, the server refused or failed), the next give-up
// tries again, so a release that failed can be repeated rather than leave
// the grant to the session's end.
func (h *held) told(err error) {
	if err == nil {
		return
	}
	h.mu.Lock()
	h.untold = true
	h.mu.Unlock()
}

// undo stops what newHeld started, once it has stored it (else newHeld
// does, seeing ended).
func (h *held) undo(stop func() bool, unwatch func()) {
	if stop != nil {
		stop()
	}
	if unwatch != nil {
		unwatch()
	}
}

// lose ends h because it was lost (cause; nil when the session ended,
// whose cause the context already carries) and closes lost. It reports
// whether this call ended h.
func (h *held) lose(cause error) bool {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return false
	}
	if h.expected != nil && cause != nil {
		h.pending = cause // settle decides
		h.mu.Unlock()
		return false
	}
	h.ended = true
	stop, unwatch, cancel := h.stop, h.unwatch, h.cancel
	h.mu.Unlock()
	// Forgotten first: once lost is closed, nothing of h stays behind
	// (or newHeld, which undoes what lose could not, has not returned yet).
	h.undo(stop, unwatch)
	// The context first: a holder that waits on lost finds it ended too.
	cancel(cause)
	close(h.lost)
	return true
}

// errMoved cancels a call in flight when the client leaves an endpoint.
var errMoved = errors.New("coordd: the client moved to another endpoint")

// retry calls call until it succeeds, fails for a reason other than an
// unavailable coordd or etcd, or ctx ends (returning ctx's error). With
// attempt > 0 each call gets at most that long, so a call stuck on a member
// that lost its etcd leader is retried (elsewhere) instead of eating all of
// ctx. A call in flight when the client gives up on an endpoint (a
// keep-alive through it went unanswered: the member is paused, partitioned
// or dead) is cancelled and retried at once on the next one, instead of
// hanging on a member that may never answer. Only idempotent calls may be
// retried. It returns how many calls it made.
func (c *Client) retry(ctx context.Context, attempt time.Duration, call func(ctx context.Context) error) (int, error) {
	backoff := 50 * time.Millisecond
	for n := 1; ; n++ {
		actx, cancel := context.WithCancelCause(ctx)
		callCtx, cancelTimeout := context.Context(actx), context.CancelFunc(func() {})
		if attempt > 0 {
			callCtx, cancelTimeout = context.WithTimeout(actx, attempt)
		}
		stop := context.AfterFunc(c.movedContext(), func() { cancel(errMoved) })
		err := convert(ctx, call(callCtx))
		// Moved: the client left an endpoint during the call (not closed).
		moved := !stop() && ctx.Err() == nil && c.ctx.Err() == nil
		cancelTimeout()
		cancel(nil)
		switch {
		case err == nil:
			return n, nil
		case ctx.Err() != nil:
			return n, ctx.Err()
		case moved:
			continue // at once: the next endpoint is likely fine
		case errors.Is(err, ErrUnavailable), attempt > 0 && status.Code(err) == codes.DeadlineExceeded:
		default:
			return n, err
		}
		// Without spinning on a connection that fails fast.
		if !pause(ctx, backoff) {
			return n, ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}
