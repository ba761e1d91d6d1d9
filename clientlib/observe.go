package clientlib

import (
	"context"
	"errors"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ElectionEventType is what happened to an election.
type ElectionEventType int

// Election event types.
const (
	// ElectionElected: Leader now leads (a new term).
	ElectionElected ElectionEventType = iota + 1
	// ElectionProclaimed: the leader proclaimed a new value.
	ElectionProclaimed
	// ElectionResigned: Leader resigned.
	ElectionResigned
	// ElectionExpired: Leader stopped leading without resigning (its
	// session expired or was closed).
	ElectionExpired
	// ElectionVacant: nobody leads.
	ElectionVacant
	// ElectionPreemptRequested: a waiting candidate that outranks Leader
	// asked it to step down (ElectionEvent.By); the leader decides when.
	ElectionPreemptRequested
	// ElectionRevoking: a resignation from outside asks Leader to step
	// down now (Leader.RevokingSince, RevokingUntil); the Go SDK of the
	// leader ends its leadership and resigns by itself.
	ElectionRevoking
)

func (t ElectionEventType) String() string {
	switch t {
	case ElectionElected:
		return "ELECTED"
	case ElectionProclaimed:
		return "PROCLAIMED"
	case ElectionResigned:
		return "RESIGNED"
	case ElectionExpired:
		return "EXPIRED"
	case ElectionVacant:
		return "VACANT"
	case ElectionPreemptRequested:
		return "PREEMPT_REQUESTED"
	case ElectionRevoking:
		return "REVOKING"
	}
	return "UNKNOWN"
}

var electionEventTypes = map[coorddv1.ElectionEventType]ElectionEventType{
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_ELECTED:    ElectionElected,
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_PROCLAIMED: ElectionProclaimed,
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_RESIGNED:   ElectionResigned,
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_EXPIRED:    ElectionExpired,
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_VACANT:     ElectionVacant,

	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_PREEMPT_REQUESTED: ElectionPreemptRequested,
	coorddv1.ElectionEventType_ELECTION_EVENT_TYPE_REVOKING:          ElectionRevoking,
}

// ElectionEvent is one change of an election.
type ElectionEvent struct {
	Type     ElectionEventType
	Revision int64
	// Leader is the new leader (Elected, Proclaimed), the one that left
	// (Resigned, Expired) or the one asked to step down
	// (PreemptRequested); zero for Vacant.
	Leader Leader
	// By is the candidate that asked the leader to step down
	// (PreemptRequested only): its session, campaign and priority.
	By Candidate
	// Current marks an event that states the election's state rather than
	// a change: the first event, or the first after a gap the server could
	// not replay (its history was compacted). Events before it may have
	// been missed.
	Current bool
}

// ObserveOption configures Observe.
type ObserveOption func(*observeOptions)

type observeOptions struct {
	from int64
}

// ObserveFrom resumes observing at revision rev (the last revision seen +
// 1) instead of starting with the current state.
func ObserveFrom(rev int64) ObserveOption { return func(o *observeOptions) { o.from = rev } }

// Observer follows an election; see Client.Observe.
type Observer struct {
	events chan ElectionEvent
	err    error // why Events was closed; set before closing
}

// Events delivers the election's events in order. It is closed when the
// observation ends; Err then says why.
func (o *Observer) Events() <-chan ElectionEvent { return o.events }

// Err returns why Events was closed: ctx's error, or a permanent error
// (ErrInvalidArgument). Call it after Events is closed.
func (o *Observer) Err() error { return o.err }

// Observe follows the named election until ctx ends. The first event
// states who leads now (or that nobody does); then every change arrives
// in order, each proclamation included. When the connection breaks, the
// observer reconnects (to any endpoint) and resumes after the last
// revision it delivered, so nothing is skipped; if the server's history no
// longer reaches back that far, it restarts from the current state (an
// event marked Current). Events wait for the reader: a slow reader slows
// the stream, it does not lose events.
func (c *Client) Observe(ctx context.Context, name string, opts ...ObserveOption) *Observer {
	var o observeOptions
	for _, opt := range opts {
		opt(&o)
	}
	obs := &Observer{events: make(chan ElectionEvent)}
	go func() {
		defer close(obs.events)
		obs.err = c.observe(ctx, name, o.from, obs.events, func(err error) bool { return errors.Is(err, ErrInvalidArgument) })
	}()
	return obs
}

// observe follows name from revision from into out until ctx ends or an
// error that permanent says retrying cannot fix.
func (c *Client) observe(ctx context.Context, name string, from int64, out chan<- ElectionEvent, permanent func(error) bool) error {
	open := func(ctx context.Context, from int64) (func() (*coorddv1.ObserveResponse, error), error) {
		st, err := c.elections.Observe(ctx, &coorddv1.ObserveRequest{Name: name, FromRevision: from})
		if err != nil {
			return nil, err
		}
		return st.Recv, nil
	}
	deliver := func(msg *coorddv1.ObserveResponse) error {
		for _, ev := range msg.GetEvents() {
			e := ElectionEvent{Type: electionEventTypes[ev.GetType()], Revision: ev.GetRevision(), Current: ev.GetCurrent()}
			if ev.GetLeader() != nil {
				e.Leader = leaderFrom(ev.GetLeader())
			}
			if ev.GetBy() != nil {
				e.By = candidateFrom(ev.GetBy())
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	return follow(ctx, from, open, deliver, permanent)
}
