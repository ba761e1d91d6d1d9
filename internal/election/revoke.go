package election

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/session"
)

// markKey is the revocation mark of term (see package revoke).
func (m *Manager) markKey(name string, term fencing.Token) string {
	return m.prefix(name) + "revoke/" + strconv.FormatInt(int64(term), 10)
}

// revokedKey records the last revocation of the election that did not end
// by the leader's own resignation (revoke.Ended), bound to the old
// leader's session.
func (m *Manager) revokedKey(name string) string { return m.prefix(name) + "revoked" }

// Revoke ends the leadership whose term is term for someone other than
// the leader (an operator, a tool): the leader is asked first (Observe
// reports REVOKING, the leader's keep-alive stream names it) and the next
// leader is elected once it resigns, or once o's bound has passed (see
// package revoke); with o.Force at once, without asking. It returns how
// the revocation ended, and fails with ErrNotLeader when term does not
// lead.
//
// The wait outlives ctx: a caller that gives up leaves the term to end at
// its bound.
func (m *Manager) Revoke(ctx context.Context, name string, term fencing.Token, o revoke.Options) (revoke.Revocation, error) {
	if err := validateTerm(name, term); err != nil {
		return revoke.Revocation{}, err
	}
	if o.Wait < 0 {
		return revoke.Revocation{}, fmt.Errorf("%w: a revocation's wait cannot be negative", ErrInvalid)
	}
	kv, leads, err := m.leading(ctx, name, term)
	if err != nil {
		return revoke.Revocation{}, err
	}
	if !leads {
		return revoke.Revocation{}, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
	}
	seat, lease := string(kv.Key), kv.Lease
	if o.Force {
		rec := revoke.Ended{Token: int64(term), Outcome: revoke.Forced}
		err := m.resign(ctx, name, term, session.Hint{}, m.revokedOps(name, rec, lease))
		return revoke.Revocation{Outcome: revoke.Forced}, err
	}
	r, gone, err := revoke.Ask{W: m.dels, BG: &m.bg, Txns: m.txns, TxnName: m.queue(name), Entry: seat, Token: int64(term),
		Lease: lease, MarkKey: m.markKey(name, term), Now: m.now,
		End: func(ctx context.Context, mark revoke.Mark) error {
			rec := revoke.Ended{Token: int64(term), Outcome: revoke.Bound, Since: mark.Since}
			err := m.resign(ctx, name, term, session.Hint{}, m.revokedOps(name, rec, lease))
			if errors.Is(err, ErrNotLeader) {
				return nil // it stepped down at the last moment
			}
			return err
		},
	}.Run(ctx, o)
	switch {
	case err != nil:
		return revoke.Revocation{}, fmt.Errorf("election: revoke %q: %w", name, err)
	case gone:
		return revoke.Revocation{}, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
	}
	return r, nil
}

// revokedOps record rec in the election's revoked key, bound to lease.
func (m *Manager) revokedOps(name string, rec revoke.Ended, lease int64) []clientv3.Op {
	return []clientv3.Op{clientv3.OpPut(m.revokedKey(name), rec.Encode(), clientv3.WithLease(clientv3.LeaseID(lease)))}
}

// RevokeAll revokes, as Revoke does and all at once, the leaderships
// among keys (a session's keys: seats of any election, other keys are
// skipped), and returns how each revocation ended.
func (m *Manager) RevokeAll(ctx context.Context, keys []string, o revoke.Options) ([]revoke.Revocation, error) {
	var targets []revoke.Target
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, m.root)
		if !ok {
			continue
		}
		esc, sub, ok := strings.Cut(rest, "/")
		if ok && strings.HasPrefix(sub, "lead/") {
			targets = append(targets, revoke.Target{Name: names.Unescape(esc), Key: k})
		}
	}
	return revoke.All(ctx, m.cli, targets, func(ctx context.Context, t revoke.Target, term int64) (revoke.Revocation, error) {
		r, err := m.Revoke(ctx, t.Name, fencing.Token(term), o)
		if errors.Is(err, ErrNotLeader) {
			return revoke.Revocation{}, nil // ended meanwhile
		}
		return r, err
	})
}

// ResignRevoked is the leader's Resign (hint names its session) in answer
// to a revocation (see Revoke) that asked it to step down: the revocation
// is recorded as acknowledged, in the same commit.
func (m *Manager) ResignRevoked(ctx context.Context, name string, term fencing.Token, hint session.Hint) error {
	_, err := m.ResignAt(ctx, name, term, hint, true)
	return err
}
