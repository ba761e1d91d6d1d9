package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// SessionServer adapts session.Manager to coordd.v1.SessionService.
type SessionServer struct {
	coorddv1.UnsafeSessionServiceServer // compile errors when the service grows

	m        *session.Manager
	holdings Holdings
	stopping <-chan struct{}
	metrics  *Metrics

	// The rest: see SessionOptions' fields of the same names.
	noRevocation    bool
	seesAll         func(ctx context.Context) bool
	streams         *KeepAliveStreams
	maxRequestBytes int
	callStream      *CallServer
	// pages seals ListSessions' page tokens (SessionOptions.PageTokenKey);
	// nil: a token is the last session id read, in the clear.
	pages *pageSealer
}

// SessionOptions is what a SessionServer is built from (NewSessionServer).
type SessionOptions struct {
	// Sessions is the session manager served; required.
	Sessions *session.Manager
	// Holdings is where KeepAliveStream watches a session's holdings;
	// required (see Holdings).
	Holdings Holdings
	// Stopping, once closed, ends streams with ErrStopping; nil: they
	// end only with their callers.
	Stopping <-chan struct{}
	// Metrics counts what the adapter serves; nil: nothing is counted.
	Metrics *Metrics
	// Streams registers the shared keep-alive streams so that grants on
	// this member are followed on them from the moment they are made (the
	// Lock and Election servers share it); nil: none is followed.
	Streams *KeepAliveStreams
	// MaxRequestBytes is the server's limit on one message, which bounds a
	// batch of renewals; 0: gRPC's default.
	MaxRequestBytes int
	// PageTokenKey (PageTokenKeyBytes long, the same on every member)
	// seals ListSessions' page tokens, so that a token does not name a
	// session the caller may not see; nil: tokens are in the clear.
	PageTokenKey []byte
	// SeesAll says whether the caller may read every session (an
	// operator); others read only the sessions they created: GetSession
	// of another's is PermissionDenied, ListSessions leaves them out (so
	// a page may hold fewer than page_size sessions while a
	// next_page_token follows). nil: every caller sees all.
	SeesAll func(ctx context.Context) bool
	// CallStream serves the Calls stream; nil ends it with UNIMPLEMENTED.
	CallStream *CallServer
	// NoRevocation, for tests only: see LockOptions.NoRevocation; false:
	// sessions closed from outside revoke their holdings first.
	NoRevocation bool
}

// NewSessionServer returns the SessionService adapter. It fails only on a
// PageTokenKey of the wrong size.
func NewSessionServer(o SessionOptions) (*SessionServer, error) {
	s := &SessionServer{
		m: o.Sessions, holdings: o.Holdings, stopping: o.Stopping, metrics: o.Metrics,
		noRevocation: o.NoRevocation, seesAll: o.SeesAll, streams: o.Streams,
		maxRequestBytes: o.MaxRequestBytes, callStream: o.CallStream,
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

// mayRead reports whether the caller may read info.
func (s *SessionServer) mayRead(ctx context.Context, info session.Info) bool {
	return s.seesAll == nil || s.seesAll(ctx) || (info.Principal != "" && info.Principal == PrincipalFrom(ctx).Name)
}

// Holdings is what KeepAliveStream needs to watch a session's holdings:
// where their entries live and a watcher of those entries. All three are
// required.
type Holdings struct {
	Watcher   *grantwatch.Watcher
	Locks     *lock.Manager
	Elections *election.Manager
}

// CreateSession implements SessionService.
func (s *SessionServer) CreateSession(ctx context.Context, req *coorddv1.CreateSessionRequest) (*coorddv1.CreateSessionResponse, error) {
	if req.GetTtl() == nil {
		return nil, invalid("ttl is required (for example \"10s\")")
	}
	if err := req.GetTtl().CheckValid(); err != nil {
		return nil, invalid("ttl: " + err.Error())
	}
	info, err := s.m.Create(ctx, session.Spec{
		TTL:      req.GetTtl().AsDuration(),
		Owner:    req.GetOwner(),
		Hostname: req.GetHostname(),
		Labels:   req.GetLabels(),

		Principal: PrincipalFrom(ctx).Name,
	})
	if err != nil {
		return nil, err
	}
	s.metrics.sessionCreated()
	return &coorddv1.CreateSessionResponse{Session: sessionProto(info, false)}, nil
}

// GetSession implements SessionService.
func (s *SessionServer) GetSession(ctx context.Context, req *coorddv1.GetSessionRequest) (*coorddv1.GetSessionResponse, error) {
	id, err := session.ParseID(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	info, err := s.m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !s.mayRead(ctx, info) {
		return nil, errkind.PermissionDenied.New(fmt.Sprintf("auth: session %s is not %s's: only its owner, or a principal allowed cluster.read, may read it", id, PrincipalFrom(ctx).Name))
	}
	out := sessionProto(info, true)
	out.Locks = nonNil(s.holdings.Locks.NamesIn(info.Keys))
	out.Elections = nonNil(s.holdings.Elections.NamesIn(info.Keys))
	return &coorddv1.GetSessionResponse{Session: out}, nil
}

// ListSessions implements SessionService.
func (s *SessionServer) ListSessions(ctx context.Context, req *coorddv1.ListSessionsRequest) (*coorddv1.ListSessionsResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	if req.GetDetailed() && req.GetPageSize() == 0 {
		size = 100
	}
	if req.GetDetailed() && size > 100 {
		return nil, invalid("page_size of a detailed list must be 1 to 100")
	}
	var after session.ID
	if tok := req.GetPageToken(); tok != "" {
		var id session.ID
		var err error
		if s.pages != nil {
			id, err = s.pages.open(tok)
		} else {
			id, err = session.ParseID(tok)
		}
		if err != nil {
			return nil, invalid("page_token is not a token from a previous ListSessions response")
		}
		after = id
	}
	infos, more, err := s.m.List(ctx, after, size)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.ListSessionsResponse{Sessions: make([]*coorddv1.Session, 0, len(infos))}
	for _, info := range infos {
		if !s.mayRead(ctx, info) {
			continue
		}
		if !req.GetDetailed() {
			resp.Sessions = append(resp.Sessions, sessionProto(info, false))
			continue
		}
		info, err := s.m.Detail(ctx, info)
		if errors.Is(err, session.ErrNotFound) {
			continue // ended since the list was read
		}
		if err != nil {
			return nil, err
		}
		out := sessionProto(info, true)
		out.Locks = nonNil(s.holdings.Locks.NamesIn(info.Keys))
		out.Elections = nonNil(s.holdings.Elections.NamesIn(info.Keys))
		resp.Sessions = append(resp.Sessions, out)
	}
	if more && len(infos) > 0 {
		last := infos[len(infos)-1].ID
		if s.pages != nil {
			resp.NextPageToken = s.pages.seal(last)
		} else {
			resp.NextPageToken = last.String()
		}
	}
	return resp, nil
}

// KeepAlive implements SessionService.
func (s *SessionServer) KeepAlive(ctx context.Context, req *coorddv1.KeepAliveRequest) (*coorddv1.KeepAliveResponse, error) {
	id, err := session.ParseID(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	ttl, err := s.m.KeepAlive(ctx, id)
	s.metrics.keepAlive(err)
	if err != nil {
		return nil, err
	}
	return &coorddv1.KeepAliveResponse{SessionId: id.String(), Ttl: durationpb.New(ttl)}, nil
}

// KeepAliveStream implements SessionService. Requests are answered one at a
// time, in order, except shared ones (many sessions on one stream, the Go
// SDK's), which session.Batches renews in lots at once and answers as they finish;
// watched holdings that end are pushed between answers.
func (s *SessionServer) KeepAliveStream(stream coorddv1.SessionService_KeepAliveStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	// Shared renewals (below) run on workers that end with ctx.
	batches := s.m.NewBatches(ctx, s.metrics.keepAlive)
	defer batches.Wait()
	defer cancel()
	reqs := make(chan *coorddv1.KeepAliveStreamRequest)
	recvErr := make(chan error, 1)
	w := newHoldingWatches(s.holdings)
	defer w.Close()
	sid, unregister := s.streams.register(ctx, w)
	defer unregister()
	// Tell the client it may batch its renewals (session_ids), and how
	// many fit in one message; and the stream's id, for grants to follow.
	md := metadata.Pairs(KeepAliveBatchesHeader, strconv.Itoa(s.maxBatch()))
	if sid != 0 {
		md.Set(KeepAliveStreamHeader, strconv.FormatUint(sid, 10))
	}
	if err := stream.SendHeader(md); err != nil {
		return err
	}
	// The receiver exits when Recv fails, which gRPC guarantees once this
	// handler returns (the stream's context is then cancelled).
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.stopping:
			return ErrStopping
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-w.Ready():
			// Revocations first: a holding in both was asked, then ended.
			revoking := w.TakeRevoking()
			if ended := w.Take(); len(ended) > 0 || len(revoking) > 0 {
				if err := stream.Send(&coorddv1.KeepAliveStreamResponse{Revoking: revoking, Ended: ended}); err != nil {
					return err
				}
			}
		case r := <-batches.Out():
			if err := sendLot(stream, r); err != nil {
				return err
			}
		case req := <-reqs:
			if err := s.keepAliveRequest(ctx, stream, w, batches, req); err != nil {
				return err
			}
		}
	}
}

// keepAliveRequest serves one request of a keep-alive stream: it watches
// the holdings the request names, then renews its session, or hands a
// shared stream's renewals to batches a lot at a time (answering the lots
// that finish meanwhile, which frees workers). An error ends the stream.
func (s *SessionServer) keepAliveRequest(ctx context.Context, stream coorddv1.SessionService_KeepAliveStreamServer, w *holdingWatches, batches *session.Batches, req *coorddv1.KeepAliveStreamRequest) error {
	job, err := parseRenewJob(req)
	if err != nil {
		return err
	}
	if len(req.GetWatch()) > 0 && req.GetSessionId() == "" {
		return invalid("watch: name the holdings' session in session_id")
	}
	for _, h := range req.GetWatch() {
		if _, err := w.add(ctx, job.id, h); err != nil {
			return err
		}
	}
	switch {
	case req.GetWatchOnly():
		return nil
	case req.GetShared():
		for _, lot := range session.Lots(job.id, job.batch) {
			for handed := false; !handed; {
				select {
				case batches.In() <- lot:
					handed = true
				case r := <-batches.Out():
					if err := sendLot(stream, r); err != nil {
						return err
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	}
	ttl, err := s.m.KeepAlive(ctx, job.id)
	s.metrics.keepAlive(err)
	if err != nil {
		return err
	}
	return stream.Send(&coorddv1.KeepAliveStreamResponse{SessionId: job.id.String(), Ttl: durationpb.New(ttl)})
}

// sendLot answers a lot of a shared stream: one session as the answer to
// its request, a batch's as one message of renewals. A failure other than
// a gone session ends the stream.
func sendLot(stream coorddv1.SessionService_KeepAliveStreamServer, r session.LotResult) error {
	if r.Err != nil {
		return r.Err
	}
	if r.Single {
		one := r.Renewals[0]
		resp := &coorddv1.KeepAliveStreamResponse{SessionId: one.ID.String(), Gone: one.Gone}
		if !one.Gone {
			resp.Ttl = durationpb.New(one.TTL)
		}
		return stream.Send(resp)
	}
	rs := make([]*coorddv1.Renewal, len(r.Renewals))
	for i, one := range r.Renewals {
		rs[i] = &coorddv1.Renewal{SessionId: one.ID.String(), Gone: one.Gone}
		if !one.Gone {
			rs[i].Ttl = durationpb.New(one.TTL)
		}
	}
	return stream.Send(&coorddv1.KeepAliveStreamResponse{Renewals: rs})
}

// KeepAliveBatchesHeader is the header metadata key with which
// KeepAliveStream tells a client that it takes batches of renewals
// (KeepAliveStreamRequest.session_ids), and how many sessions one batch
// may name: its value is that number.
const KeepAliveBatchesHeader = "coordd-keepalive-batches"

// maxBatch is how many session ids fit in one keep-alive stream message
// within maxRequestBytes (an id takes 18 bytes on the wire), at most 4096.
func (s *SessionServer) maxBatch() int {
	limit := s.maxRequestBytes
	if limit <= 0 {
		limit = 4 << 20 // gRPC's default
	}
	return max(1, min(4096, (limit-64)/18))
}

// renewJob is what one request on a keep-alive stream asks to renew: one
// session (id), or a batch of them (batch; id is then the zero ID unless
// session_id was set too, and it is renewed first).
type renewJob struct {
	id    session.ID
	batch []session.ID
}

// parseRenewJob reads the sessions req names. A malformed id, or a batch
// on a stream that is not shared, is InvalidArgument and ends the stream.
func parseRenewJob(req *coorddv1.KeepAliveStreamRequest) (renewJob, error) {
	var job renewJob
	ids := req.GetSessionIds()
	if len(ids) > 0 && !req.GetShared() {
		return job, invalid("session_ids: a batch of renewals needs a shared stream (set shared)")
	}
	if len(ids) > 0 && req.GetWatchOnly() {
		return job, invalid("session_ids: a watch_only request renews nothing")
	}
	if req.GetSessionId() != "" || len(ids) == 0 {
		id, err := session.ParseID(req.GetSessionId())
		if err != nil {
			return job, err
		}
		job.id = id
	}
	job.batch = make([]session.ID, 0, len(ids))
	for _, s := range ids {
		id, err := session.ParseID(s)
		if err != nil {
			return job, err
		}
		job.batch = append(job.batch, id)
	}
	return job, nil
}

// holdingWatches are the holdings one KeepAliveStream watches (a
// grantwatch.Set): named by the client on the stream (the stream's
// goroutine calls add), or followed from their grant (KeepAliveStreams:
// the granting call's goroutine calls add, the releasing one remove). This
// adapter turns a holding into the entry it names and back.
type holdingWatches struct {
	h Holdings
	*grantwatch.Set[*coorddv1.Holding]
}

func newHoldingWatches(h Holdings) *holdingWatches {
	return &holdingWatches{h: h, Set: grantwatch.NewSet[*coorddv1.Holding](h.Watcher)}
}

// entry returns the entry that h, a holding of session id, names.
func (w *holdingWatches) entry(id session.ID, h *coorddv1.Holding) (grantwatch.Entry, error) {
	var key string
	var err error
	switch h.GetKind() {
	case coorddv1.Holding_KIND_LOCK:
		key, err = w.h.Locks.EntryKey(h.GetName(), id, h.GetRequestId())
	case coorddv1.Holding_KIND_ELECTION:
		key, err = w.h.Elections.SeatKey(h.GetName(), id, h.GetRequestId())
	default:
		return grantwatch.Entry{}, invalid("watch: kind must be KIND_LOCK or KIND_ELECTION")
	}
	if err != nil {
		return grantwatch.Entry{}, err
	}
	if h.GetToken() <= 0 {
		return grantwatch.Entry{}, invalid("watch: token must be positive")
	}
	return grantwatch.Entry{Key: key, Token: h.GetToken()}, nil
}

// add starts watching h, a holding of session id, unless it is watched
// already, and reports whether it is watched now (not once Close ran).
// A holding that has already ended is reported at once.
func (w *holdingWatches) add(ctx context.Context, id session.ID, h *coorddv1.Holding) (bool, error) {
	e, err := w.entry(id, h)
	if err != nil {
		return false, err
	}
	if r := h.GetRevision(); r != 0 && r < h.GetToken() {
		return false, invalid("watch: revision, when set, must be at least the token (a revision at which the holding was alive)")
	}
	report := &coorddv1.Holding{Kind: h.GetKind(), Name: h.GetName(), Token: h.GetToken(), RequestId: h.GetRequestId()}
	return w.Add(ctx, e, h.GetRevision(), report)
}

// remove stops watching h, a holding of session id, and drops its end if
// that is queued already: its holder gives it up and needs no report.
func (w *holdingWatches) remove(id session.ID, h *coorddv1.Holding) {
	if e, err := w.entry(id, h); err == nil {
		w.Remove(e)
	}
}

// Calls implements SessionService: see CallServer.
func (s *SessionServer) Calls(stream coorddv1.SessionService_CallsServer) error {
	return s.callStream.Serve(stream)
}

// CloseSession implements SessionService.
func (s *SessionServer) CloseSession(ctx context.Context, req *coorddv1.CloseSessionRequest) (*coorddv1.CloseSessionResponse, error) {
	id, err := session.ParseID(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	out := &coorddv1.CloseSessionResponse{}
	if !req.GetByOwner() && !s.noRevocation {
		// From outside: every holder is asked first (see revokeHoldings).
		rs, err := s.revokeHoldings(ctx, id, req)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			out.Revocations = append(out.Revocations, revocationProto(r))
		}
	}
	if err := s.m.Close(ctx, id); err != nil {
		return nil, err
	}
	s.metrics.sessionClosed()
	return out, nil
}

// revokeHoldings revokes, all at once, the lock grants and leaderships of
// session id, as releases and resignations from outside do, before a
// close from outside ends the session.
func (s *SessionServer) revokeHoldings(ctx context.Context, id session.ID, req *coorddv1.CloseSessionRequest) ([]revoke.Revocation, error) {
	keys, err := s.m.Keys(ctx, id)
	if err != nil {
		return nil, err
	}
	o, err := revokeOptions(s.m, req.GetForce(), req.GetRevokeWait())
	if err != nil {
		return nil, err
	}
	var locks, elections []revoke.Revocation
	var lerr, eerr error
	var wg sync.WaitGroup
	wg.Go(func() { locks, lerr = s.holdings.Locks.RevokeAll(ctx, keys, o) })
	wg.Go(func() { elections, eerr = s.holdings.Elections.RevokeAll(ctx, keys, o) })
	wg.Wait()
	for _, r := range locks {
		s.metrics.revoked("lock", r)
	}
	for _, r := range elections {
		s.metrics.revoked("election", r)
	}
	return append(locks, elections...), errors.Join(lerr, eerr)
}

func sessionProto(info session.Info, withRemaining bool) *coorddv1.Session {
	out := &coorddv1.Session{
		Id:         info.ID.String(),
		Ttl:        durationpb.New(info.TTL),
		Owner:      info.Owner,
		Hostname:   info.Hostname,
		Labels:     info.Labels,
		CreateTime: timestamppb.New(info.Created),
		Principal:  info.Principal,
	}
	if withRemaining {
		out.RemainingTtl = durationpb.New(info.Remaining)
	}
	return out
}

// nonNil makes an empty list [] rather than null in JSON.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// invalid reports a malformed request detected by an adapter; the status
// table maps it like any other invalid argument.
func invalid(msg string) error { return errkind.Invalid.New(msg) }
