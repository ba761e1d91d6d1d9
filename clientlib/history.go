package clientlib

import (
	"context"
	"iter"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// HistoryEvent is one entry of a lock's or election's grant history (see
// Admin.LockHistory).
type HistoryEvent struct {
	// Type is what happened: GRANTED, RELEASED, EXPIRED, SESSION_CLOSED
	// (locks); ELECTED, RESIGNED, EXPIRED, SESSION_CLOSED, REMOVED
	// (elections); GAP (events the history could not see).
	Type string
	Name string
	// Token is the grant's fencing token, or the leadership's term (0
	// when the caller may not see the lock's tokens).
	Token     fencing.Token
	SessionID string
	Owner     string
	Principal string
	Hostname  string
	RequestID string
	Read      bool
	// Reason says why a grant ended.
	Reason   string
	Revision int64
	// FromRevision is the first revision a GAP missed.
	FromRevision int64
	Time         time.Time
	// HandedFrom is, on a grant, the token whose end let it in (0: the
	// lock was free).
	HandedFrom fencing.Token
	// Waited is how long a grant queued; Held how long an ended one lasted.
	Waited, Held time.Duration
	// Revocation is, on an end from outside (a release, resignation or
	// session close that did not come from the holder), how the holder was
	// told: RevokeAcknowledged, RevokeBound or RevokeForced ("" otherwise);
	// RevokeWaited how long the hand-over waited for it.
	Revocation   string
	RevokeWaited time.Duration
}

// HistoryQuery selects events. The zero value lists every event of the
// name, oldest first.
type HistoryQuery struct {
	Owner        string    // only events of sessions with this owner
	Since, Until time.Time // zero: unbounded
	NewestFirst  bool
	// PageSize is how many events each call to the server fetches (1-1000,
	// 100 when zero).
	PageSize int
	// MinRevision, when set, waits (up to 10 s) until the history has
	// recorded every event up to this etcd revision: a grant's
	// (Lock.Revision) or a release's. Events are recorded within about
	// 250 ms of their commit, so a read right after one may not show it.
	// Past the wait it fails with ErrUnavailable.
	MinRevision int64
}

// LockHistory returns the grant history of the lock name (every lock's
// when name is empty): each grant and each end of one, with its token,
// session, owner and reason, kept for the daemon's --history-retention.
// Iteration fetches a page at a time and stops at the first error, which
// it yields. Not retried.
func (a *Admin) LockHistory(ctx context.Context, name string, q HistoryQuery) iter.Seq2[HistoryEvent, error] {
	return historyPages(ctx, func(token string) ([]*coorddv1.HistoryEvent, string, error) {
		resp, err := a.c.history.ListLockHistory(ctx, &coorddv1.ListLockHistoryRequest{Name: name, Owner: q.Owner,
			Since: stamp(q.Since), Until: stamp(q.Until), PageSize: int32(q.PageSize), PageToken: token, NewestFirst: q.NewestFirst, MinRevision: q.MinRevision})
		return resp.GetEvents(), resp.GetNextPageToken(), err
	})
}

// ElectionHistory returns the history of the election name (every
// election's when name is empty), as LockHistory does for locks.
func (a *Admin) ElectionHistory(ctx context.Context, name string, q HistoryQuery) iter.Seq2[HistoryEvent, error] {
	return historyPages(ctx, func(token string) ([]*coorddv1.HistoryEvent, string, error) {
		resp, err := a.c.history.ListElectionHistory(ctx, &coorddv1.ListElectionHistoryRequest{Name: name, Owner: q.Owner,
			Since: stamp(q.Since), Until: stamp(q.Until), PageSize: int32(q.PageSize), PageToken: token, NewestFirst: q.NewestFirst, MinRevision: q.MinRevision})
		return resp.GetEvents(), resp.GetNextPageToken(), err
	})
}

func stamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func historyPages(ctx context.Context, page func(token string) ([]*coorddv1.HistoryEvent, string, error)) iter.Seq2[HistoryEvent, error] {
	return func(yield func(HistoryEvent, error) bool) {
		token := ""
		for {
			evs, next, err := page(token)
			if err != nil {
				yield(HistoryEvent{}, convert(ctx, err))
				return
			}
			for _, e := range evs {
				if !yield(historyEvent(e), nil) {
					return
				}
			}
			if next == "" {
				return
			}
			token = next
		}
	}
}

func historyEvent(e *coorddv1.HistoryEvent) HistoryEvent {
	out := HistoryEvent{
		Type: strings.TrimPrefix(e.GetType().String(), "HISTORY_EVENT_TYPE_"), Name: e.GetName(), Token: fencing.Token(e.GetToken()),
		SessionID: e.GetSessionId(), Owner: e.GetOwner(), Principal: e.GetPrincipal(), Hostname: e.GetHostname(),
		RequestID: e.GetRequestId(), Read: e.GetRead(), Reason: e.GetReason(), Revision: e.GetRevision(),
		FromRevision: e.GetFromRevision(), HandedFrom: fencing.Token(e.GetHandedFrom()),
		Waited: e.GetWaited().AsDuration(), Held: e.GetHeld().AsDuration(),
	}
	if e.GetTime() != nil {
		out.Time = e.GetTime().AsTime()
	}
	if r := e.GetRevocation(); r != nil {
		rv := revocationOf(r)
		out.Revocation, out.RevokeWaited = rv.Outcome, rv.Waited
	}
	return out
}
