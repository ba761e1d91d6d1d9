package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/history"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// HistoryServer adapts history.Store to coordd.v1.HistoryService.
type HistoryServer struct {
	coorddv1.UnsafeHistoryServiceServer // compile errors when the service grows

	s             *history.Store
	tokensVisible func(ctx context.Context, lock string) bool // HistoryOptions.TokensVisible
}

// HistoryOptions is what a HistoryServer is built from (NewHistoryServer).
type HistoryOptions struct {
	// Store is the grant history served; required.
	Store *history.Store
	// TokensVisible says whether the caller may see a lock's tokens (as
	// in DescribeLock: see LockOptions.TokensVisible); they are zero
	// otherwise. nil: every caller sees them.
	TokensVisible func(ctx context.Context, lock string) bool
}

// NewHistoryServer returns the HistoryService adapter.
func NewHistoryServer(o HistoryOptions) *HistoryServer {
	return &HistoryServer{s: o.Store, tokensVisible: o.TokensVisible}
}

// historyRequest is what both listings ask.
type historyRequest interface {
	GetName() string
	GetOwner() string
	GetSince() *timestamppb.Timestamp
	GetUntil() *timestamppb.Timestamp
	GetPageSize() int32
	GetPageToken() string
	GetNewestFirst() bool
	GetMinRevision() int64
}

func (s *HistoryServer) list(ctx context.Context, k history.Kind, req historyRequest) ([]*coorddv1.HistoryEvent, string, error) {
	q := history.Query{Kind: k, Name: req.GetName(), Owner: req.GetOwner(), Limit: int(req.GetPageSize()),
		PageToken: req.GetPageToken(), NewestFirst: req.GetNewestFirst(), MinRevision: req.GetMinRevision()}
	for _, b := range []struct {
		ts   *timestamppb.Timestamp
		to   *time.Time
		what string
	}{{req.GetSince(), &q.Since, "since"}, {req.GetUntil(), &q.Until, "until"}} {
		if b.ts == nil {
			continue
		}
		if err := b.ts.CheckValid(); err != nil {
			return nil, "", invalid(b.what + " is not a valid time (for example \"2026-12-05T03:00:00Z\")")
		}
		*b.to = b.ts.AsTime()
	}
	evs, next, err := s.s.List(ctx, q)
	if err != nil {
		return nil, "", err
	}
	visible := map[string]bool{}
	out := make([]*coorddv1.HistoryEvent, 0, len(evs))
	for i := range evs {
		e := historyEvent(&evs[i])
		if k == history.Lock && s.tokensVisible != nil && e.Name != "" {
			v, ok := visible[e.Name]
			if !ok {
				v = s.tokensVisible(ctx, e.Name)
				visible[e.Name] = v
			}
			if !v {
				e.Token, e.HandedFrom = 0, 0
			}
		}
		out = append(out, e)
	}
	return out, next, nil
}

var historyTypes = map[history.Type]coorddv1.HistoryEventType{
	history.Granted:       coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_GRANTED,
	history.Released:      coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_RELEASED,
	history.Expired:       coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_EXPIRED,
	history.SessionClosed: coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_SESSION_CLOSED,
	history.Elected:       coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_ELECTED,
	history.Resigned:      coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_RESIGNED,
	history.Removed:       coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_REMOVED,
	history.Gap:           coorddv1.HistoryEventType_HISTORY_EVENT_TYPE_GAP,
}

func historyEvent(e *history.Event) *coorddv1.HistoryEvent {
	out := &coorddv1.HistoryEvent{
		Type: historyTypes[e.Type], Name: e.Name, Token: e.Token, SessionId: e.Session, Owner: e.Owner,
		Principal: e.Principal, Hostname: e.Hostname, RequestId: e.RequestID, Read: e.Read, Reason: e.Reason,
		Revision: e.Revision, FromRevision: e.FromRevision, Time: timestamppb.New(e.Time), HandedFrom: e.HandedFrom,
	}
	if e.Waited > 0 {
		out.Waited = durationpb.New(e.Waited)
	}
	if e.Held > 0 {
		out.Held = durationpb.New(e.Held)
	}
	out.Revocation = revocationProto(revoke.Revocation{Outcome: e.Revocation, Waited: e.RevokeWaited})
	return out
}

// ListLockHistory implements HistoryService.
func (s *HistoryServer) ListLockHistory(ctx context.Context, req *coorddv1.ListLockHistoryRequest) (*coorddv1.ListLockHistoryResponse, error) {
	evs, next, err := s.list(ctx, history.Lock, req)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListLockHistoryResponse{Events: evs, NextPageToken: next}, nil
}

// ListElectionHistory implements HistoryService.
func (s *HistoryServer) ListElectionHistory(ctx context.Context, req *coorddv1.ListElectionHistoryRequest) (*coorddv1.ListElectionHistoryResponse, error) {
	evs, next, err := s.list(ctx, history.Election, req)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListElectionHistoryResponse{Events: evs, NextPageToken: next}, nil
}
