package api

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ElectionServer adapts election.Manager to coordd.v1.ElectionService.
type ElectionServer struct {
	coorddv1.UnsafeElectionServiceServer // compile errors when the service grows

	m        *election.Manager
	sessions *session.Manager // to name leaders' and candidates' owners
	stopped  context.Context  // done once the daemon stops
	metrics  *Metrics

	// The rest: see ElectionOptions' fields of the same names.
	waiters      *Waiters
	streams      *KeepAliveStreams
	noRevocation bool
}

// ElectionOptions is what an ElectionServer is built from
// (NewElectionServer).
type ElectionOptions struct {
	// Stopped is done once the daemon stops, which ends Observe streams
	// (and campaigns) with ErrStopping; required.
	Stopped context.Context
	// Elections is the election manager served; required.
	Elections *election.Manager
	// Sessions names leaders' and candidates' owners; required.
	Sessions *session.Manager
	// Metrics counts what the adapter serves; nil: nothing is counted.
	Metrics *Metrics
	// Waiters bounds each principal's campaigns in progress on this
	// member (shared with the LockServer's acquisitions); nil: no bound.
	Waiters *Waiters
	// Streams lets a leadership be followed on its leader's shared
	// keep-alive stream from the moment it is won (keepalive_stream); nil:
	// none is.
	Streams *KeepAliveStreams
	// NoRevocation, for tests only: see LockOptions.NoRevocation; false:
	// the leader is asked first.
	NoRevocation bool
}

// NewElectionServer returns the ElectionService adapter.
func NewElectionServer(o ElectionOptions) *ElectionServer {
	return &ElectionServer{
		m: o.Elections, sessions: o.Sessions, stopped: o.Stopped, metrics: o.Metrics,
		waiters: o.Waiters, streams: o.Streams, noRevocation: o.NoRevocation,
	}
}

// Campaign implements ElectionService.
func (s *ElectionServer) Campaign(ctx context.Context, req *coorddv1.CampaignRequest) (*coorddv1.CampaignResponse, error) {
	resp, err := s.campaign(ctx, nil, req)
	if err != nil {
		return nil, err
	}
	return resp.(*coorddv1.CampaignResponse), nil
}

// campaignOnStream is Campaign for the call stream: a campaign that has
// to wait parks (see park.go) instead of holding its goroutine, and is
// answered when it leads or its wait ends. What it answers is what
// Campaign would.
func (s *ElectionServer) campaignOnStream(ctx context.Context, req *coorddv1.CampaignRequest) (any, error) {
	call, _ := parkableCall(ctx)
	return s.campaign(ctx, call, req)
}

// campaign serves a Campaign: it waits on its own goroutine when call is
// nil, and otherwise parks a wait, which call (the call's own context on
// its stream, see parkableCall) governs, and returns a later.
func (s *ElectionServer) campaign(ctx, call context.Context, req *coorddv1.CampaignRequest) (any, error) {
	id, err := session.ParseID(req.GetSessionId())
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
	p := PrincipalFrom(ctx)
	answer := func(ctx context.Context, l election.Leadership, err error) (any, error) {
		defer finish() // after the leadership is followed, which reads with ctx
		if err != nil {
			return nil, stoppingOr(ctx, err)
		}
		s.metrics.leaderChanged()
		out := &coorddv1.Leadership{
			Name:      l.Name,
			Term:      int64(l.Term),
			Value:     l.Value,
			SessionId: l.Session.String(),
			RequestId: l.RequestID,
			Revision:  l.Revision,
			Priority:  l.Priority,
		}
		if stream := req.GetKeepaliveStream(); stream != 0 {
			out.Followed = s.streams.follow(ctx, stream, l.Session, &coorddv1.Holding{
				Kind: coorddv1.Holding_KIND_ELECTION, Name: l.Name, Token: int64(l.Term), RequestId: l.RequestID, Revision: l.Revision,
			})
		}
		return &coorddv1.CampaignResponse{Leadership: out}, nil
	}
	er := election.Request{Name: req.GetName(), Session: id, Value: req.GetValue(), RequestID: req.GetRequestId(),
		Priority: req.GetPriority(), Preempt: req.GetPreempt()}
	if call == nil {
		l, err := s.m.Campaign(ctx, er)
		return answer(ctx, l, err)
	}
	lt := &later{}
	l, parked, err := s.m.CampaignLater(ctx, er, election.Later{Ctx: wait, Done: func(l election.Leadership, err error) {
		// wait has the call's end and deadline; the leadership is
		// followed on the keep-alive stream as the caller's principal.
		lt.complete(answer(context.WithValue(wait, principalKey{}, p), l, err))
	}})
	if parked {
		return lt, nil
	}
	return answer(ctx, l, err)
}

// Proclaim implements ElectionService.
func (s *ElectionServer) Proclaim(ctx context.Context, req *coorddv1.ProclaimRequest) (*coorddv1.ProclaimResponse, error) {
	rev, err := s.m.Proclaim(ctx, req.GetName(), fencing.Token(req.GetTerm()), req.GetValue(), req.GetProclaimId())
	if err != nil {
		return nil, err
	}
	return &coorddv1.ProclaimResponse{Revision: rev}, nil
}

// Resign implements ElectionService.
func (s *ElectionServer) Resign(ctx context.Context, req *coorddv1.ResignRequest) (*coorddv1.ResignResponse, error) {
	var hint session.Hint
	if req.GetSessionId() != "" {
		id, err := session.ParseID(req.GetSessionId())
		if err != nil {
			return nil, err
		}
		hint = session.Hint{Session: id, RequestID: req.GetRequestId()}
		if stream := req.GetKeepaliveStream(); stream != 0 && hint.RequestID != "" {
			s.streams.unfollow(ctx, stream, id, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_ELECTION, Name: req.GetName(), Token: req.GetTerm(), RequestId: hint.RequestID})
		}
	}
	if hint.Session == 0 && !s.noRevocation {
		// From outside: the leader is asked first (see election.Revoke).
		o, err := revokeOptions(s.sessions, req.GetForce(), req.GetRevokeWait())
		if err != nil {
			return nil, err
		}
		r, err := s.m.Revoke(ctx, req.GetName(), fencing.Token(req.GetTerm()), o)
		if err != nil {
			return nil, err
		}
		s.metrics.revoked("election", r)
		return &coorddv1.ResignResponse{Revocation: revocationProto(r)}, nil
	}
	// With revoked, the leader's answer to a revocation.
	rev, err := s.m.ResignAt(ctx, req.GetName(), fencing.Token(req.GetTerm()), hint, req.GetRevoked() && hint.Session != 0)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ResignResponse{Revision: rev}, nil
}

// Transfer implements ElectionService.
func (s *ElectionServer) Transfer(ctx context.Context, req *coorddv1.TransferRequest) (*coorddv1.TransferResponse, error) {
	to, err := session.ParseID(req.GetSuccessorSessionId())
	if err != nil {
		return nil, err
	}
	if stream := req.GetKeepaliveStream(); stream != 0 && req.GetSessionId() != "" && req.GetRequestId() != "" {
		id, err := session.ParseID(req.GetSessionId())
		if err != nil {
			return nil, err
		}
		s.streams.unfollow(ctx, stream, id, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_ELECTION, Name: req.GetName(), Token: req.GetTerm(), RequestId: req.GetRequestId()})
	}
	term, rev, err := s.m.Transfer(ctx, req.GetName(), fencing.Token(req.GetTerm()), to, req.GetSuccessorRequestId())
	if err != nil {
		return nil, err
	}
	s.metrics.leaderChanged()
	return &coorddv1.TransferResponse{Term: int64(term), Revision: rev}, nil
}

// Leader implements ElectionService.
func (s *ElectionServer) Leader(ctx context.Context, req *coorddv1.LeaderRequest) (*coorddv1.LeaderResponse, error) {
	ld, rev, err := s.m.Leader(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &coorddv1.LeaderResponse{Leader: s.leaderProto(ctx, ld, true), Revision: rev}, nil
}

// Candidates implements ElectionService.
func (s *ElectionServer) Candidates(ctx context.Context, req *coorddv1.CandidatesRequest) (*coorddv1.CandidatesResponse, error) {
	cands, rev, err := s.m.Candidates(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.CandidatesResponse{Revision: rev}
	for _, c := range cands {
		out := &coorddv1.ElectionCandidate{
			JoinedRevision: c.Joined,
			Priority:       c.Priority,
			Value:          c.Value,
			SessionId:      c.Session.String(),
			RequestId:      c.RequestID,
			EnqueueTime:    timestamppb.New(c.Enqueued),
		}
		out.Owner, out.Hostname = s.owner(ctx, c.Session)
		resp.Candidates = append(resp.Candidates, out)
	}
	return resp, nil
}

// ListElections implements ElectionService.
func (s *ElectionServer) ListElections(ctx context.Context, req *coorddv1.ListElectionsRequest) (*coorddv1.ListElectionsResponse, error) {
	names, next, err := namesPage(req.GetPageSize(), req.GetPageToken(), func(after string, limit int) ([]string, error) {
		return s.m.List(ctx, req.GetPrefix(), after, limit)
	})
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListElectionsResponse{Names: names, NextPageToken: next}, nil
}

// Observe implements ElectionService.
func (s *ElectionServer) Observe(req *coorddv1.ObserveRequest, stream coorddv1.ElectionService_ObserveServer) error {
	defer s.metrics.observing()()
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()
	// Owners of the leaders this stream has seen, so that a RESIGNED or
	// EXPIRED event still names the owner after its session is gone.
	owners := map[session.ID][2]string{}
	err := s.m.Observe(ctx, req.GetName(), req.GetFromRevision(), func(evs []election.Event) error {
		msg := &coorddv1.ObserveResponse{Revision: evs[0].Revision}
		for _, ev := range evs {
			out := &coorddv1.ElectionEvent{Type: eventTypes[ev.Type], Revision: ev.Revision, Current: ev.Current}
			if ev.Type != election.Vacant {
				out.Leader = s.leaderProto(ctx, ev.Leader, false)
				id := ev.Leader.Session
				if o, ok := owners[id]; ok {
					out.Leader.Owner, out.Leader.Hostname = o[0], o[1]
				} else if owner, host := s.owner(ctx, id); owner != "" || host != "" {
					owners[id] = [2]string{owner, host}
					out.Leader.Owner, out.Leader.Hostname = owner, host
				}
			}
			if ev.Type == election.PreemptRequested {
				out.By = &coorddv1.ElectionCandidate{SessionId: ev.By.Session.String(), RequestId: ev.By.RequestID, Priority: ev.By.Priority, JoinedRevision: ev.By.Joined}
			}
			if ev.Type == election.Resigned || ev.Type == election.Expired {
				defer delete(owners, ev.Leader.Session) // after this batch
			}
			msg.Events = append(msg.Events, out)
		}
		return stream.Send(msg)
	})
	return stoppingOr(ctx, err)
}

var eventTypes = map[election.EventType]coorddv1.ElectionEventType{
	election.Elected:    coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_ELECTED,
	election.Proclaimed: coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_PROCLAIMED,
	election.Resigned:   coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_RESIGNED,
	election.Expired:    coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_EXPIRED,
	election.Vacant:     coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_VACANT,

	election.PreemptRequested: coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_PREEMPT_REQUESTED,
	election.Revoking:         coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_REVOKING,
}

// leaderProto describes a leader, with its session's owner and host when
// withOwner is set and the session still exists.
func (s *ElectionServer) leaderProto(ctx context.Context, ld election.Leader, withOwner bool) *coorddv1.ElectionLeader {
	out := &coorddv1.ElectionLeader{
		Term:      int64(ld.Term),
		Value:     ld.Value,
		SessionId: ld.Session.String(),
		RequestId: ld.RequestID,
		Proclaims: ld.Proclaims,
		Priority:  ld.Priority,
	}
	if !ld.Since.IsZero() {
		out.Since = timestamppb.New(ld.Since)
	}
	if !ld.RevokingSince.IsZero() {
		out.RevokingSince, out.RevokingUntil = timestamppb.New(ld.RevokingSince), timestamppb.New(ld.RevokingUntil)
	}
	if withOwner {
		out.Owner, out.Hostname = s.owner(ctx, ld.Session)
	}
	return out
}

func (s *ElectionServer) owner(ctx context.Context, id session.ID) (owner, hostname string) {
	if info, err := s.sessions.Get(ctx, id); err == nil {
		return info.Owner, info.Hostname
	}
	return "", ""
}
