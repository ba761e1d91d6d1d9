package clientlib

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// LockOption configures Lock, TryLock and the other acquisitions.
type LockOption interface{ applyLock(*lockOptions) }

// lockOption is a LockOption that sets one field.
type lockOption func(*lockOptions)

func (f lockOption) applyLock(o *lockOptions) { f(o) }

type lockOptions struct {
	limit     int
	requestID string
	metadata  string
	lockDelay time.Duration
	read      bool
}

// Shared asks for a read grant of a read/write lock: read grants are held
// together, a write grant (any acquisition without Shared) alone. The queue
// is FIFO across modes: a reader waits for the writers queued before it,
// and a queued writer keeps later readers out. Only for mutexes (no
// WithLimit). RLock and RunReadLocked use it.
func Shared() LockOption { return lockOption(func(o *lockOptions) { o.read = true }) }

// WithLimit makes the lock a semaphore that n sessions may hold at once.
// Every user of one lock must give the same n. Defaults to 1 (a mutex).
func WithLimit(n int) LockOption { return lockOption(func(o *lockOptions) { o.limit = n }) }

// WithRequestID sets a call's request id, its idempotency key within its
// session: an acquisition's (Lock, TryLock, RLock, LockAll, RunLocked,
// Admin.Acquire) or a campaign's (Campaign, WithElectionCampaign,
// Admin.Campaign); for Transfer, it names the successor's campaign (when
// its session campaigns more than once). By default the SDK picks one
// (random, or the id of this session's last released acquisition of the
// same lock, or resigned campaign of the same election) and reuses it when
// it retries; set it to resume an acquisition or a candidacy across
// process restarts of the same session.
func WithRequestID(id string) RequestIDOption { return RequestIDOption(id) }

// RequestIDOption is WithRequestID's option: a LockOption, a
// CampaignOption and a TransferOption.
type RequestIDOption string

func (r RequestIDOption) applyLock(o *lockOptions)         { o.requestID = string(r) }
func (r RequestIDOption) applyCampaign(o *campaignOptions) { o.requestID = string(r) }
func (r RequestIDOption) applyTransfer(o *transferOptions) { o.requestID = string(r) }

// WithLockDelay keeps the lock from the next waiter for d after this
// holder's session expires (not after Release), so a holder that lost its
// session has time to stop before anyone else acts. At most one minute.
func WithLockDelay(d time.Duration) LockOption {
	return lockOption(func(o *lockOptions) { o.lockDelay = d })
}

// WithMetadata attaches a note to the acquisition (who and why), shown by
// DescribeLock. At most 1024 bytes.
func WithMetadata(m string) LockOption {
	return lockOption(func(o *lockOptions) { o.metadata = m })
}

// Lock is a held lock. Act on the protected resource only while Context is
// not done, and pass Token with every access so the resource can reject a
// holder that lost the lock.
type Lock struct {
	*held
	s         *Session
	name      string
	token     fencing.Token
	requestID string
	read      bool
	ownID     bool // the SDK chose requestID: it may use it again once released
}

// ErrLockReleased is the cause of a lock's Context after Release.
var ErrLockReleased = errors.New("coordd: lock released")

// Lock acquires the named lock for the session, waiting as long as ctx
// allows. It fails with ctx's error when ctx ends first, with
// ErrSessionNotFound or the session's error when the session ends, and
// with ErrLimitMismatch when the lock has another limit. Unavailable
// servers are retried with the same request id, so a retry never takes the
// lock twice.
func (s *Session) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return s.lock(ctx, name, true, opts)
}

// RLock acquires a read grant of the named read/write lock, held together
// with other read grants and never with a write grant (Lock): as Lock with
// Shared.
func (s *Session) RLock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return s.lock(ctx, name, true, append(opts, Shared()))
}

// TryLock acquires the named lock only if it is free now; otherwise it
// returns ErrLockHeld.
func (s *Session) TryLock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return s.lock(ctx, name, false, opts)
}

func (s *Session) lock(ctx context.Context, name string, wait bool, opts []LockOption) (*Lock, error) {
	o := lockOptions{limit: 1}
	for _, opt := range opts {
		opt.applyLock(&o)
	}
	own := o.requestID == "" // the SDK's, not the caller's
	if own {
		o.requestID = s.ids.take(name, o.read)
	}
	// The call ends when the session does: a grant to a dead session is
	// worthless.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	var grant *coorddv1.LockGrant
	follow := s.followStream()
	_, err := s.c.retry(cctx, 0, func(ctx context.Context) (err error) {
		grant, err = s.c.acquire(ctx, s.id, name, wait, follow.stream, o)
		return err
	})
	if err != nil {
		if serr := s.Err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}

	l := s.heldLock(name, grant, follow, own)
	if s.Err() != nil {
		// The session ended while the grant was on its way. Try to hand the
		// lock back, briefly: the server may be the reason the session ended.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseAttempt)
		defer cancel()
		_ = l.Release(rctx) // best effort: the lock goes with the session anyway
		return nil, s.Err()
	}
	return l, nil
}

// heldLock tracks a grant the server made to s.
func (s *Session) heldLock(name string, grant *coorddv1.LockGrant, follow following, own bool) *Lock {
	l := &Lock{s: s, name: name, token: fencing.Token(grant.GetToken()), requestID: grant.GetRequestId(), read: grant.GetRead(), ownID: own}
	l.held = newHeld(s, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: name, Token: grant.GetToken(), RequestId: grant.GetRequestId(), Revision: grant.GetRevision()},
		func() error {
			return fmt.Errorf("%w: the server reports lock %q (token %d) released: by a Release from elsewhere (coordctl, an admin, another client with the token) or because its session was closed", ErrNotHolder, name, grant.GetToken())
		},
		followedOn(follow, grant.GetFollowed()), l.letGo)
	return l
}

// letGo tells the server that this holder gave the lock up when a release
// from outside asked it to (its context has ended): the holder's own
// release, which lets the next holder in. Retried while the session lives.
func (l *Lock) letGo() {
	req := &coorddv1.ReleaseRequest{Name: l.name, Token: int64(l.token), SessionId: l.s.id, RequestId: l.requestID, KeepaliveStream: l.s.followStream().stream, Revoked: true}
	_, err := l.s.c.retry(l.s.ctx, releaseAttempt, func(ctx context.Context) error {
		_, err := l.s.c.locks.Release(ctx, req)
		return err
	})
	switch {
	case err == nil:
		if l.ownID {
			l.s.ids.giveBack(l.name, l.read, l.requestID)
		}
	case !errors.Is(err, ErrNotHolder) && l.s.ctx.Err() == nil:
		l.s.lg.Warn("coordd: could not tell the server that a lock asked for was given up; it ends at the revocation's bound", "name", l.name, "token", l.token, "err", err)
	}
}

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Read reports a read grant (RLock, Shared): others may hold read grants
// at the same time; fenced writes (Put, Delete) need a write grant.
func (l *Lock) Read() bool { return l.read }

// Token is the grant's fencing token: pass it with every access to the
// protected resource.
func (l *Lock) Token() fencing.Token { return l.token }

// Context is cancelled when the lock is released or lost, no later than
// the session's local deadline; context.Cause tells why.
func (l *Lock) Context() context.Context { return l.context() }

// Lost is closed when the lock is lost without Release: its session ended,
// or the server reported the grant gone (released from outside this Lock,
// e.g. by an admin; context.Cause of Context then wraps ErrNotHolder). The
// server reports that within one round trip of the release, on the
// session's keep-alive stream.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// releaseAttempt bounds one Release (or Resign) call; see retry.
const releaseAttempt = 2 * time.Second

// Release gives the lock up, retrying while coordd or etcd is unavailable
// until ctx ends. It returns ErrNotHolder if the server no longer had this
// grant (its session ended first). Its Context ends at the first call.
// If it fails, the server holds the lock for the session until the
// session ends or a Release succeeds: calling it again tries again.
// Calling it again after it succeeded returns nil.
func (l *Lock) Release(ctx context.Context) error {
	tell, again := l.giveUp(ErrLockReleased)
	if !tell {
		return nil
	}
	req := &coorddv1.ReleaseRequest{Name: l.name, Token: int64(l.token), SessionId: l.s.id, RequestId: l.requestID, KeepaliveStream: l.s.followStream().stream}
	n, err := l.s.c.retry(ctx, releaseAttempt, func(ctx context.Context) error {
		resp, err := l.s.c.locks.Release(ctx, req)
		if err == nil {
			l.endedAt.Store(resp.GetRevision())
		}
		return err
	})
	if (n > 1 || again) && errors.Is(err, ErrNotHolder) {
		l.s.lg.Debug("coordd release: an earlier attempt released it", "name", l.name, "token", l.token, "attempts", n)
		err = nil // an earlier attempt released it; its answer was lost
	}
	l.told(err)
	if err == nil && l.ownID {
		l.s.ids.giveBack(l.name, l.read, l.requestID)
	}
	return err
}

// ReleasedAt is the etcd revision of the commit of this holder's Release:
// a history read from it (HistoryQuery.MinRevision) shows the grant's end.
// It is 0 until a Release succeeded, and stays 0 when an earlier attempt's
// answer was lost or the lock ended otherwise (released from outside, its
// session ended).
func (l *Lock) ReleasedAt() int64 { return l.endedAt.Load() }

// RunLocked runs fn while holding the named lock and releases it after, also
// when fn fails or panics. fn's context ends when the lock is lost; fn must
// stop then, and pass the lock's Token to every access of the protected
// resource (or write through the lock's fenced Put and Delete).
func RunLocked(ctx context.Context, s *Session, name string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) (err error) {
	l, err := s.Lock(ctx, name, opts...)
	if err != nil {
		return err
	}
	defer func() {
		// Keep trying for as long as the session lives: once it ends, the
		// lock is released anyway.
		rctx, cancel := context.WithCancel(s.Context())
		defer cancel()
		if rerr := l.Release(rctx); rerr != nil && err == nil && s.Err() == nil {
			err = fmt.Errorf("coordd: release %q: %w", name, rerr)
		}
	}()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.Context(), cancel)
	defer stop()
	return fn(fctx, l)
}

// RunReadLocked runs fn while holding a read grant of the named read/write
// lock, as RunLocked does with a write grant.
func RunReadLocked(ctx context.Context, s *Session, name string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
	return RunLocked(ctx, s, name, fn, append(opts, Shared())...)
}

// acquire sends one Acquire (wait) or TryAcquire call.
func (c *Client) acquire(ctx context.Context, sessionID, name string, wait bool, stream uint64, o lockOptions) (*coorddv1.LockGrant, error) {
	var delay *durationpb.Duration
	if o.lockDelay != 0 {
		delay = durationpb.New(o.lockDelay)
	}
	if wait {
		resp, err := c.locks.Acquire(ctx, &coorddv1.AcquireRequest{Name: name, SessionId: sessionID, Limit: int32(o.limit), RequestId: o.requestID, Metadata: o.metadata, LockDelay: delay, Read: o.read, KeepaliveStream: stream})
		return resp.GetGrant(), err
	}
	resp, err := c.locks.TryAcquire(ctx, &coorddv1.TryAcquireRequest{Name: name, SessionId: sessionID, Limit: int32(o.limit), RequestId: o.requestID, Metadata: o.metadata, LockDelay: delay, Read: o.read, KeepaliveStream: stream})
	return resp.GetGrant(), err
}

// requestIDs keeps the request ids of a session's released locks (or
// resigned campaigns), one per lock name and mode (per election), to use
// again for the next acquisition of that lock (campaign in it).
// The waiter entry's key is made of the session and the request id, and
// etcd's index keeps every key ever written until compaction: a key used
// again adds a version to one index entry, a new key adds an entry that
// every read of the lock's queue walks. A lock acquired and released by
// the same sessions again and again would otherwise walk thousands of
// dead keys per operation between compactions.
//
// An id is used again only after its Release succeeded: its entry is gone,
// so the next acquisition with it creates a new entry (a new token). A
// late write of an earlier attempt that turns up before the new
// acquisition writes is taken over by it (possibly after one UNAVAILABLE,
// which the SDK retries), and owns it then; an earlier attempt that turns
// up after the new acquisition wrote its entry is refused by the server
// and never takes that entry over.
type requestIDs struct {
	mu   sync.Mutex
	free map[requestIDKey]string
}

type requestIDKey struct {
	name string
	read bool
}

// maxFreeRequestIDs bounds the ids a session keeps.
const maxFreeRequestIDs = 1024

// take returns a released id of lock name in mode read, or a new one.
func (r *requestIDs) take(name string, read bool) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := requestIDKey{name, read}
	if id, ok := r.free[k]; ok {
		delete(r.free, k)
		return id
	}
	return randomID()
}

// giveBack keeps id, whose acquisition of lock name in mode read was
// released, for the next one.
func (r *requestIDs) giveBack(name string, read bool, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.free == nil {
		r.free = make(map[requestIDKey]string)
	}
	if len(r.free) < maxFreeRequestIDs {
		r.free[requestIDKey{name, read}] = id
	}
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
