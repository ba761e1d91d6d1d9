package clientlib

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/coordd/coordd/fencing"
)

// ElectionOption configures RunAsLeader.
type ElectionOption func(*electionOptions)

type electionOptions struct {
	session    []SessionOption
	onElected  func(term fencing.Token)
	onDemoted  func(term fencing.Token, cause error)
	onExit     func(err error)
	minBackoff time.Duration
	maxBackoff time.Duration
	campaign   []CampaignOption
	stepDown   bool
}

// ErrPreempted is the cause of the callback's context when RunAsLeader
// steps down for a candidate that outranks it (StepDownWhenPreempted).
var ErrPreempted = errors.New("coordd: a candidate of higher priority asked the leader to step down")

// WithElectionCampaign passes options to each campaign (WithPriority,
// WithPreempt).
func WithElectionCampaign(opts ...CampaignOption) ElectionOption {
	return func(o *electionOptions) { o.campaign = append(o.campaign, opts...) }
}

// StepDownWhenPreempted makes the leader yield to a candidate that
// outranks it and asks (WithPreempt): the callback's context ends with
// ErrPreempted; once it returns, the term is resigned (the asker leads
// next) and RunAsLeader campaigns again.
func StepDownWhenPreempted() ElectionOption {
	return func(o *electionOptions) { o.stepDown = true }
}

// WithElectionSession configures the sessions RunAsLeader creates (TTL,
// owner, labels).
func WithElectionSession(opts ...SessionOption) ElectionOption {
	return func(o *electionOptions) { o.session = opts }
}

// OnElected is called, on RunAsLeader's goroutine, when a term begins,
// before the callback runs.
func OnElected(f func(term fencing.Token)) ElectionOption {
	return func(o *electionOptions) { o.onElected = f }
}

// OnDemoted is called, on RunAsLeader's goroutine, when a term ends, after
// the callback has returned and the leadership was resigned (or lost).
// cause says why: the leadership's end (a session error such as
// ErrSessionExpired, ErrNotLeader), ctx's error, or the callback's error;
// it is nil when the callback returned nil, finished with its work. It is
// called only for terms that began.
func OnDemoted(f func(term fencing.Token, cause error)) ElectionOption {
	return func(o *electionOptions) { o.onDemoted = f }
}

// OnExit is called once when RunAsLeader returns, with its result.
func OnExit(f func(err error)) ElectionOption {
	return func(o *electionOptions) { o.onExit = f }
}

// WithElectionBackoff sets the wait before campaigning again after a
// failure: it starts at first and doubles up to limit, with jitter.
// Defaults to 100ms and 10s.
func WithElectionBackoff(first, limit time.Duration) ElectionOption {
	return func(o *electionOptions) { o.minBackoff, o.maxBackoff = first, limit }
}

// resignTimeout bounds the resignation after a term, which runs on a fresh
// context (the caller's may already be cancelled).
const resignTimeout = 5 * time.Second

// RunAsLeader campaigns for the named election and runs fn while this
// process leads, for as long as ctx lasts. It heals itself: a lost
// leadership cancels fn's context and, once fn returns, campaigns again; a
// session that ended is replaced; failures are retried with backoff.
//
// fn receives the leadership (pass its Term to every access of what the
// leader controls, or write through its fenced Put and Delete) and a
// context that ends when leadership ends: at the latest at
// the session's local deadline, before the server can elect anyone else.
// fn must return promptly then. When fn returns, the leadership is
// resigned, so the next candidate leads at once. If fn returns nil while
// still leading, the work is done and RunAsLeader returns nil; if it
// returns an error, RunAsLeader campaigns again after a backoff.
//
// RunAsLeader never runs two fn calls at once. When ctx ends it cancels
// fn, waits for it, resigns (on a fresh bounded context), closes its
// session and returns ctx's error.
func (c *Client) RunAsLeader(ctx context.Context, name, value string, fn func(ctx context.Context, lead *Leadership) error, opts ...ElectionOption) (err error) {
	o := electionOptions{minBackoff: 100 * time.Millisecond, maxBackoff: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	var sess *Session
	defer func() {
		if sess != nil {
			// A session that does not close expires after its TTL.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
			_ = sess.Close(cctx)
			cancel()
		}
		if o.onExit != nil {
			o.onExit(err)
		}
	}()
	backoff := o.minBackoff
	backOff := func() error {
		wait := jittered(backoff)
		backoff = min(2*backoff, o.maxBackoff)
		if !pause(ctx, wait) {
			return ctx.Err()
		}
		return nil
	}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if sess == nil || sess.Err() != nil {
			if sess != nil {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
				_ = sess.Close(cctx) // already ended; tells the server if it still has it
				cancel()
			}
			if sess, err = c.NewSession(ctx, o.session...); err != nil {
				sess = nil
				c.lg.Warn("coordd: election session", "election", name, "error", err)
				if err := backOff(); err != nil {
					return err
				}
				continue
			}
		}
		preempted := make(chan struct{})
		copts := o.campaign
		if o.stepDown {
			var once sync.Once
			copts = append(slices.Clip(copts), OnPreempt(func(Candidate) { once.Do(func() { close(preempted) }) }))
		}
		lead, err := sess.Campaign(ctx, name, value, copts...)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.lg.Warn("coordd: campaign", "election", name, "error", err)
			if err := backOff(); err != nil {
				return err
			}
			continue
		}
		lost, ferr := c.leadTerm(ctx, name, lead, fn, o, preempted)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case lost != nil:
			backoff = o.minBackoff // campaign again at once
		case ferr != nil:
			c.lg.Warn("coordd: leader callback failed", "election", name, "term", lead.Term(), "error", ferr)
			if err := backOff(); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// leadTerm runs fn for lead's term, resigns the term, and tells onElected
// and onDemoted. lost is why the leadership ended before fn returned (nil
// if it still led then; ErrPreempted if it stepped down for preempted);
// ferr is fn's error.
func (c *Client) leadTerm(ctx context.Context, name string, lead *Leadership, fn func(ctx context.Context, lead *Leadership) error, o electionOptions, preempted <-chan struct{}) (lost, ferr error) {
	term := lead.Term()
	if o.onElected != nil {
		o.onElected(term)
	}
	ferr = runLeader(ctx, lead, fn, preempted)
	lost = context.Cause(lead.Context()) // nil while still leading
	select {
	case <-preempted:
		if lost == nil {
			lost = ErrPreempted
		}
	default:
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
	if rerr := lead.Resign(rctx); rerr != nil {
		// The leadership stays with this session until it ends.
		c.lg.Warn("coordd: resign", "election", name, "term", term, "error", rerr)
	}
	cancel()
	cause := lost
	switch {
	case cause != nil:
	case ctx.Err() != nil:
		cause = ctx.Err()
	case ferr != nil:
		cause = ferr
	}
	if o.onDemoted != nil {
		o.onDemoted(term, cause)
	}
	return lost, ferr
}

// runLeader runs fn with a context that ends with ctx, the leadership, or
// preempted (ErrPreempted), turning a panic into an error.
func runLeader(ctx context.Context, lead *Leadership, fn func(context.Context, *Leadership) error, preempted <-chan struct{}) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(lead.Context(), func() { cancel(context.Cause(lead.Context())) })
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-preempted:
			cancel(ErrPreempted)
		case <-done:
		}
	}()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("coordd: leader callback panicked: %v", p)
		}
	}()
	err = fn(fctx, lead)
	if err != nil && errors.Is(err, context.Canceled) && fctx.Err() != nil {
		return nil // fn stopped because it was told to
	}
	return err
}
