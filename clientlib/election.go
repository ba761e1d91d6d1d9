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
type CampaignOption func(*campaignOptions)

type campaignOptions struct {
	requestID string
}

// WithCampaignID sets the campaign's idempotency key. By default the SDK
// picks one (random, or the id of this session's last resigned campaign in
// the same election; see requestIDs) and reuses it when it retries; set it
// to resume a candidacy across process restarts of the same session.
func WithCampaignID(id string) CampaignOption {
	return func(o *campaignOptions) { o.requestID = id }
}

// ErrResigned is the cause of a leadership's Context after Resign.
var ErrResigned = errors.New("coordd: leadership resigned")

// Leadership is a won election. Act as leader only while Context is not
// done, and pass Term with every access to what the leader controls, so
// the resource can reject a leader that was deposed.
type Leadership struct {
	*held
	s         *Session
	name      string
	term      fencing.Token
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
		opt(&o)
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
		resp, err := s.c.elections.Campaign(ctx, &coorddv1.CampaignRequest{Name: name, SessionId: s.id, Value: value, RequestId: o.requestID, KeepaliveStream: follow.stream})
		got = resp.GetLeadership()
		return err
	})
	if err != nil {
		if serr := s.Err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	l := &Leadership{s: s, name: name, term: fencing.Token(got.GetTerm()), requestID: got.GetRequestId(), ownID: own}
	l.held = newHeld(s, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_ELECTION, Name: name, Token: got.GetTerm(), RequestId: got.GetRequestId(), Revision: got.GetRevision()},
		func() error {
			return fmt.Errorf("%w: the server reports the leadership of %q (term %d) ended: resigned from elsewhere (coordctl, an admin, another client with the term) or its session was closed", ErrNotLeader, name, got.GetTerm())
		},
		followedOn(follow, got.GetFollowed()))
	if s.Err() != nil {
		// The session ended while the answer was on its way.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseAttempt)
		defer cancel()
		_ = l.Resign(rctx) // best effort: the leadership ends with the session anyway
		return nil, s.Err()
	}
	return l, nil
}

// Name is the election's name.
func (l *Leadership) Name() string { return l.name }

// Term is the leadership's fencing token: strictly greater than every
// earlier leader's term of this election.
func (l *Leadership) Term() fencing.Token { return l.term }

// Context is cancelled when the leadership is resigned or lost, no later
// than the session's local deadline (before the server can elect anyone
// else); context.Cause tells why.
func (l *Leadership) Context() context.Context { return l.ctx }

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
// ends. A proclamation retried after a lost answer may be observed twice.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := context.Cause(l.ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	_, err := l.s.c.retry(ctx, releaseAttempt, func(ctx context.Context) error {
		_, err := l.s.c.elections.Proclaim(ctx, &coorddv1.ProclaimRequest{Name: l.name, Term: int64(l.term), Value: value})
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
		_, err := l.s.c.elections.Resign(ctx, req)
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
}

// Candidate is a campaign waiting for its turn.
type Candidate struct {
	Term      fencing.Token // the term it will hold once elected
	Value     string
	SessionID string
	RequestID string
	Owner     string
	Hostname  string
	Enqueued  time.Time
}

func leaderFrom(p *coorddv1.ElectionLeader) Leader {
	ld := Leader{Term: fencing.Token(p.GetTerm()), Value: p.GetValue(), SessionID: p.GetSessionId(), RequestID: p.GetRequestId(), Owner: p.GetOwner(), Hostname: p.GetHostname(), Proclaims: p.GetProclaims()}
	if p.GetSince() != nil {
		ld.Since = p.GetSince().AsTime()
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

// Candidates returns the campaigns waiting behind the leader of the named
// election, in the order they will lead.
func (c *Client) Candidates(ctx context.Context, name string) ([]Candidate, error) {
	resp, err := c.elections.Candidates(ctx, &coorddv1.CandidatesRequest{Name: name})
	if err != nil {
		return nil, convert(ctx, err)
	}
	var out []Candidate
	for _, p := range resp.GetCandidates() {
		out = append(out, Candidate{Term: fencing.Token(p.GetTerm()), Value: p.GetValue(), SessionID: p.GetSessionId(), RequestID: p.GetRequestId(), Owner: p.GetOwner(), Hostname: p.GetHostname(), Enqueued: p.GetEnqueueTime().AsTime()})
	}
	return out, nil
}
