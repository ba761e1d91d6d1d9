package api

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// LockServer adapts lock.Manager to coordd.v1.LockService.
type LockServer struct {
	coorddv1.UnsafeLockServiceServer // compile errors when the service grows

	m         *lock.Manager
	stopped   context.Context   // done once the daemon stops: ends WatchLock streams
	elections *election.Manager // fences by leadership term
	sessions  *session.Manager  // to name holders' owners in DescribeLock
	metrics   *Metrics

	// The rest: see LockOptions' fields of the same names.
	streams       *KeepAliveStreams
	tokensVisible func(ctx context.Context, lock string) bool
	waiters       *Waiters
	noRevocation  bool
	// pages seals DescribeLock's page tokens (LockOptions.PageTokenKey):
	// a token names the last entry of a page, whose fencing token the
	// caller may not see. nil: in the clear.
	pages *pageSealer
}

// LockOptions is what a LockServer is built from (NewLockServer).
type LockOptions struct {
	// Stopped is done once the daemon stops, which ends WatchLock streams
	// (and waits) with ErrStopping; required.
	Stopped context.Context
	// Locks is the lock manager served; required.
	Locks *lock.Manager
	// Elections fences by leadership term (a fenced call may name an
	// election instead of a lock); required.
	Elections *election.Manager
	// Sessions names holders' owners in DescribeLock; required.
	Sessions *session.Manager
	// Metrics counts what the adapter serves; nil: nothing is counted.
	Metrics *Metrics
	// Streams lets a grant be followed on its holder's shared keep-alive
	// stream from the moment it is made (keepalive_stream); nil: none is.
	Streams *KeepAliveStreams
	// TokensVisible says whether the caller may see a lock's tokens in
	// DescribeLock (under a policy: those allowed to release it); they are
	// zero otherwise. nil: every caller sees them.
	TokensVisible func(ctx context.Context, lock string) bool
	// Waiters bounds each principal's acquisitions in progress on this
	// member (shared with the ElectionServer's campaigns); nil: no bound.
	Waiters *Waiters
	// PageTokenKey (PageTokenKeyBytes long; every member of a cluster uses
	// the same) seals DescribeLock's page tokens; nil: tokens are in the
	// clear.
	PageTokenKey []byte
	// NoRevocation, for tests only, ends a grant released from outside at
	// once, as before the revocation hand-shake: its holder hears after
	// the next holder is granted. A test shows the overlaps it lets
	// through. false: the holder is asked first.
	NoRevocation bool
}

// NewLockServer returns the LockService adapter. It fails only on a
// PageTokenKey of the wrong size.
func NewLockServer(o LockOptions) (*LockServer, error) {
	s := &LockServer{
		stopped: o.Stopped, m: o.Locks, elections: o.Elections, sessions: o.Sessions, metrics: o.Metrics,
		streams: o.Streams, tokensVisible: o.TokensVisible, waiters: o.Waiters, noRevocation: o.NoRevocation,
	}
	if o.PageTokenKey != nil {
		p, err := newPageSealer(o.PageTokenKey)
		if err != nil {
			return nil, err
		}
		s.pages = p
	}
	return s, nil
}

// fence picks what a fenced call's token must hold: the lock named lockName,
// or, when election is set instead, that election's leadership.
func (s *LockServer) fence(lockName, election string) (lock.Grantor, string, error) {
	switch {
	case election == "":
		return s.m, lockName, nil
	case lockName != "":
		return nil, "", invalid("set either a lock or an election, not both")
	default:
		return s.elections, election, nil
	}
}

// lockRequest builds a lock.Request from the fields Acquire and TryAcquire share.
func lockRequest(name, sessionID string, limit int32, requestID, metadata string, lockDelay *durationpb.Duration, read bool) (lock.Request, error) {
	id, err := session.ParseID(sessionID)
	if err != nil {
		return lock.Request{}, err
	}
	req := lock.Request{Name: name, Session: id, Limit: int(limit), RequestID: requestID, Metadata: metadata, Read: read}
	if lockDelay != nil {
		if err := lockDelay.CheckValid(); err != nil {
			return lock.Request{}, invalid("lock_delay: " + err.Error())
		}
		req.LockDelay = lockDelay.AsDuration()
	}
	return req, nil
}

// Acquire implements LockService.
func (s *LockServer) Acquire(ctx context.Context, req *coorddv1.AcquireRequest) (*coorddv1.AcquireResponse, error) {
	resp, err := s.acquire(ctx, nil, req)
	if err != nil {
		return nil, err
	}
	return resp.(*coorddv1.AcquireResponse), nil
}

// acquireOnStream is Acquire for the call stream: an acquisition that has
// to wait parks (see park.go) instead of holding its goroutine, and is
// answered when its turn comes or its wait ends. What it answers is what
// Acquire would.
func (s *LockServer) acquireOnStream(ctx context.Context, req *coorddv1.AcquireRequest) (any, error) {
	call, _ := parkableCall(ctx)
	return s.acquire(ctx, call, req)
}

// acquire serves an Acquire: it waits on its own goroutine when call is
// nil, and otherwise parks a wait, which call (the call's own context on
// its stream, see parkableCall) governs, and returns a later.
func (s *LockServer) acquire(ctx, call context.Context, req *coorddv1.AcquireRequest) (any, error) {
	lr, err := lockRequest(req.GetName(), req.GetSessionId(), req.GetLimit(), req.GetRequestId(), req.GetMetadata(), req.GetLockDelay(), req.GetRead())
	if err != nil {
		return nil, err
	}
	// The wait is bounded from now, before it parks and after.
	ctx, wait, cancel, finish, err := s.waiters.begin(ctx, call, req.GetWait())
	if err != nil {
		return nil, err
	}
	defer cancel()
	ctx, stop := untilStopped(ctx, s.stopped)
	defer stop()
	start, p := time.Now(), PrincipalFrom(ctx)
	answer := func(ctx context.Context, g lock.Grant, err error) (any, error) {
		defer finish() // after the grant is followed, which reads with ctx
		if err != nil {
			return nil, stoppingOr(ctx, err)
		}
		s.metrics.granted(time.Since(start), g.DelayWaited)
		return &coorddv1.AcquireResponse{Grant: s.followed(ctx, req.GetKeepaliveStream(), g)}, nil
	}
	if call == nil {
		g, err := s.m.Acquire(ctx, lr)
		return answer(ctx, g, err)
	}
	l := &later{}
	g, parked, err := s.m.AcquireLater(ctx, lr, lock.Later{Ctx: wait, Done: func(g lock.Grant, err error) {
		// wait has the call's end and deadline; the grant is followed on
		// the keep-alive stream as the caller's principal.
		l.complete(answer(context.WithValue(wait, principalKey{}, p), g, err))
	}})
	if parked {
		return l, nil
	}
	return answer(ctx, g, err)
}

// AcquireAll implements LockService.
func (s *LockServer) AcquireAll(ctx context.Context, req *coorddv1.AcquireAllRequest) (*coorddv1.AcquireAllResponse, error) {
	lr, err := lockRequest("", req.GetSessionId(), 1, req.GetRequestId(), req.GetMetadata(), nil, false)
	if err != nil {
		return nil, err
	}
	ctx, _, cancel, finish, err := s.waiters.begin(ctx, nil, req.GetWait())
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer finish()
	start := time.Now()
	gs, err := s.m.AcquireAll(ctx, req.GetNames(), lr)
	if err != nil {
		return nil, err
	}
	out := &coorddv1.AcquireAllResponse{}
	for _, g := range gs {
		s.metrics.granted(time.Since(start), g.DelayWaited)
		out.Grants = append(out.Grants, s.followed(ctx, req.GetKeepaliveStream(), g))
	}
	return out, nil
}

// TryAcquire implements LockService.
func (s *LockServer) TryAcquire(ctx context.Context, req *coorddv1.TryAcquireRequest) (*coorddv1.TryAcquireResponse, error) {
	lr, err := lockRequest(req.GetName(), req.GetSessionId(), req.GetLimit(), req.GetRequestId(), req.GetMetadata(), req.GetLockDelay(), req.GetRead())
	if err != nil {
		return nil, err
	}
	g, err := s.m.TryAcquire(ctx, lr)
	if err != nil {
		return nil, err
	}
	s.metrics.granted(-1, g.DelayWaited)
	return &coorddv1.TryAcquireResponse{Grant: s.followed(ctx, req.GetKeepaliveStream(), g)}, nil
}

// Release implements LockService.
func (s *LockServer) Release(ctx context.Context, req *coorddv1.ReleaseRequest) (*coorddv1.ReleaseResponse, error) {
	var hint session.Hint
	if req.GetSessionId() != "" {
		id, err := session.ParseID(req.GetSessionId())
		if err != nil {
			return nil, err
		}
		hint = session.Hint{Session: id, RequestID: req.GetRequestId()}
		if stream := req.GetKeepaliveStream(); stream != 0 && hint.RequestID != "" {
			s.streams.unfollow(ctx, stream, id, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: req.GetName(), Token: req.GetToken(), RequestId: hint.RequestID})
		}
	}
	if hint.Session == 0 && !s.noRevocation {
		// From outside: the holder is asked first (see lock.Revoke).
		o, err := revokeOptions(s.sessions, req.GetForce(), req.GetRevokeWait())
		if err != nil {
			return nil, err
		}
		r, err := s.m.Revoke(ctx, req.GetName(), fencing.Token(req.GetToken()), o)
		if err != nil {
			return nil, err
		}
		s.metrics.revoked("lock", r)
		return &coorddv1.ReleaseResponse{Revocation: revocationProto(r)}, nil
	}
	// revoked: the holder's answer to a revocation.
	rev, err := s.m.ReleaseAt(ctx, req.GetName(), fencing.Token(req.GetToken()), hint, req.GetRevoked() && hint.Session != 0)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ReleaseResponse{Revision: rev}, nil
}

// DescribeLock implements LockService.
func (s *LockServer) DescribeLock(ctx context.Context, req *coorddv1.DescribeLockRequest) (*coorddv1.DescribeLockResponse, error) {
	after, err := s.openPageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	d, err := s.m.DescribePage(ctx, req.GetName(), lock.Page{After: after, Size: int(req.GetPageSize())})
	if err != nil {
		return nil, err
	}
	return s.describeProto(ctx, d), nil
}

// openPageToken reads a DescribeLock page token ("": the first page).
func (s *LockServer) openPageToken(token string) (fencing.Token, error) {
	if token == "" {
		return 0, nil
	}
	var v uint64
	var err error
	if s.pages != nil {
		v, err = s.pages.openFor(lockPageTokenContext, token)
	} else {
		v, err = strconv.ParseUint(token, 10, 63)
	}
	if err != nil || v == 0 {
		return 0, invalid("page_token: not a page token of DescribeLock")
	}
	return fencing.Token(v), nil
}

func (s *LockServer) pageToken(after fencing.Token) string {
	switch {
	case after == 0:
		return ""
	case s.pages != nil:
		return s.pages.sealFor(lockPageTokenContext, uint64(after))
	default:
		return strconv.FormatInt(int64(after), 10)
	}
}

// WatchLock implements LockService.
func (s *LockServer) WatchLock(req *coorddv1.WatchLockRequest, stream coorddv1.LockService_WatchLockServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()
	err := s.m.Watch(ctx, req.GetName(), lock.Page{Size: int(req.GetPageSize())}, func(d lock.Description) error {
		return stream.Send(&coorddv1.WatchLockResponse{Lock: s.describeProto(ctx, d)})
	})
	return stoppingOr(ctx, err)
}

// describeProto is a lock's description as the caller may see it.
func (s *LockServer) describeProto(ctx context.Context, d lock.Description) *coorddv1.DescribeLockResponse {
	resp := &coorddv1.DescribeLockResponse{Name: d.Name, Limit: int32(d.Limit), Revision: d.Revision,
		HolderCount: int32(d.Holding), WaiterCount: int32(d.Waiting), NextPageToken: s.pageToken(d.Next)}
	if !d.DelayedUntil.IsZero() {
		resp.DelayedUntil = timestamppb.New(d.DelayedUntil)
	}
	// The owners of a page's sessions, in one read (a failed read
	// leaves them out, as a session that ended does).
	var ids []session.ID
	seen := map[session.ID]bool{}
	for _, e := range append(d.Holders, d.Waiters...) {
		if !seen[e.Session] {
			seen[e.Session] = true
			ids = append(ids, e.Session)
		}
	}
	owners, _ := s.sessions.Records(ctx, ids)
	for _, e := range d.Holders {
		resp.Holders = append(resp.Holders, entryProto(e, owners[e.Session]))
	}
	for _, e := range d.Waiters {
		resp.Waiters = append(resp.Waiters, entryProto(e, owners[e.Session]))
	}
	if s.tokensVisible != nil && !s.tokensVisible(ctx, d.Name) {
		for _, e := range append(resp.Holders, resp.Waiters...) {
			e.Token = 0
		}
	}
	return resp
}

// ListLocks implements LockService.
func (s *LockServer) ListLocks(ctx context.Context, req *coorddv1.ListLocksRequest) (*coorddv1.ListLocksResponse, error) {
	names, next, err := namesPage(req.GetPageSize(), req.GetPageToken(), func(after string, limit int) ([]string, error) {
		return s.m.List(ctx, req.GetPrefix(), after, limit)
	})
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListLocksResponse{Names: names, NextPageToken: next}, nil
}

// ValidateFence implements LockService.
func (s *LockServer) ValidateFence(ctx context.Context, req *coorddv1.ValidateFenceRequest) (*coorddv1.ValidateFenceResponse, error) {
	f, name, err := s.fence(req.GetName(), req.GetElection())
	if err != nil {
		return nil, err
	}
	if _, err := f.Holding(ctx, name, fencing.Token(req.GetToken())); err != nil {
		return nil, err
	}
	return &coorddv1.ValidateFenceResponse{}, nil
}

// FencedPut implements LockService.
func (s *LockServer) FencedPut(ctx context.Context, req *coorddv1.FencedPutRequest) (*coorddv1.FencedPutResponse, error) {
	f, name, err := s.fence(req.GetLock(), req.GetElection())
	if err != nil {
		return nil, err
	}
	rev, err := s.m.FencedPut(ctx, f, name, fencing.Token(req.GetToken()), req.GetKey(), string(req.GetValue()))
	s.metrics.fencedWrite(err)
	if err != nil {
		return nil, err
	}
	return &coorddv1.FencedPutResponse{Revision: rev}, nil
}

// FencedDelete implements LockService.
func (s *LockServer) FencedDelete(ctx context.Context, req *coorddv1.FencedDeleteRequest) (*coorddv1.FencedDeleteResponse, error) {
	f, name, err := s.fence(req.GetLock(), req.GetElection())
	if err != nil {
		return nil, err
	}
	rev, err := s.m.FencedDelete(ctx, f, name, fencing.Token(req.GetToken()), req.GetKey())
	s.metrics.fencedWrite(err)
	if err != nil {
		return nil, err
	}
	return &coorddv1.FencedDeleteResponse{Revision: rev}, nil
}

// followed returns g's proto, followed on the caller's keep-alive stream
// if it named one that this member serves.
func (s *LockServer) followed(ctx context.Context, stream uint64, g lock.Grant) *coorddv1.LockGrant {
	out := grantProto(g)
	if stream != 0 {
		out.Followed = s.streams.follow(ctx, stream, g.Session, &coorddv1.Holding{
			Kind: coorddv1.Holding_KIND_LOCK, Name: g.Name, Token: int64(g.Token), RequestId: g.RequestID, Revision: g.Revision,
		})
	}
	return out
}

func grantProto(g lock.Grant) *coorddv1.LockGrant {
	return &coorddv1.LockGrant{
		Name:      g.Name,
		Token:     int64(g.Token),
		SessionId: g.Session.String(),
		RequestId: g.RequestID,
		Revision:  g.Revision,
		Read:      g.Read,
	}
}

// entryProto describes a holder or waiter, with its session's owner and
// host when the session is still there (it may end at any moment).
func entryProto(e lock.Entry, owner session.Info) *coorddv1.LockEntry {
	out := &coorddv1.LockEntry{
		SessionId:   e.Session.String(),
		RequestId:   e.RequestID,
		Metadata:    e.Metadata,
		Token:       int64(e.Token),
		EnqueueTime: timestamppb.New(e.Enqueued),
		Read:        e.Read,
	}
	if !e.Since.IsZero() {
		out.GrantTime = timestamppb.New(e.Since)
	}
	if !e.RevokingSince.IsZero() {
		out.RevokingSince, out.RevokingUntil = timestamppb.New(e.RevokingSince), timestamppb.New(e.RevokingUntil)
	}
	out.Owner, out.Hostname = owner.Owner, owner.Hostname
	return out
}
