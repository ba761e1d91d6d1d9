package api

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
)

// Owners knows which principal owns each session: the one that created
// it. Under a policy, only the owner, or a principal allowed
// cluster.admin, may keep a session alive, close it, acquire or campaign
// with it, release its grants or resign its terms; a token alone is not
// a capability.
//
// A session's principal never changes, so it is cached once read; the
// cache is bounded and forgets everything when full.
type Owners struct {
	Sessions  *session.Manager
	Locks     *lock.Manager
	Elections *election.Manager

	mu   sync.Mutex
	byID map[session.ID]string
}

// ownersCacheSize bounds the cache of session principals.
const ownersCacheSize = 100_000

// Remember records a session's principal as it is created.
func (o *Owners) Remember(id session.ID, principal string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byID == nil || len(o.byID) >= ownersCacheSize {
		o.byID = map[session.ID]string{}
	}
	o.byID[id] = principal
}

func (o *Owners) principal(ctx context.Context, id session.ID) (string, error) {
	o.mu.Lock()
	p, ok := o.byID[id]
	o.mu.Unlock()
	if ok {
		return p, nil
	}
	info, err := o.Sessions.Get(ctx, id)
	if err != nil {
		return "", err
	}
	o.Remember(id, info.Principal)
	return info.Principal, nil
}

// check lets p act on ref if p owns the session ref names (or its grant
// or term belongs to one p owns), or p may administer the cluster.
// Something that does not exist is left to the call, which says so.
func (o *Owners) check(ctx context.Context, az *auth.Authorizer, p auth.Principal, ref ownedRef) error {
	for _, s := range ref.batch {
		if err := o.check(ctx, az, p, ownedRef{session: s}); err != nil {
			return err
		}
	}
	var id session.ID
	var err error
	switch {
	case ref.session != "":
		if id, err = session.ParseID(ref.session); err != nil {
			return nil // the call rejects the malformed id
		}
	case ref.lock != "" && ref.token > 0:
		id, err = o.Locks.GrantSession(ctx, ref.lock, fencing.Token(ref.token))
	case ref.election != "" && ref.token > 0:
		id, err = o.Elections.TermSession(ctx, ref.election, fencing.Token(ref.token))
	default:
		return nil // nothing named: the call rejects it
	}
	if err != nil {
		if ref.gone != nil && notFoundIsTheCalls(err) == nil {
			return ref.gone.New(fmt.Sprintf("token %d of %q does not hold now", ref.token, ref.lock+ref.election))
		}
		return notFoundIsTheCalls(err)
	}
	owner, err := o.principal(ctx, id)
	if err != nil {
		return notFoundIsTheCalls(err)
	}
	if owner == p.Name {
		return nil
	}
	if ok, _ := az.Allows(p, auth.ClusterAdmin, auth.Resource{}); ok {
		return nil
	}
	// The refusal names neither the owner nor, when the caller named a
	// grant or a term, the session that holds it: a caller who guessed or
	// replayed a token learns no more than that it is not theirs.
	what := fmt.Sprintf("session %s", id)
	switch {
	case ref.session != "":
	case ref.lock != "":
		what = fmt.Sprintf("the grant of token %d of lock %q", ref.token, ref.lock)
	default:
		what = fmt.Sprintf("term %d of election %q", ref.token, ref.election)
	}
	return errkind.PermissionDenied.New(fmt.Sprintf("auth: %s is not %s's: only the principal whose session it is, or one allowed cluster.admin, may use it", what, p.Name))
}

// notFoundIsTheCalls lets a call go on when what it names does not exist:
// the call itself answers not found (or not holder), as without a policy.
func notFoundIsTheCalls(err error) error {
	for _, k := range []*errkind.Kind{errkind.SessionNotFound, errkind.NotHolder, errkind.NotLeader} {
		if errors.Is(err, k) {
			return nil
		}
	}
	return err
}
