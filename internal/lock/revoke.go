package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/session"
)

// markKey is the revocation mark of the grant whose token is token.
func (m *Manager) markKey(name string, token fencing.Token) string {
	return m.locks + escape(name) + "/revoke/" + strconv.FormatInt(int64(token), 10)
}

// revokedKey records the last revocation of the lock that did not end by
// acknowledgement (see revoke.Ended), bound to the revoked holder's session.
func (m *Manager) revokedKey(name string) string { return m.locks + escape(name) + "/revoked" }

// markPrefix is where a lock's revocation marks live.
func (m *Manager) markPrefix(name string) string { return m.locks + escape(name) + "/revoke/" }

// Revoke ends the grant that token names for someone other than its
// holder (an operator, a tool): the holder is asked first and the next
// holder is granted once it lets go, or once o's bound has passed (see
// package revoke); with o.Force at once, without asking. A waiting entry
// that holds nothing is removed at once. Revoke returns how the
// revocation ended. It fails with ErrNotHolder when the token names
// nothing (released meanwhile, or its session ended).
//
// The wait outlives ctx: a caller that gives up leaves the grant to end at
// its bound.
func (m *Manager) Revoke(ctx context.Context, name string, token fencing.Token, o revoke.Options) (revoke.Revocation, error) {
	if err := validateName(name); err != nil {
		return revoke.Revocation{}, err
	}
	if token <= 0 {
		return revoke.Revocation{}, fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	if o.Wait < 0 {
		return revoke.Revocation{}, fmt.Errorf("%w: a revocation's wait cannot be negative", ErrInvalid)
	}
	h, err := m.holder(ctx, name, token)
	if err != nil {
		return revoke.Revocation{}, err
	}
	if h.key == "" {
		return revoke.Revocation{}, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	if o.Force || !h.granted {
		out := revoke.Revocation{}
		if h.granted {
			out.Outcome = revoke.Forced
		}
		return out, m.end(ctx, name, token, h, out.Outcome, revoke.Mark{})
	}
	r, gone, err := revoke.Ask{W: m.dels, BG: &m.bg, Txns: m.txns, TxnName: m.queue(name), Entry: h.key, Token: int64(token),
		Lease: int64(h.session), MarkKey: m.markKey(name, token), Now: m.now,
		End: func(ctx context.Context, mark revoke.Mark) error {
			return m.end(ctx, name, token, h, revoke.Bound, mark)
		},
	}.Run(ctx, o)
	switch {
	case err != nil:
		return revoke.Revocation{}, fmt.Errorf("lock: revoke %q: %w", name, err)
	case gone:
		return revoke.Revocation{}, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	return r, nil
}

// end deletes the entry of h (token) and its revocation mark, and records
// outcome (when not empty) in the lock's revoked key. A forced end, like a
// release, deletes the holder's lock-delay record; an end at the bound
// keeps it, so that a holder which did not answer is treated as one whose
// session ended: the next grant sits out its lock-delay.
func (m *Manager) end(ctx context.Context, name string, token fencing.Token, h holderState, outcome revoke.Outcome, mark revoke.Mark) error {
	ops := []clientv3.Op{clientv3.OpDelete(h.key), clientv3.OpDelete(m.markKey(name, token))}
	if outcome != revoke.Bound {
		ops = append(ops, clientv3.OpDelete(m.heldPrefix(name)+strconv.FormatInt(int64(token), 10)))
	}
	if outcome != "" {
		rec := revoke.Ended{Token: int64(token), Outcome: outcome, Since: mark.Since}
		ops = append(ops, clientv3.OpPut(m.revokedKey(name), rec.Encode(), clientv3.WithLease(clientv3.LeaseID(h.session))))
	}
	resp, err := m.txns.Commit(ctx, groupcommit.Txn{
		Name: m.queue(name),
		If:   []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(h.key), "=", int64(token))},
		Then: ops,
	})
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", name, err)
	}
	if !resp.Succeeded && outcome != revoke.Bound {
		return fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	m.ids.Released(h.key)
	return nil
}

// RevokeAll revokes, as Revoke does and all at once, the grants among
// keys (a session's keys: entries of any lock; other keys, and entries
// that wait, are skipped), and returns how each revocation ended.
func (m *Manager) RevokeAll(ctx context.Context, keys []string, o revoke.Options) ([]revoke.Revocation, error) {
	var targets []revoke.Target
	for _, k := range keys {
		if name, ok := queue.NameOf(m.locks, k); ok {
			targets = append(targets, revoke.Target{Name: name, Key: k})
		}
	}
	return revoke.All(ctx, m.cli, targets, func(ctx context.Context, t revoke.Target, token int64) (revoke.Revocation, error) {
		// A waiting entry holds nothing to ask about: the session's end
		// removes it.
		if h, err := m.holder(ctx, t.Name, fencing.Token(token)); err != nil || !h.granted {
			return revoke.Revocation{}, err
		}
		r, err := m.Revoke(ctx, t.Name, fencing.Token(token), o)
		if errors.Is(err, ErrNotHolder) {
			return revoke.Revocation{}, nil // gone meanwhile
		}
		return r, err
	})
}

// acknowledged is what a release in answer to a revocation adds to its
// commit: the outcome, for the history (nothing for any other release).
func (m *Manager) acknowledged(name string, token fencing.Token, hint session.Hint, revoked bool) []clientv3.Op {
	if !revoked {
		return nil
	}
	rec := revoke.Ended{Token: int64(token), Outcome: revoke.Acknowledged}
	return []clientv3.Op{clientv3.OpPut(m.revokedKey(name), rec.Encode(), clientv3.WithLease(clientv3.LeaseID(hint.Session)))}
}
