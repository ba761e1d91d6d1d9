package clientlib

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Admin acts on sessions, locks and elections by id, token and term,
// without keeping anything alive: for tools (coordctl, consoles) and for
// programs that manage sessions themselves. Programs that hold locks or
// lead should use Client.NewSession, Session.Lock and Session.Campaign,
// which keep the session alive and tell when something is lost.
//
// An Admin is obtained from Client.Admin and shares the Client's
// connection; it is safe for concurrent use.
type Admin struct{ c *Client }

// Admin returns the raw, by-id calls of c.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

// CreateSession creates a session that nobody keeps alive: it ends after
// ttl unless KeepAliveSession renews it.
func (a *Admin) CreateSession(ctx context.Context, ttl time.Duration, owner, hostname string, labels map[string]string) (SessionInfo, error) {
	resp, err := a.c.sessions.CreateSession(ctx, &coorddv1.CreateSessionRequest{Ttl: durationpb.New(ttl), Owner: owner, Hostname: hostname, Labels: labels})
	if err != nil {
		return SessionInfo{}, convert(ctx, err)
	}
	return sessionInfo(resp.GetSession()), nil
}

// KeepAliveSession renews a session once and returns the TTL granted.
func (a *Admin) KeepAliveSession(ctx context.Context, id string) (time.Duration, error) {
	resp, err := a.c.sessions.KeepAlive(ctx, &coorddv1.KeepAliveRequest{SessionId: id})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return resp.GetTtl().AsDuration(), nil
}

// LockGrant is a grant made to a session by id.
type LockGrant struct {
	Name      string
	Token     fencing.Token
	SessionID string
	RequestID string
	Revision  int64
	Read      bool // a read grant (Shared)
}

// Acquire takes a lock for the session sessionID (which the caller keeps
// alive), waiting as long as ctx allows. It is not retried: a failure
// after the request may have reached the server leaves a grant or a
// waiter that the session's end (or Release) removes.
func (a *Admin) Acquire(ctx context.Context, sessionID, name string, opts ...LockOption) (LockGrant, error) {
	return a.acquire(ctx, sessionID, name, true, opts)
}

// TryAcquire takes a lock for the session sessionID only if it is free
// now; otherwise it returns ErrLockHeld.
func (a *Admin) TryAcquire(ctx context.Context, sessionID, name string, opts ...LockOption) (LockGrant, error) {
	return a.acquire(ctx, sessionID, name, false, opts)
}

func (a *Admin) acquire(ctx context.Context, sessionID, name string, wait bool, opts []LockOption) (LockGrant, error) {
	o := lockOptions{limit: 1}
	for _, opt := range opts {
		opt.applyLock(&o)
	}
	g, err := a.c.acquire(ctx, sessionID, name, wait, 0, o) // no stream follows an admin grant
	if err != nil {
		return LockGrant{}, convert(ctx, err)
	}
	return LockGrant{Name: g.GetName(), Token: fencing.Token(g.GetToken()), SessionID: g.GetSessionId(), RequestID: g.GetRequestId(), Revision: g.GetRevision(), Read: g.GetRead()}, nil
}

// AcquireAll takes every named lock for the session sessionID, all or
// none, as Session.LockAll does, and returns the grants sorted by name. It
// is not retried (see Acquire); a retry by the caller with the same
// WithRequestID resumes the same grants.
func (a *Admin) AcquireAll(ctx context.Context, sessionID string, names []string, opts ...LockOption) ([]LockGrant, error) {
	o := lockOptions{limit: 1}
	for _, opt := range opts {
		opt.applyLock(&o)
	}
	resp, err := a.c.locks.AcquireAll(ctx, &coorddv1.AcquireAllRequest{Names: names, SessionId: sessionID, RequestId: o.requestID, Metadata: o.metadata, Wait: serverWait(ctx)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	out := make([]LockGrant, 0, len(resp.GetGrants()))
	for _, g := range resp.GetGrants() {
		out = append(out, LockGrant{Name: g.GetName(), Token: fencing.Token(g.GetToken()), SessionID: g.GetSessionId(), RequestID: g.GetRequestId(), Revision: g.GetRevision()})
	}
	return out, nil
}

// Release ends, from outside, the grant that token names (ErrNotHolder if
// it holds nothing): Revoke without its outcome. Its holder is asked
// first, so the call returns once the holder let go or the bound passed.
func (a *Admin) Release(ctx context.Context, name string, token fencing.Token, opts ...RevokeOption) error {
	_, err := a.Revoke(ctx, name, token, opts...)
	return err
}

// ListLocks returns the names of locks with holders or waiters that start
// with prefix.
func (a *Admin) ListLocks(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := a.c.locks.ListLocks(ctx, &coorddv1.ListLocksRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNames(), resp.GetNextPageToken(), err
	})
}

// ListElections returns the names of elections with a leader or candidates
// that start with prefix.
func (a *Admin) ListElections(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := a.c.elections.ListElections(ctx, &coorddv1.ListElectionsRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNames(), resp.GetNextPageToken(), err
	})
}

// Campaign campaigns for the session sessionID (which the caller keeps
// alive) and returns the term once it leads. Each call is a new campaign
// (a random id) unless WithRequestID names one: a retry with the same
// session and id, after a timeout or a lost answer, resumes that campaign
// (or returns its term) instead of queueing a second candidacy.
func (a *Admin) Campaign(ctx context.Context, sessionID, name, value string, opts ...CampaignOption) (fencing.Token, error) {
	var o campaignOptions
	for _, opt := range opts {
		opt.applyCampaign(&o)
	}
	if o.requestID == "" {
		o.requestID = randomID()
	}
	resp, err := a.c.elections.Campaign(ctx, &coorddv1.CampaignRequest{Name: name, SessionId: sessionID, Value: value, RequestId: o.requestID,
		Priority: o.priority, Preempt: o.preempt})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return fencing.Token(resp.GetLeadership().GetTerm()), nil
}

// Proclaim replaces the value of the leader whose term is term.
func (a *Admin) Proclaim(ctx context.Context, name string, term fencing.Token, value string) error {
	_, err := a.c.elections.Proclaim(ctx, &coorddv1.ProclaimRequest{Name: name, Term: int64(term), Value: value})
	return convert(ctx, err)
}

// Resign ends, from outside, the leadership whose term is term:
// RevokeLeadership without its outcome. The leader is asked first, so the
// call returns once it stepped down or the bound passed.
func (a *Admin) Resign(ctx context.Context, name string, term fencing.Token, opts ...RevokeOption) error {
	_, err := a.RevokeLeadership(ctx, name, term, opts...)
	return err
}

// Transfer hands the leadership whose term is term to a waiting campaign
// of the session successor (its first in line, or the one
// WithRequestID names) in one commit, and returns the successor's
// term.
func (a *Admin) Transfer(ctx context.Context, name string, term fencing.Token, successor string, opts ...TransferOption) (fencing.Token, error) {
	var o transferOptions
	for _, opt := range opts {
		opt.applyTransfer(&o)
	}
	resp, err := a.c.elections.Transfer(ctx, &coorddv1.TransferRequest{Name: name, Term: int64(term), SuccessorSessionId: successor, SuccessorRequestId: o.requestID})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return fencing.Token(resp.GetTerm()), nil
}

// allNames gathers the pages page returns, from the first (token "") to
// the one with no next token.
func allNames(ctx context.Context, page func(token string) ([]string, string, error)) ([]string, error) {
	var out []string
	token := ""
	for {
		names, next, err := page(token)
		if err != nil {
			return nil, convert(ctx, err)
		}
		out = append(out, names...)
		if token = next; token == "" {
			return out, nil
		}
	}
}

// SessionInfo describes a session as the server sees it.
type SessionInfo struct {
	ID        string
	TTL       time.Duration
	Owner     string
	Hostname  string
	Labels    map[string]string
	Created   time.Time
	Remaining time.Duration // filled by GetSession and ListSessionsDetailed
	// Principal owns the session (empty when coordd runs without a
	// policy): only it, or a principal allowed cluster.admin, may use it.
	Principal string
	// Locks it holds or waits for and Elections it leads or campaigns in,
	// sorted (filled by GetSession and ListSessionsDetailed).
	Locks, Elections []string
}

func sessionInfo(s *coorddv1.Session) SessionInfo {
	return SessionInfo{
		ID:        s.GetId(),
		TTL:       s.GetTtl().AsDuration(),
		Owner:     s.GetOwner(),
		Hostname:  s.GetHostname(),
		Labels:    s.GetLabels(),
		Created:   s.GetCreateTime().AsTime(),
		Remaining: s.GetRemainingTtl().AsDuration(),
		Principal: s.GetPrincipal(),
		Locks:     s.GetLocks(),
		Elections: s.GetElections(),
	}
}

// GetSession returns a live session by id, or ErrSessionNotFound.
func (a *Admin) GetSession(ctx context.Context, id string) (SessionInfo, error) {
	resp, err := a.c.sessions.GetSession(ctx, &coorddv1.GetSessionRequest{SessionId: id})
	if err != nil {
		return SessionInfo{}, convert(ctx, err)
	}
	return sessionInfo(resp.GetSession()), nil
}

// ListSessions returns every live session, in id order.
func (a *Admin) ListSessions(ctx context.Context) ([]SessionInfo, error) {
	return a.listSessions(ctx, false)
}

// ListSessionsDetailed is ListSessions with each session's Remaining,
// Locks and Elections filled in (the server reads each session's lease:
// use it for tens or hundreds of sessions, not for a million).
func (a *Admin) ListSessionsDetailed(ctx context.Context) ([]SessionInfo, error) {
	return a.listSessions(ctx, true)
}

func (a *Admin) listSessions(ctx context.Context, detailed bool) ([]SessionInfo, error) {
	var out []SessionInfo
	token := ""
	size := int32(1000)
	if detailed {
		size = 100
	}
	for {
		resp, err := a.c.sessions.ListSessions(ctx, &coorddv1.ListSessionsRequest{PageSize: size, PageToken: token, Detailed: detailed})
		if err != nil {
			return nil, convert(ctx, err)
		}
		for _, s := range resp.GetSessions() {
			out = append(out, sessionInfo(s))
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// CloseSession closes a session by id, from outside (for example one left
// by a crashed process), and releases everything attached to it: each lock
// grant and leadership it holds is revoked first, as Revoke does (its
// holder asked, the next holder granted once it lets go or the bound
// passes; Force skips asking). It is retried while coordd is unavailable.
func (a *Admin) CloseSession(ctx context.Context, id string, opts ...RevokeOption) error {
	var o revokeOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.holder != "" && o.holder != id {
		return fmt.Errorf("%w: AsHolder(%q) names another session than the one closed (%q)", ErrInvalidArgument, o.holder, id)
	}
	req := &coorddv1.CloseSessionRequest{SessionId: id, ByOwner: o.holder != "", Force: o.force, RevokeWait: o.waitProto()}
	n, err := a.c.retry(ctx, 0, func(ctx context.Context) error {
		_, err := a.c.sessions.CloseSession(ctx, req)
		return err
	})
	if n > 1 && errors.Is(err, ErrSessionNotFound) {
		return nil // an earlier attempt closed it; its answer was lost
	}
	return err
}

// LockEntry is a holder or waiter of a lock.
type LockEntry struct {
	SessionID string
	Owner     string // the session's owner, if the session still exists
	Hostname  string
	RequestID string
	Metadata  string
	Token     fencing.Token
	Enqueued  time.Time
	Granted   time.Time // zero for waiters
	Read      bool      // a read grant or wait of a read/write lock
	// RevokingSince, on a holder, is when a release from outside asked it
	// to let go (zero if none is under way); RevokingUntil is when the
	// grant ends if it has not by then.
	RevokingSince, RevokingUntil time.Time
}

// LockState is a lock's holders and waiters at one revision: all of them,
// or one page of a crowded lock's queue (see DescribeLockPage).
type LockState struct {
	Name    string
	Limit   int
	Holders []LockEntry
	Waiters []LockEntry // in grant order
	// HolderCount and WaiterCount count the lock's holders and waiters,
	// those of other pages included.
	HolderCount, WaiterCount int
	// NextPageToken, when not empty, fetches the page that follows
	// (LockPage.Token).
	NextPageToken string
	// DelayedUntil, when not zero, ends a lock-delay: a holder's session
	// expired and the first waiter is granted then.
	DelayedUntil time.Time
	Revision     int64
}

// DescribeLock returns the named lock's holder and waiter counts and its
// first 1000 holders and waiters (all of them, unless a crowd waits:
// NextPageToken then continues, with DescribeLockPage).
func (a *Admin) DescribeLock(ctx context.Context, name string) (LockState, error) {
	return a.DescribeLockPage(ctx, name, LockPage{Size: maxLockPage})
}

// maxLockPage is the most entries one page of a lock's queue holds.
const maxLockPage = 1000

// LockPage selects a page of a lock's queue.
type LockPage struct {
	// Size is the most holders and waiters to return, in queue order
	// (holders first): 1-1000, 100 when zero.
	Size int
	// Token is the previous page's NextPageToken ("": the first page).
	Token string
}

// DescribeLockPage returns the named lock's holder and waiter counts and
// one page of its queue. On a member where a crowd waits, a page costs
// O(log n + page size), however long the queue.
func (a *Admin) DescribeLockPage(ctx context.Context, name string, p LockPage) (LockState, error) {
	resp, err := a.c.locks.DescribeLock(ctx, &coorddv1.DescribeLockRequest{Name: name, PageSize: int32(p.Size), PageToken: p.Token})
	if err != nil {
		return LockState{}, convert(ctx, err)
	}
	return lockStateFrom(resp), nil
}

// WatchLock calls fn with the lock's state (its counts and first 1000
// holders and waiters, as DescribeLock) at once and again after every
// change of its holders, waiters or lock-delay (a burst may come as one
// call), until ctx ends or fn fails; it returns fn's error, or ctx's. It
// does not reconnect: a broken stream ends it with the error.
func (a *Admin) WatchLock(ctx context.Context, name string, fn func(LockState) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := a.c.locks.WatchLock(ctx, &coorddv1.WatchLockRequest{Name: name, PageSize: maxLockPage})
	if err != nil {
		return convert(ctx, err)
	}
	for {
		msg, err := st.Recv()
		if err != nil {
			return convert(ctx, err)
		}
		if err := fn(lockStateFrom(msg.GetLock())); err != nil {
			return err
		}
	}
}

func lockStateFrom(resp *coorddv1.DescribeLockResponse) LockState {
	st := LockState{Name: resp.GetName(), Limit: int(resp.GetLimit()), Revision: resp.GetRevision(),
		HolderCount: int(resp.GetHolderCount()), WaiterCount: int(resp.GetWaiterCount()), NextPageToken: resp.GetNextPageToken()}
	if resp.GetDelayedUntil() != nil {
		st.DelayedUntil = resp.GetDelayedUntil().AsTime()
	}
	entry := func(e *coorddv1.LockEntry) LockEntry {
		le := LockEntry{SessionID: e.GetSessionId(), Owner: e.GetOwner(), Hostname: e.GetHostname(), RequestID: e.GetRequestId(), Metadata: e.GetMetadata(), Token: fencing.Token(e.GetToken()), Enqueued: e.GetEnqueueTime().AsTime(), Read: e.GetRead()}
		if e.GetGrantTime() != nil {
			le.Granted = e.GetGrantTime().AsTime()
		}
		if e.GetRevokingSince() != nil {
			le.RevokingSince, le.RevokingUntil = e.GetRevokingSince().AsTime(), e.GetRevokingUntil().AsTime()
		}
		return le
	}
	for _, e := range resp.GetHolders() {
		st.Holders = append(st.Holders, entry(e))
	}
	for _, e := range resp.GetWaiters() {
		st.Waiters = append(st.Waiters, entry(e))
	}
	return st
}
