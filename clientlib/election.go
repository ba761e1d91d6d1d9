package clientlib

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// CampaignOption configures Campaign.
type CampaignOption interface{ applyCampaign(*campaignOptions) }

// campaignOption is a CampaignOption that sets one field.
type campaignOption func(*campaignOptions)

func (f campaignOption) applyCampaign(o *campaignOptions) { f(o) }

type campaignOptions struct {
	requestID string
	priority  int32
	preempt   bool
	onPreempt func(by Candidate)
}

// WithPriority sets the campaign's priority: when the seat is given, the
// highest priority waiting takes it, ties in arrival order. It never
// unseats a leader by itself (see WithPreempt). Default 0; negative
// values wait behind it. A retry keeps the campaign's first priority.
func WithPriority(p int32) CampaignOption {
	return campaignOption(func(o *campaignOptions) { o.priority = p })
}

// WithPreempt asks the leader to step down if this campaign's priority is
// above the leader's: the leader's OnPreempt callback runs, and it
// chooses when to resign or hand over. Nothing forces it.
func WithPreempt() CampaignOption {
	return campaignOption(func(o *campaignOptions) { o.preempt = true })
}

// OnPreempt calls f, once, on a goroutine of its own, when a candidate
// that outranks this leadership asks it to step down (see WithPreempt):
// the leader should finish what it is doing and Resign (the asker leads
// next, being first in line) or Transfer. The SDK follows the election
// for this from the moment the leadership is won until it ends.
func OnPreempt(f func(by Candidate)) CampaignOption {
	return campaignOption(func(o *campaignOptions) { o.onPreempt = f })
}

// ErrResigned is the cause of a leadership's Context after Resign.
var ErrResigned = errors.New("coordd: leadership resigned")

// ErrTransferred is the cause of a leadership's Context after Transfer.
var ErrTransferred = errors.New("coordd: leadership handed over")

// Leadership is a won election. Act as leader only while Context is not
// done, and pass Term with every access to what the leader controls, so
// the resource can reject a leader that was deposed.
type Leadership struct {
	*held
	s         *Session
	name      string
	term      fencing.Token
	priority  int32
	requestID string
	ownID     bool // the SDK chose requestID: it may use it again once resigned
}

// Campaign runs for leader of the named election with value (what the
// leader proclaims: an address, an id) and blocks until this session leads,
// ctx ends (ctx's error), or the session ends (its error). Unavailable
// servers are retried with the same campaign id, so a retry never queues
// twice. A session that already leads the election under another campaign
// id gets ErrAlreadyLeader.
func (s *Session) Campaign(ctx context.Context, name, value string, opts ...CampaignOption) (*Leadership, error) {
	o := campaignOptions{}
	for _, opt := range opts {
		opt.applyCampaign(&o)
	}
	own := o.requestID == "" // the SDK's, not the caller's
	if own {
		o.requestID = s.campaignIDs.take(name, false)
	}
	// The call ends when the session does.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	var got *coorddv1.Leadership
	follow := s.followStream()
	_, err := s.c.retry(cctx, 0, func(ctx context.Context) error {
		resp, err := s.c.elections.Campaign(ctx, &coorddv1.CampaignRequest{Name: name, SessionId: s.id, Value: value, RequestId: o.requestID, KeepaliveStream: follow.stream,
			Priority: o.priority, Preempt: o.preempt})
		got = resp.GetLeadership()
		return err
	})
	if err != nil {
		if serr := s.Err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	l := &Leadership{s: s, name: name, term: fencing.Token(got.GetTerm()), priority: got.GetPriority(), requestID: got.GetRequestId(), ownID: own}
	l.held = newHeld(s, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_ELECTION, Name: name, Token: got.GetTerm(), RequestId: got.GetRequestId(), Revision: got.GetRevision()},
		func() error {
			return fmt.Errorf("%w: the server reports the leadership of %q (term %d) ended: resigned from elsewhere (coordctl, an admin, another client with the term) or its session was closed", ErrNotLeader, name, got.GetTerm())
		},
		followedOn(follow, got.GetFollowed()), l.letGo)
	if s.Err() != nil {
		// The session ended while the answer was on its way.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseAttempt)
		defer cancel()
		_ = l.Resign(rctx) // best effort: the leadership ends with the session anyway
		return nil, s.Err()
	}
	if o.onPreempt != nil {
		go l.watchPreemption(got.GetTerm(), o.onPreempt)
	}
	return l, nil
}

// watchPreemption follows the election from the leadership's start until
// it ends, and calls f once if someone asks the leadership to step down.
// It ends with the leadership (its Context).
func (l *Leadership) watchPreemption(term int64, f func(by Candidate)) {
	events := make(chan ElectionEvent)
	done := make(chan error, 1)
	go func() {
		defer close(events)
		// Refused (no election.observe) is permanent here: said once in
		// the log, not retried for the whole term.
		// From the current state, not from the term: a request still in
		// force comes first (Current), and the member serves the stream
		// from its shared watch instead of replaying history (a watch from
		// a past revision, which etcd serves up to 100 ms late).
		done <- l.s.c.observe(l.context(), l.name, 0, events, func(err error) bool {
			return errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrUnauthenticated)
		})
	}()
	asked := false
	for ev := range events {
		if !asked && ev.Type == ElectionPreemptRequested && int64(ev.Leader.Term) == term {
			asked = true
			f(ev.By)
		}
	}
	if err := <-done; l.context().Err() == nil && err != nil {
		l.s.c.lg.Warn("coordd: OnPreempt cannot follow the election; the leader will not hear preemption requests", "election", l.name, "term", term, "err", err)
	}
}

// Name is the election's name.
func (l *Leadership) Name() string { return l.name }

// Term is the leadership's fencing token: strictly greater than every
// earlier leader's term of this election.
func (l *Leadership) Term() fencing.Token { return l.term }

// Priority is the campaign's priority.
func (l *Leadership) Priority() int32 { return l.priority }

// Context is cancelled when the leadership is resigned or lost, no later
// than the session's local deadline (before the server can elect anyone
// else); context.Cause tells why.
func (l *Leadership) Context() context.Context { return l.context() }

// Lost is closed when the leadership is lost without Resign: the session
// ended, or the server reported that this term no longer leads (a Proclaim
// answered so, or the term was resigned from outside this Leadership, e.g.
// by an admin, which the server reports within one round trip on the
// session's keep-alive stream; context.Cause of Context then wraps
// ErrNotLeader).
func (l *Leadership) Lost() <-chan struct{} { return l.lost }

// Proclaim replaces the value the leader proclaims, retrying while coordd
// or etcd is unavailable until ctx ends. If the server answers that this
// term no longer leads, the leadership is lost: ErrNotLeader, and Context
// ends. The attempts carry one proclaim id, so a proclamation retried
// after a lost answer is made, and observed, once.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := context.Cause(l.context()); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	req := &coorddv1.ProclaimRequest{Name: l.name, Term: int64(l.term), Value: value, ProclaimId: randomID()}
	_, err := l.s.c.retry(ctx, releaseAttempt, func(ctx context.Context) error {
		_, err := l.s.c.elections.Proclaim(ctx, req)
		return err
	})
	if errors.Is(err, ErrNotLeader) {
		l.lose(err)
	}
	return err
}

// Resign gives the leadership up, retrying while coordd or etcd is
// unavailable until ctx ends; the next candidate leads at once. It returns
// ErrNotLeader if the server no longer had this term (its session ended
// first). Calling it again after it succeeded returns nil; after it
// failed (ctx ended first, or an error), calling it again tries again.
func (l *Leadership) Resign(ctx context.Context) error {
	tell, again := l.giveUp(ErrResigned)
	if !tell {
		return nil
	}
	req := &coorddv1.ResignRequest{Name: l.name, Term: int64(l.term), SessionId: l.s.id, RequestId: l.requestID, KeepaliveStream: l.s.followStream().stream}
	n, err := l.s.c.retry(ctx, releaseAttempt, func(ctx context.Context) error {
		resp, err := l.s.c.elections.Resign(ctx, req)
		if err == nil {
			l.endedAt.Store(resp.GetRevision())
		}
		return err
	})
	if (n > 1 || again) && errors.Is(err, ErrNotLeader) {
		err = nil // an earlier attempt resigned; its answer was lost
	}
	l.told(err)
	if err == nil && l.ownID {
		l.s.campaignIDs.giveBack(l.name, false, l.requestID)
	}
	return err
}

// ResignedAt is the etcd revision of the commit of this leader's Resign:
// a history read from it (HistoryQuery.MinRevision) shows the term's end
// and its successor's election. It is 0 until a Resign succeeded, and
// stays 0 when an earlier attempt's answer was lost or the term ended
// otherwise.
func (l *Leadership) ResignedAt() int64 { return l.endedAt.Load() }

// letGo tells the server that this leader stepped down when a
// resignation from outside asked it to (its context has ended): the
// leader's own resignation, which lets the next leader in. Retried while
// the session lives.
func (l *Leadership) letGo() {
	req := &coorddv1.ResignRequest{Name: l.name, Term: int64(l.term), SessionId: l.s.id, RequestId: l.requestID, KeepaliveStream: l.s.followStream().stream, Revoked: true}
	_, err := l.s.c.retry(l.s.ctx, releaseAttempt, func(ctx context.Context) error {
		_, err := l.s.c.elections.Resign(ctx, req)
		return err
	})
	switch {
	case err == nil:
		if l.ownID {
			l.s.campaignIDs.giveBack(l.name, false, l.requestID)
		}
	case !errors.Is(err, ErrNotLeader) && l.s.ctx.Err() == nil:
		l.s.lg.Warn("coordd: could not tell the server that a leadership asked for was given up; it ends at the revocation's bound", "election", l.name, "term", l.term, "err", err)
	}
}

// Transfer hands the leadership to a waiting campaign of the session
// successor (its first in line by priority, then arrival, or the campaign
// WithRequestID names) in one commit, and returns the successor's term: a new fencing
// token. Observers see the hand-over as one change, never a vacant seat.
// Context ends with ErrTransferred before the request is sent, so this
// leader has stopped before the successor leads; if the server refuses
// (ErrCandidateNotFound), the leadership goes on under a new Context (call
// Context again). It fails with ErrCandidateNotFound if
// successor has no campaign waiting (the leadership is kept), and with
// ErrNotLeader if this term no longer leads. Unavailable servers are
// retried until ctx ends; a retry whose earlier attempt handed over
// answers ErrNotLeader.
func (l *Leadership) Transfer(ctx context.Context, successor string, opts ...TransferOption) (fencing.Token, error) {
	var o transferOptions
	for _, opt := range opts {
		opt.applyTransfer(&o)
	}
	if err := context.Cause(l.context()); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	req := &coorddv1.TransferRequest{Name: l.name, Term: int64(l.term), SuccessorSessionId: successor, SuccessorRequestId: o.requestID}
	// The context ends now, before the request leaves: the successor can
	// lead only after this leader stopped. The keep-alive stream keeps
	// following the leadership (a refused hand-over keeps it, under a new
	// context): a report of its end waits for the outcome.
	l.expect(ErrTransferred)
	var resp *coorddv1.TransferResponse
	_, err := l.s.c.retry(ctx, releaseAttempt, func(ctx context.Context) error {
		var err error
		resp, err = l.s.c.elections.Transfer(ctx, req)
		return err
	})
	l.settle(err == nil)
	switch {
	case err == nil:
		if l.ownID {
			l.s.campaignIDs.giveBack(l.name, false, l.requestID)
		}
		return fencing.Token(resp.GetTerm()), nil
	case errors.Is(err, ErrNotLeader):
		l.lose(err)
	}
	return 0, err
}

// TransferOption configures Transfer: WithRequestID names the
// successor's campaign when its session campaigns more than once.
type TransferOption interface{ applyTransfer(*transferOptions) }

type transferOptions struct{ requestID string }

// Leader is who leads an election.
type Leader struct {
	Term      fencing.Token
	Value     string
	SessionID string
	RequestID string
	Owner     string // the session's owner, if the session still exists
	Hostname  string
	Since     time.Time
	Proclaims int64 // how many times the leader proclaimed
	Priority  int32
	// RevokingSince is when a resignation from outside asked the leader to
	// step down (zero if none is under way); RevokingUntil is when the
	// term ends if it has not by then.
	RevokingSince, RevokingUntil time.Time
}

// Candidate is a campaign waiting for its turn.
type Candidate struct {
	// Term is no longer set (0): a candidate's term is given when it takes
	// the seat.
	//
	// Deprecated: see Joined.
	Term fencing.Token
	// Joined is the revision at which it joined: among equal priorities,
	// the earlier takes the seat first.
	Joined    int64
	Priority  int32
	Value     string
	SessionID string
	RequestID string
	Owner     string
	Hostname  string
	Enqueued  time.Time
}

func candidateFrom(p *coorddv1.ElectionCandidate) Candidate {
	c := Candidate{Joined: p.GetJoinedRevision(), Priority: p.GetPriority(), Value: p.GetValue(), SessionID: p.GetSessionId(), RequestID: p.GetRequestId(), Owner: p.GetOwner(), Hostname: p.GetHostname()}
	if p.GetEnqueueTime() != nil {
		c.Enqueued = p.GetEnqueueTime().AsTime()
	}
	return c
}

func leaderFrom(p *coorddv1.ElectionLeader) Leader {
	ld := Leader{Term: fencing.Token(p.GetTerm()), Value: p.GetValue(), SessionID: p.GetSessionId(), RequestID: p.GetRequestId(), Owner: p.GetOwner(), Hostname: p.GetHostname(), Proclaims: p.GetProclaims(), Priority: p.GetPriority()}
	if p.GetSince() != nil {
		ld.Since = p.GetSince().AsTime()
	}
	if p.GetRevokingSince() != nil {
		ld.RevokingSince, ld.RevokingUntil = p.GetRevokingSince().AsTime(), p.GetRevokingUntil().AsTime()
	}
	return ld
}

// Leader returns who leads the named election, and ErrNoLeader if nobody
// does.
func (c *Client) Leader(ctx context.Context, name string) (Leader, error) {
	resp, err := c.elections.Leader(ctx, &coorddv1.LeaderRequest{Name: name})
	if err != nil {
		return Leader{}, convert(ctx, err)
	}
	return leaderFrom(resp.GetLeader()), nil
}

// Candidates returns the campaigns waiting for the seat of the named
// election, in the order they would take it: priority, then arrival.
func (c *Client) Candidates(ctx context.Context, name string) ([]Candidate, error) {
	resp, err := c.elections.Candidates(ctx, &coorddv1.CandidatesRequest{Name: name})
	if err != nil {
		return nil, convert(ctx, err)
	}
	var out []Candidate
	for _, p := range resp.GetCandidates() {
		out = append(out, candidateFrom(p))
	}
	return out, nil
}
