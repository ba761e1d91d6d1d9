package clientlib

import (
	"context"
	"errors"
	"fmt"
	"slices"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// LockSet is several locks held together by one session (Session.LockAll).
type LockSet struct {
	locks  []*Lock // sorted by name
	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool
}

// LockAll acquires every named lock for the session, all or none, with
// one request: the server queues for them one at a time in the order of
// their names, so LockAll calls for overlapping sets never deadlock each
// other, and each lock's queue stays first come, first served. It returns
// once it holds them all (one grant, one fencing token, per lock), or
// fails as Lock does, leaving none of them held or queued (under ctx's
// deadline, by the time it returns). Unavailable
// servers are retried with the same request id (WithRequestID, or one the
// SDK picks), so a retry resumes the same grants. Options: WithRequestID
// and WithMetadata; every lock of a set is a mutex taken for writing.
//
// Not guaranteed: that the locks are taken at one instant; others may see
// some held while the call waits for the rest. A caller that holds a lock
// by Lock and then asks LockAll for a set that includes a lock sorted
// before it can still wait in a cycle with another caller.
func (s *Session) LockAll(ctx context.Context, names []string, opts ...LockOption) (*LockSet, error) {
	o := lockOptions{limit: 1}
	for _, opt := range opts {
		opt.applyLock(&o)
	}
	if o.limit != 1 || o.read || o.lockDelay != 0 {
		return nil, fmt.Errorf("%w: the locks of a set are mutexes taken for writing (no WithLimit, Shared or WithLockDelay)", ErrInvalidArgument)
	}
	if o.requestID == "" {
		o.requestID = randomID()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	follow := s.followStream()
	req := &coorddv1.AcquireAllRequest{Names: names, SessionId: s.id, RequestId: o.requestID, Metadata: o.metadata, KeepaliveStream: follow.stream}
	var resp *coorddv1.AcquireAllResponse
	_, err := s.c.retry(cctx, 0, func(ctx context.Context) (err error) {
		// Under ctx's deadline the server's wait runs out first: it gives
		// the set's grants back before it answers.
		req.Wait = serverWait(ctx)
		resp, err = s.c.locks.AcquireAll(ctx, req)
		return err
	})
	if err != nil {
		if serr := s.Err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	set := &LockSet{}
	for _, g := range resp.GetGrants() {
		set.locks = append(set.locks, s.heldLock(g.GetName(), g, follow, false))
	}
	set.ctx, set.cancel = context.WithCancelCause(s.ctx)
	for _, l := range set.locks {
		set.stops = append(set.stops, context.AfterFunc(l.Context(), func() { set.cancel(context.Cause(l.Context())) }))
	}
	if s.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseAttempt)
		defer cancel()
		_ = set.Release(rctx) // best effort: the locks go with the session anyway
		return nil, s.Err()
	}
	return set, nil
}

// Locks are the set's locks, sorted by name.
func (ls *LockSet) Locks() []*Lock { return slices.Clone(ls.locks) }

// Lock is the set's lock of that name, or nil.
func (ls *LockSet) Lock(name string) *Lock {
	for _, l := range ls.locks {
		if l.name == name {
			return l
		}
	}
	return nil
}

// Context ends when any lock of the set is released or lost; context.Cause
// tells why. Act on the set's resources only while it lives.
func (ls *LockSet) Context() context.Context { return ls.ctx }

// Release gives every lock of the set up (see Lock.Release), and returns
// their errors joined; a lock whose release failed can be released again
// by calling Release again.
func (ls *LockSet) Release(ctx context.Context) error {
	var errs []error
	for _, l := range ls.locks {
		if err := l.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.name, err))
		}
	}
	for _, stop := range ls.stops {
		stop()
	}
	ls.cancel(ErrLockReleased)
	return errors.Join(errs...)
}
