package clientlib

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// serverWait is the wait to ask the server for under ctx's deadline: a
// little less, so that the server's wait runs out first and it takes the
// participant out before it answers.
func serverWait(ctx context.Context) *durationpb.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	return durationpb.New(max(time.Millisecond, time.Until(dl)-100*time.Millisecond))
}

// BarrierOption configures EnterBarrier.
type BarrierOption func(*barrierOptions)

type barrierOptions struct{ participant string }

// WithParticipant names the session's participant (default "default"): a
// session may be several participants of one barrier.
func WithParticipant(id string) BarrierOption {
	return func(o *barrierOptions) { o.participant = id }
}

// Barrier is a session's participant in an open barrier.
type Barrier struct {
	s            *Session
	name, id     string
	Participants int   // how many were in when it was seen open
	Revision     int64 // the etcd revision at which it was seen open
}

// EnterBarrier enters the named barrier as one of the session's
// participants and waits until it is open: count participants in it at
// one etcd revision, or opened by Admin.OpenBarrier. It fails with ctx's
// error when ctx ends first (the participant is taken out again: under
// ctx's deadline the server's own wait runs out first, and it answers
// once the participant is out) and
// with ErrSessionNotFound or the session's error when the session ends.
// Retried while coordd is unavailable (the same participant).
func (s *Session) EnterBarrier(ctx context.Context, name string, count int, opts ...BarrierOption) (*Barrier, error) {
	var o barrierOptions
	for _, opt := range opts {
		opt(&o)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	var resp *coorddv1.EnterBarrierResponse
	_, err := s.c.retry(cctx, 0, func(ctx context.Context) (err error) {
		resp, err = s.c.barriers.EnterBarrier(ctx, &coorddv1.EnterBarrierRequest{Name: name, SessionId: s.id, Count: int32(count), Participant: o.participant, Wait: serverWait(ctx)})
		return err
	})
	if err != nil {
		if serr := s.Err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	return &Barrier{s: s, name: name, id: o.participant, Participants: int(resp.GetParticipants()), Revision: resp.GetRevision()}, nil
}

// Leave takes the participant out of the barrier and waits until every
// participant has left (a double barrier's exit), as long as ctx allows;
// the participant is out even when ctx ends first. The last one out
// closes the barrier for the next round.
func (b *Barrier) Leave(ctx context.Context) error {
	_, err := b.s.c.retry(ctx, 0, func(ctx context.Context) error {
		_, err := b.s.c.barriers.LeaveBarrier(ctx, &coorddv1.LeaveBarrierRequest{Name: b.name, SessionId: b.s.id, Participant: b.id})
		return err
	})
	return err
}

// OpenBarrier opens the named barrier now, however many participants are
// in it (a leader starting the round).
func (a *Admin) OpenBarrier(ctx context.Context, name string) error {
	_, err := a.c.barriers.OpenBarrier(ctx, &coorddv1.OpenBarrierRequest{Name: name})
	return convert(ctx, err)
}

// BarrierParticipant is one participant of a barrier.
type BarrierParticipant struct {
	SessionID   string
	Participant string
	Count       int
	Entered     time.Time
}

// BarrierState is a barrier's state.
type BarrierState struct {
	Name         string
	Open         bool
	Participants []BarrierParticipant // one page of them, in the order they entered
	// ParticipantCount counts every participant in, on every page.
	ParticipantCount int
	Revision         int64
	// NextPageToken, when not empty, fetches the participants after this
	// page (BarrierPage.Token of DescribeBarrierPage).
	NextPageToken string
}

// BarrierPage selects a page of a barrier's participants.
type BarrierPage struct {
	// Size is the most participants to return, in the order they entered:
	// 1-1000, 100 when zero.
	Size int
	// Token is the previous page's NextPageToken ("": the first page).
	Token string
}

// DescribeBarrier reads a barrier's state with its first 1000
// participants (ParticipantCount counts them all; NextPageToken then
// continues, with DescribeBarrierPage).
func (a *Admin) DescribeBarrier(ctx context.Context, name string) (BarrierState, error) {
	return a.DescribeBarrierPage(ctx, name, BarrierPage{Size: maxBarrierPage})
}

// maxBarrierPage is the most participants one page holds.
const maxBarrierPage = 1000

// DescribeBarrierPage reads whether the named barrier is open, how many
// participants are in, and one page of them, in one linearizable read.
func (a *Admin) DescribeBarrierPage(ctx context.Context, name string, p BarrierPage) (BarrierState, error) {
	resp, err := a.c.barriers.DescribeBarrier(ctx, &coorddv1.DescribeBarrierRequest{Name: name, PageSize: int32(p.Size), PageToken: p.Token})
	if err != nil {
		return BarrierState{}, convert(ctx, err)
	}
	st := BarrierState{Name: resp.GetName(), Open: resp.GetOpen(), Revision: resp.GetRevision(), ParticipantCount: int(resp.GetParticipantCount()), NextPageToken: resp.GetNextPageToken()}
	for _, p := range resp.GetParticipants() {
		st.Participants = append(st.Participants, BarrierParticipant{SessionID: p.GetSessionId(), Participant: p.GetParticipant(), Count: int(p.GetCount()), Entered: p.GetEntered().AsTime()})
	}
	if st.ParticipantCount == 0 {
		st.ParticipantCount = len(st.Participants) // a server before pages sends them all
	}
	return st, nil
}

// EnterBarrier enters the named barrier for the session sessionID (which
// the caller keeps alive), as Session.EnterBarrier does; participant ""
// is the default one. Not retried.
func (a *Admin) EnterBarrier(ctx context.Context, sessionID, name string, count int, participant string) (participants int, err error) {
	resp, err := a.c.barriers.EnterBarrier(ctx, &coorddv1.EnterBarrierRequest{Name: name, SessionId: sessionID, Count: int32(count), Participant: participant, Wait: serverWait(ctx)})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return int(resp.GetParticipants()), nil
}

// LeaveBarrier takes the session's participant out of the barrier and
// waits until every participant has left, as Barrier.Leave does.
func (a *Admin) LeaveBarrier(ctx context.Context, sessionID, name, participant string) error {
	_, err := a.c.barriers.LeaveBarrier(ctx, &coorddv1.LeaveBarrierRequest{Name: name, SessionId: sessionID, Participant: participant})
	return convert(ctx, err)
}
