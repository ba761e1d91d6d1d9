package clientlib

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Revocation says how a grant or a leadership taken from outside ended
// (Admin.Revoke, Admin.RevokeLeadership).
type Revocation struct {
	// Outcome: RevokeAcknowledged (the holder let go when asked),
	// RevokeBound (it did not within the bound: it may still believe it
	// holds; fencing protects) or RevokeForced (not asked); empty when the
	// token named a waiter, which held nothing.
	Outcome string
	// Waited is how long the server waited for the holder.
	Waited time.Duration
}

// Revocation outcomes.
const (
	RevokeAcknowledged = "acknowledged"
	RevokeBound        = "bound"
	RevokeForced       = "forced"
)

// RevokeOption configures a release or resignation from outside.
type RevokeOption func(*revokeOptions)

type revokeOptions struct {
	force  bool
	wait   time.Duration
	holder string
}

// Force ends the grant (or term) at once, without asking its holder: for a
// holder that hangs. The holder may still believe it holds while the next
// one does; only fencing protects.
func Force() RevokeOption { return func(o *revokeOptions) { o.force = true } }

// RevokeWithin bounds how long the server waits for the holder to let go
// (at most, and by default, the holder's session TTL).
func RevokeWithin(d time.Duration) RevokeOption { return func(o *revokeOptions) { o.wait = d } }

// AsHolder says the caller is the holder, the session sessionID's own
// process (for example a script that acquired with it): it has stopped
// acting on the grant, so the server ends it at once without asking
// anyone. For CloseSession, sessionID must be the session closed.
func AsHolder(sessionID string) RevokeOption { return func(o *revokeOptions) { o.holder = sessionID } }

func revocationOf(r *coorddv1.Revocation) Revocation {
	out := Revocation{Waited: r.GetWaited().AsDuration()}
	switch r.GetOutcome() {
	case coorddv1.Revocation_OUTCOME_ACKNOWLEDGED:
		out.Outcome = RevokeAcknowledged
	case coorddv1.Revocation_OUTCOME_BOUND:
		out.Outcome = RevokeBound
	case coorddv1.Revocation_OUTCOME_FORCED:
		out.Outcome = RevokeForced
	}
	return out
}

func (o revokeOptions) waitProto() *durationpb.Duration {
	if o.wait <= 0 {
		return nil
	}
	return durationpb.New(o.wait)
}

// Revoke ends, from outside, the grant that token names: the server asks
// its holder first (its SDK ends the lock's Context and lets go) and
// grants the next waiter only then, or once the bound passes (the
// holder's session TTL, or RevokeWithin). It returns how the revocation
// ended, and ErrNotHolder if the token holds nothing. It is retried while
// coordd is unavailable (a retry joins the revocation under way); when an
// earlier attempt ended the grant and its answer was lost, the outcome is
// empty.
func (a *Admin) Revoke(ctx context.Context, name string, token fencing.Token, opts ...RevokeOption) (Revocation, error) {
	var o revokeOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &coorddv1.ReleaseRequest{Name: name, Token: int64(token), SessionId: o.holder, Force: o.force, RevokeWait: o.waitProto()}
	var resp *coorddv1.ReleaseResponse
	n, err := a.c.retry(ctx, 0, func(ctx context.Context) error {
		var err error
		resp, err = a.c.locks.Release(ctx, req)
		return err
	})
	if n > 1 && errors.Is(err, ErrNotHolder) {
		return Revocation{}, nil // an earlier attempt ended it; its answer was lost
	}
	if err != nil {
		return Revocation{}, err
	}
	return revocationOf(resp.GetRevocation()), nil
}

// RevokeLeadership ends, from outside, the leadership whose term is term:
// the leader is asked first (its SDK ends the leadership's Context and
// resigns) and the next leader is elected only then, or once the bound
// passes. It returns how the revocation ended, and ErrNotLeader if term
// does not lead.
func (a *Admin) RevokeLeadership(ctx context.Context, name string, term fencing.Token, opts ...RevokeOption) (Revocation, error) {
	var o revokeOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &coorddv1.ResignRequest{Name: name, Term: int64(term), SessionId: o.holder, Force: o.force, RevokeWait: o.waitProto()}
	var resp *coorddv1.ResignResponse
	n, err := a.c.retry(ctx, 0, func(ctx context.Context) error {
		var err error
		resp, err = a.c.elections.Resign(ctx, req)
		return err
	})
	if n > 1 && errors.Is(err, ErrNotLeader) {
		return Revocation{}, nil // an earlier attempt ended it; its answer was lost
	}
	if err != nil {
		return Revocation{}, err
	}
	return revocationOf(resp.GetRevocation()), nil
}
