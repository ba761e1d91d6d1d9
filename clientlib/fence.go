package clientlib

import (
	"context"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Fence is what a fenced call is checked against: a lock grant's token, or
// an election leader's term. Set Token and exactly one of Lock and
// Election.
type Fence struct {
	Lock     string        // the lock's name, or
	Election string        // the election's name
	Token    fencing.Token // the grant's token or the leader's term
}

// ValidateFence returns nil if f's token holds its lock (or leads its
// election) now, and ErrStaleToken if not. The check is linearizable, but
// the answer can be stale by the time the caller acts on it: to protect a
// write, use FencedPut, which checks and writes in one transaction.
func (a *Admin) ValidateFence(ctx context.Context, f Fence) error {
	_, err := a.c.locks.ValidateFence(ctx, &coorddv1.ValidateFenceRequest{Name: f.Lock, Election: f.Election, Token: int64(f.Token)})
	return convert(ctx, err)
}

// FencedPut writes key in coordd's KV only if f's token holds its lock (or
// leads its election), in one etcd transaction with the check; otherwise
// it returns ErrStaleToken and writes nothing. It returns the write's
// revision.
func (a *Admin) FencedPut(ctx context.Context, f Fence, key string, value []byte) (int64, error) {
	resp, err := a.c.locks.FencedPut(ctx, &coorddv1.FencedPutRequest{Lock: f.Lock, Election: f.Election, Token: int64(f.Token), Key: key, Value: value})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return resp.GetRevision(), nil
}

// FencedDelete deletes key from coordd's KV only if f's token holds its
// lock (or leads its election), as FencedPut writes.
func (a *Admin) FencedDelete(ctx context.Context, f Fence, key string) (int64, error) {
	resp, err := a.c.locks.FencedDelete(ctx, &coorddv1.FencedDeleteRequest{Lock: f.Lock, Election: f.Election, Token: int64(f.Token), Key: key})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return resp.GetRevision(), nil
}

// Fence names this grant for fenced calls.
func (l *Lock) Fence() Fence { return Fence{Lock: l.name, Token: l.token} }

// Put writes key in coordd's KV only if this grant still holds the lock,
// in one etcd transaction with the check; otherwise it returns
// ErrStaleToken and writes nothing. It returns the write's revision. It is
// not retried: after ErrUnavailable the write may or may not have happened.
func (l *Lock) Put(ctx context.Context, key string, value []byte) (int64, error) {
	return l.s.c.Admin().FencedPut(ctx, l.Fence(), key, value)
}

// Delete deletes key from coordd's KV only if this grant still holds the
// lock, as Put writes.
func (l *Lock) Delete(ctx context.Context, key string) (int64, error) {
	return l.s.c.Admin().FencedDelete(ctx, l.Fence(), key)
}

// Validate returns nil if this grant holds the lock now, and ErrStaleToken
// if not (linearizable; the answer may be stale by the time it is used).
func (l *Lock) Validate(ctx context.Context) error {
	return l.s.c.Admin().ValidateFence(ctx, l.Fence())
}

// Fence names this term for fenced calls.
func (l *Leadership) Fence() Fence { return Fence{Election: l.name, Token: l.term} }

// Put writes key in coordd's KV only if this term still leads the
// election, in one etcd transaction with the check; otherwise it returns
// ErrStaleToken and writes nothing. It returns the write's revision. It is
// not retried: after ErrUnavailable the write may or may not have happened.
func (l *Leadership) Put(ctx context.Context, key string, value []byte) (int64, error) {
	return l.s.c.Admin().FencedPut(ctx, l.Fence(), key, value)
}

// Delete deletes key from coordd's KV only if this term still leads the
// election, as Put writes.
func (l *Leadership) Delete(ctx context.Context, key string) (int64, error) {
	return l.s.c.Admin().FencedDelete(ctx, l.Fence(), key)
}

// Validate returns nil if this term leads the election now, and
// ErrStaleToken if not (linearizable; the answer may be stale by the time
// it is used).
func (l *Leadership) Validate(ctx context.Context) error {
	return l.s.c.Admin().ValidateFence(ctx, l.Fence())
}
