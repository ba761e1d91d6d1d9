package lock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/coordd/coordd/internal/session"
)

// MaxLocksPerSet bounds AcquireAll's set.
const MaxLocksPerSet = 64

// AcquireAll takes every named lock for req.Session, all or none, and
// returns their grants sorted by name. It queues for them one at a time
// in the order of their names: two calls for overlapping sets, whatever
// order they name them in, take their common locks in the same order, so
// neither holds a lock the other waits for while waiting for one the
// other holds (no deadlock between AcquireAll calls; a caller that holds
// one lock by Acquire and then asks AcquireAll for a set with a lock
// sorted before it can still wait in a cycle). Each lock's queue stays
// first come, first served. If a lock cannot be had (ctx ends, the
// session ends, an error), the grants made are released and the wait in
// progress leaves nothing queued.
//
// Each lock's request id is derived from req.RequestID and the lock's
// name, so a retry with the same RequestID resumes the same grants; with
// none, a random one is picked (a retry then starts again). req.Limit
// and req.Read must be unset: every lock of a set is a mutex, taken for
// writing.
func (m *Manager) AcquireAll(ctx context.Context, names []string, req Request) ([]Grant, error) {
	if len(names) == 0 || len(names) > MaxLocksPerSet {
		return nil, fmt.Errorf("%w: name 1 to %d locks", ErrInvalid, MaxLocksPerSet)
	}
	if req.Limit > 1 || req.Read {
		return nil, fmt.Errorf("%w: the locks of a set are mutexes taken for writing (no limit, no read)", ErrInvalid)
	}
	sorted := slices.Sorted(slices.Values(names))
	for i, n := range sorted {
		if err := validateName(n); err != nil {
			return nil, err
		}
		if i > 0 && sorted[i-1] == n {
			return nil, fmt.Errorf("%w: lock %q is named twice", ErrInvalid, n)
		}
	}
	base := req.RequestID
	if base == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		base = hex.EncodeToString(b)
	} else if err := validateRequestID(base); err != nil {
		return nil, err
	}
	grants := make([]Grant, 0, len(sorted))
	for _, n := range sorted {
		r := req
		r.Name, r.Limit, r.RequestID = n, 1, setMemberID(base, n)
		g, err := m.Acquire(ctx, r)
		if err != nil {
			err = fmt.Errorf("lock: taking %q of a set of %d: %w", n, len(sorted), err)
			if rerr := m.releaseSet(context.WithoutCancel(ctx), grants); rerr != nil {
				err = fmt.Errorf("%w (and giving back the locks of the set already taken failed, so they stay with the session: %w)", err, rerr)
			}
			return nil, err
		}
		grants = append(grants, g)
	}
	return grants, nil
}

// setMemberID is a set member's request id: the same for the same set
// request id and lock name, and within the request id alphabet.
func setMemberID(base, name string) string {
	sum := sha256.Sum256([]byte(base + "\x00" + name))
	return "set-" + hex.EncodeToString(sum[:16])
}

// releaseSet gives up the grants of a set that could not be completed; a
// grant already gone (its session ended) is no error. A release that
// fails is tried again for up to releaseSetFor (a release is idempotent):
// the failure that ended the set is often etcd's leadership moving, which
// refuses the first release too, and a grant left behind stays with the
// session under the set's request id, where only a retry with that id
// (or the session's end) frees it.
func (m *Manager) releaseSet(ctx context.Context, grants []Grant) error {
	var errs []error
	for _, g := range grants {
		err := m.releaseRetrying(ctx, g)
		if err != nil && !errors.Is(err, ErrNotHolder) {
			errs = append(errs, fmt.Errorf("%q: %w", g.Name, err))
		}
	}
	return errors.Join(errs...)
}

// releaseSetFor bounds the tries of one release in releaseSet.
const releaseSetFor = 3 * time.Second

func (m *Manager) releaseRetrying(ctx context.Context, g Grant) error {
	ctx, cancel := context.WithTimeout(ctx, releaseSetFor)
	defer cancel()
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		err := m.Release(ctx, g.Name, g.Token, session.Hint{Session: g.Session, RequestID: g.RequestID})
		if err == nil || errors.Is(err, ErrNotHolder) || errors.Is(err, ErrSessionNotFound) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
