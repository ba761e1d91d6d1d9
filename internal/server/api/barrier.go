package api

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/barrier"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// BarrierServer adapts barrier.Manager to coordd.v1.BarrierService.
type BarrierServer struct {
	coorddv1.UnsafeBarrierServiceServer // compile errors when the service grows

	m       *barrier.Manager
	waiters *Waiters // BarrierOptions.Waiters
}

// BarrierOptions is what a BarrierServer is built from (NewBarrierServer).
type BarrierOptions struct {
	// Barriers is the barrier manager served; required.
	Barriers *barrier.Manager
	// Waiters bounds the calls waiting on this member; nil: no bound.
	Waiters *Waiters
}

// NewBarrierServer returns the BarrierService adapter.
func NewBarrierServer(o BarrierOptions) *BarrierServer {
	return &BarrierServer{m: o.Barriers, waiters: o.Waiters}
}

// withWait bounds ctx by a request's wait (locks, sets, campaigns,
// barriers), which must be positive when set.
func withWait(ctx context.Context, w *durationpb.Duration) (context.Context, context.CancelFunc, error) {
	if w == nil {
		return ctx, func() {}, nil
	}
	if err := w.CheckValid(); err != nil || w.AsDuration() <= 0 {
		return ctx, nil, invalid("wait must be a positive duration (for example \"30s\")")
	}
	ctx, cancel := context.WithTimeout(ctx, w.AsDuration())
	return ctx, cancel, nil
}

// EnterBarrier implements BarrierService.
func (s *BarrierServer) EnterBarrier(ctx context.Context, req *coorddv1.EnterBarrierRequest) (*coorddv1.EnterBarrierResponse, error) {
	resp, err := s.enterBarrier(ctx, nil, req)
	if err != nil {
		return nil, err
	}
	return resp.(*coorddv1.EnterBarrierResponse), nil
}

// enterOnStream is EnterBarrier for the call stream: an Enter that has to
// wait parks (see park.go) instead of holding its goroutine.
func (s *BarrierServer) enterOnStream(ctx context.Context, req *coorddv1.EnterBarrierRequest) (any, error) {
	call, _ := parkableCall(ctx)
	return s.enterBarrier(ctx, call, req)
}

// enterBarrier serves an EnterBarrier: it waits on its own goroutine when
// call is nil, and otherwise parks a wait, which call governs, and returns
// a later.
func (s *BarrierServer) enterBarrier(ctx, call context.Context, req *coorddv1.EnterBarrierRequest) (any, error) {
	id, err := session.ParseID(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	ctx, wait, cancel, finish, err := s.waiters.begin(ctx, call, req.GetWait())
	if err != nil {
		return nil, err
	}
	defer cancel()
	answer := func(e barrier.Entered, err error) (any, error) {
		defer finish()
		if err != nil {
			return nil, err
		}
		return &coorddv1.EnterBarrierResponse{Participants: int32(e.Participants), Revision: e.Revision}, nil
	}
	if call == nil {
		return answer(s.m.Enter(ctx, req.GetName(), id, req.GetParticipant(), int(req.GetCount())))
	}
	l := &later{}
	e, parked, err := s.m.EnterLater(ctx, req.GetName(), id, req.GetParticipant(), int(req.GetCount()), barrier.Later{Ctx: wait, Done: func(e barrier.Entered, err error) {
		l.complete(answer(e, err))
	}})
	if parked {
		return l, nil
	}
	return answer(e, err)
}

// LeaveBarrier implements BarrierService.
func (s *BarrierServer) LeaveBarrier(ctx context.Context, req *coorddv1.LeaveBarrierRequest) (*coorddv1.LeaveBarrierResponse, error) {
	resp, err := s.leaveBarrier(ctx, nil, req)
	if err != nil {
		return nil, err
	}
	return resp.(*coorddv1.LeaveBarrierResponse), nil
}

// leaveOnStream is LeaveBarrier for the call stream: a Leave that has to
// wait for the others parks (see park.go).
func (s *BarrierServer) leaveOnStream(ctx context.Context, req *coorddv1.LeaveBarrierRequest) (any, error) {
	call, _ := parkableCall(ctx)
	return s.leaveBarrier(ctx, call, req)
}

// leaveBarrier serves a LeaveBarrier: it waits on its own goroutine when
// call is nil, and otherwise parks a wait, which call governs, and returns
// a later.
func (s *BarrierServer) leaveBarrier(ctx, call context.Context, req *coorddv1.LeaveBarrierRequest) (any, error) {
	id, err := session.ParseID(req.GetSessionId())
	if err != nil {
		return nil, err
	}
	ctx, wait, cancel, finish, err := s.waiters.begin(ctx, call, req.GetWait())
	if err != nil {
		return nil, err
	}
	defer cancel()
	answer := func(rev int64, err error) (any, error) {
		defer finish()
		if err != nil {
			return nil, err
		}
		return &coorddv1.LeaveBarrierResponse{Revision: rev}, nil
	}
	if call == nil {
		return answer(s.m.Leave(ctx, req.GetName(), id, req.GetParticipant()))
	}
	l := &later{}
	rev, parked, err := s.m.LeaveLater(ctx, req.GetName(), id, req.GetParticipant(), barrier.Leaving{Ctx: wait, Done: func(rev int64, err error) {
		l.complete(answer(rev, err))
	}})
	if parked {
		return l, nil
	}
	return answer(rev, err)
}

// OpenBarrier implements BarrierService.
func (s *BarrierServer) OpenBarrier(ctx context.Context, req *coorddv1.OpenBarrierRequest) (*coorddv1.OpenBarrierResponse, error) {
	rev, err := s.m.Open(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &coorddv1.OpenBarrierResponse{Revision: rev}, nil
}

// DescribeBarrier implements BarrierService. A page token is the create
// revision of the page's last participant, in the clear: it names no
// capability (a lock's does, see LockServer.pages).
func (s *BarrierServer) DescribeBarrier(ctx context.Context, req *coorddv1.DescribeBarrierRequest) (*coorddv1.DescribeBarrierResponse, error) {
	var after int64
	if t := req.GetPageToken(); t != "" {
		v, err := strconv.ParseInt(t, 10, 64)
		if err != nil || v <= 0 {
			return nil, invalid("page_token: not a page token of DescribeBarrier")
		}
		after = v
	}
	st, err := s.m.DescribePage(ctx, req.GetName(), barrier.Page{After: after, Size: int(req.GetPageSize())})
	if err != nil {
		return nil, err
	}
	out := &coorddv1.DescribeBarrierResponse{Name: req.GetName(), Open: st.Open, Revision: st.Revision, ParticipantCount: int32(st.Count), Participants: []*coorddv1.BarrierParticipant{}}
	if st.Next > 0 {
		out.NextPageToken = strconv.FormatInt(st.Next, 10)
	}
	for _, p := range st.Participants {
		out.Participants = append(out.Participants, &coorddv1.BarrierParticipant{SessionId: p.Session.String(), Participant: p.ID, Count: int32(p.Count), Entered: timestamppb.New(p.Entered)})
	}
	return out, nil
}
