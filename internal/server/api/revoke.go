package api

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// revokeOptions reads a release's or resignation's force and revoke_wait:
// the holder's session TTL bounds the wait (a holder that cannot answer
// within it would lose its session by then anyway).
func revokeOptions(sessions *session.Manager, force bool, wait *durationpb.Duration) (revoke.Options, error) {
	o := revoke.Options{Force: force}
	if wait != nil {
		if err := wait.CheckValid(); err != nil || wait.AsDuration() < 0 {
			return o, invalid("revoke_wait: must be a non-negative duration")
		}
		o.Wait = wait.AsDuration()
		if o.Wait == 0 {
			return o, invalid("revoke_wait: must be positive when set (force ends a grant at once)")
		}
	}
	o.TTL = func(ctx context.Context, id int64) (time.Duration, error) {
		info, err := sessions.Get(ctx, session.ID(id))
		if errors.Is(err, session.ErrNotFound) {
			return 0, nil // ending now: nobody is left to ask
		}
		if err != nil {
			return 0, err
		}
		return info.TTL, nil
	}
	return o, nil
}

// revocationProto is how a revocation ended, for a response or a history
// event; nil when nothing was revoked.
func revocationProto(r revoke.Revocation) *coorddv1.Revocation {
	out := &coorddv1.Revocation{Waited: durationpb.New(r.Waited)}
	switch r.Outcome {
	case revoke.Acknowledged:
		out.Outcome = coorddv1.Revocation_OUTCOME_ACKNOWLEDGED
	case revoke.Bound:
		out.Outcome = coorddv1.Revocation_OUTCOME_BOUND
	case revoke.Forced:
		out.Outcome = coorddv1.Revocation_OUTCOME_FORCED
	default:
		return nil
	}
	return out
}
