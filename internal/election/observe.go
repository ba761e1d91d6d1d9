package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/session"
)

// EventType is what happened to an election.
type EventType int

// Event types.
const (
	// Elected: Leader now leads (a new term).
	Elected EventType = iota + 1
	// Proclaimed: the leader proclaimed a new value (Leader.Value).
	Proclaimed
	// Resigned: Leader resigned.
	Resigned
	// Expired: Leader stopped leading without resigning: its session
	// ended (expired or closed) or its campaign was abandoned.
	Expired
	// Vacant: nobody leads.
	Vacant
	// PreemptRequested: a waiting candidate that outranks Leader asked it
	// to step down (Event.By); the leader decides when.
	PreemptRequested
	// Revoking: a resignation from outside asks Leader to step down now
	// (Leader.RevokingSince, RevokingUntil): the next leader is elected once
	// it resigns, or at the bound.
	Revoking
)

func (t EventType) String() string {
	switch t {
	case Elected:
		return "ELECTED"
	case Proclaimed:
		return "PROCLAIMED"
	case Resigned:
		return "RESIGNED"
	case Expired:
		return "EXPIRED"
	case Vacant:
		return "VACANT"
	case PreemptRequested:
		return "PREEMPT_REQUESTED"
	case Revoking:
		return "REVOKING"
	}
	return "EventType(" + strconv.Itoa(int(t)) + ")"
}

// Event is one change of an election.
type Event struct {
	Type     EventType
	Revision int64
	// Leader is the new leader (Elected, Proclaimed), the one that left
	// (Resigned, Expired) or the one asked to step down
	// (PreemptRequested); zero for Vacant.
	Leader Leader
	// By is the candidate that asked the leader to step down
	// (PreemptRequested only): its session, request id and priority.
	By Candidate
	// Current marks an event that states the election's state at Revision
	// (Elected or Vacant) rather than a change made at it: the first event
	// of a stream that did not resume, or of one whose resume revision was
	// compacted away. Events before it may have been missed.
	Current bool
}

// Observe calls send with the events of each etcd revision that changes the
// election, in revision order, until ctx ends (returning ctx's error) or
// send fails (returning its error).
//
// With from == 0 the first call states the current state (Current). With
// from > 0 the stream resumes: it starts with the changes made at from and
// later, as if it had watched since from-1; pass the last delivered
// revision + 1 (from == 1 replays the election's whole history). If from-1
// was compacted away, the stream starts with the current state instead.
// Changes come through the member's shared watch (grantwatch): an observer
// opens an etcd watch of its own only to replay history (a resume from
// before the shared watch's position, or after the shared watch
// restarted), until it has caught up. Nothing is skipped between two calls
// of send; a replay that hits compaction restarts from the current state.
func (m *Manager) Observe(ctx context.Context, name string, from int64, send func([]Event) error) error {
	if err := validateName(name); err != nil {
		return err
	}
	if from < 0 {
		return fmt.Errorf("%w: revision %d is negative", ErrInvalid, from)
	}
	o := &observer{seats: m.seats(name), resigned: m.resignedKey(name), preempt: m.preemptKey(name), marks: m.prefix(name) + "revoke/",
		entries: map[string]*mvccpb.KeyValue{}, revoking: map[int64]revoke.Mark{}}
	prefix := m.prefix(name)
	// Subscribed before any read: every change above pos will come
	// through the member's shared watch.
	feed, pos := m.dels.Subscribe(prefix, true)
	defer feed.Stop()
	rev, resumed, err := m.resumeAt(ctx, name, o, from) // rev: the revision o reflects
	if err != nil {
		return err
	}
	resync := func() error {
		resp, err := m.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("election: observe %q: %w", name, err)
		}
		o.load(resp.Kvs)
		rev = resp.Header.Revision
		return send(o.current(rev))
	}
	if !resumed {
		if err := resync(); err != nil {
			return err
		}
	}
	backoff := 50 * time.Millisecond
	var early []*clientv3.Event // from the feed, after a gap not yet caught up
	for {
		if rev < pos {
			// Changes up to pos are not coming through the feed (a resume
			// from before it, or its watch restarted): read them from
			// etcd's history with a watch of this observer's own, until
			// it has passed pos.
			compacted, err := m.catchUp(ctx, o, prefix, &rev, pos, send)
			if err != nil {
				return err
			}
			if compacted {
				early = nil
				if err := resync(); err != nil {
					return err
				}
				continue
			}
			if rev < pos {
				// The watch broke (no leader, a reconnect): reopen it
				// after rev.
				timer := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
					timer.Stop()
					return ctx.Err()
				case <-timer.C:
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = 50 * time.Millisecond
		}
		if err := applyEvents(o, &rev, early, send); err != nil {
			return err
		}
		early = nil
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-feed.Ready():
		}
		evs, restartedAt := feed.Take()
		if restartedAt != 0 && rev < restartedAt {
			pos, early = restartedAt, evs
			continue
		}
		if err := applyEvents(o, &rev, evs, send); err != nil {
			return err
		}
	}
}

// resumeAt loads into o the election as it was just before revision from,
// when from names one that can be read: resumed is then true and rev is
// from-1 (from 1: nothing existed, rev 0). From 0, or a compacted from,
// resumed is false and the observer starts from the current state.
func (m *Manager) resumeAt(ctx context.Context, name string, o *observer, from int64) (rev int64, resumed bool, err error) {
	switch {
	case from == 1:
		// Before revision 1 nothing existed: replay everything (etcd
		// would read "revision 0" as the current one).
		return 0, true, nil
	case from > 1:
		resp, err := m.cli.Get(ctx, m.prefix(name), clientv3.WithPrefix(), clientv3.WithRev(from-1))
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			// Start from the current state.
		case errors.Is(err, rpctypes.ErrFutureRev):
			return 0, false, fmt.Errorf("%w: revision %d is in the future", ErrInvalid, from)
		case err != nil:
			return 0, false, fmt.Errorf("election: observe %q: %w", name, err)
		default:
			o.load(resp.Kvs)
			return from - 1, true, nil
		}
	}
	return 0, false, nil
}

// catchUp watches the election after *rev and sends its events until it
// has passed until or the watch ends. It reports compaction, and returns
// an error only for ctx's end or send's failure.
func (m *Manager) catchUp(ctx context.Context, o *observer, prefix string, rev *int64, until int64, send func([]Event) error) (compacted bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range m.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(*rev+1)) {
		if wr.CompactRevision != 0 {
			return true, nil
		}
		if wr.Err() != nil {
			break
		}
		if err := applyEvents(o, rev, wr.Events, send); err != nil {
			return false, err
		}
		if *rev >= until {
			return false, nil
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return false, nil
}

// applyEvents applies the etcd events above *rev, one revision at a time
// (a transaction's changes are one step of the election), and sends the
// election events they make.
func applyEvents(o *observer, rev *int64, evs []*clientv3.Event, send func([]Event) error) error {
	for len(evs) > 0 {
		r := evs[0].Kv.ModRevision
		n := 1
		for n < len(evs) && evs[n].Kv.ModRevision == r {
			n++
		}
		group := evs[:n]
		evs = evs[n:]
		if r <= *rev {
			continue // reflected already
		}
		out := o.apply(r, group)
		*rev = r
		if len(out) > 0 {
			if err := send(out); err != nil {
				return err
			}
		}
	}
	return nil
}

// observer tracks an election's seat to turn etcd events into election
// events.
type observer struct {
	seats    string // the seat's key prefix
	resigned string // the resignation marker's key
	preempt  string // the preemption request's key
	marks    string // the revocation marks' prefix
	entries  map[string]*mvccpb.KeyValue
	pre      *mvccpb.KeyValue      // the preemption request, if any
	revoking map[int64]revoke.Mark // revocations in progress, by term
}

func (o *observer) load(kvs []*mvccpb.KeyValue) {
	clear(o.entries)
	clear(o.revoking)
	o.pre = nil
	for _, kv := range kvs {
		switch k := string(kv.Key); {
		case strings.HasPrefix(k, o.seats):
			o.entries[k] = kv
		case k == o.preempt:
			o.pre = kv
		case strings.HasPrefix(k, o.marks):
			o.mark(kv, true)
		}
	}
}

// mark applies a put (or, put false, a delete) of a revocation mark and
// returns its term (0 if kv is none).
func (o *observer) mark(kv *mvccpb.KeyValue, put bool) int64 {
	term, err := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), o.marks), 10, 64)
	if err != nil {
		return 0
	}
	if !put {
		delete(o.revoking, term)
		return term
	}
	if mk, ok := revoke.DecodeMark(kv.Value); ok {
		o.revoking[term] = mk
	}
	return term
}

// revocation returns the event for a revocation of head's term, if one
// is in progress.
func (o *observer) revocation(rev int64, head *mvccpb.KeyValue, current bool) []Event {
	if head == nil {
		return nil
	}
	if _, ok := o.revoking[head.CreateRevision]; !ok {
		return nil
	}
	return []Event{{Type: Revoking, Revision: rev, Leader: o.leader(head), Current: current}}
}

// head is the seat: the lowest create revision, should there be two.
func (o *observer) head() *mvccpb.KeyValue {
	var h *mvccpb.KeyValue
	for _, kv := range o.entries {
		if h == nil || kv.CreateRevision < h.CreateRevision {
			h = kv
		}
	}
	return h
}

func (o *observer) leader(kv *mvccpb.KeyValue) Leader {
	ld, _ := leaderFromSeat(o.seats, kv)
	if mk, ok := o.revoking[kv.CreateRevision]; ok {
		ld.RevokingSince, ld.RevokingUntil = mk.Since, mk.Until
	}
	return ld
}

// preemption returns the event for a preemption request pre that names
// the term of head, if it does.
func (o *observer) preemption(rev int64, head, pre *mvccpb.KeyValue, current bool) []Event {
	if head == nil || pre == nil {
		return nil
	}
	var p preemption
	if json.Unmarshal(pre.Value, &p) != nil || p.Term != head.CreateRevision {
		return nil
	}
	sess, _ := session.ParseID(p.Session)
	return []Event{{Type: PreemptRequested, Revision: rev, Leader: o.leader(head), Current: current,
		By: Candidate{Session: sess, RequestID: p.RequestID, Priority: p.Priority, Joined: pre.CreateRevision}}}
}

func (o *observer) current(rev int64) []Event {
	h := o.head()
	if h == nil {
		return []Event{{Type: Vacant, Revision: rev, Current: true}}
	}
	out := append([]Event{{Type: Elected, Revision: rev, Leader: o.leader(h), Current: true}}, o.preemption(rev, h, o.pre, true)...)
	return append(out, o.revocation(rev, h, true)...)
}

// apply applies one revision's etcd events and returns the election events
// they make.
func (o *observer) apply(rev int64, evs []*clientv3.Event) []Event {
	old := o.head()
	resigned := int64(0)
	headPut := false
	var pre *mvccpb.KeyValue
	marked := int64(0) // the term a revocation mark was put for
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		switch {
		case strings.HasPrefix(k, o.marks):
			if t := o.mark(ev.Kv, ev.Type == mvccpb.PUT); ev.Type == mvccpb.PUT {
				marked = t
			}
		case k == o.resigned && ev.Type == mvccpb.PUT:
			resigned, _ = strconv.ParseInt(string(ev.Kv.Value), 10, 64)
		case k == o.preempt:
			o.pre = nil
			if ev.Type == mvccpb.PUT {
				o.pre, pre = ev.Kv, ev.Kv
			}
		case strings.HasPrefix(k, o.seats) && ev.Type == mvccpb.PUT:
			o.entries[k] = ev.Kv
			if old != nil && k == string(old.Key) && ev.Kv.CreateRevision == old.CreateRevision {
				headPut = true
			}
		case strings.HasPrefix(k, o.seats):
			delete(o.entries, k)
		}
	}
	cur := o.head()
	var out []Event
	switch {
	case old != nil && (cur == nil || cur.CreateRevision != old.CreateRevision):
		typ := Expired
		if resigned == old.CreateRevision {
			typ = Resigned
		}
		out = append(out, Event{Type: typ, Revision: rev, Leader: o.leader(old)})
		if cur == nil {
			out = append(out, Event{Type: Vacant, Revision: rev})
		} else {
			out = append(out, Event{Type: Elected, Revision: rev, Leader: o.leader(cur)})
		}
	case old == nil && cur != nil:
		out = append(out, Event{Type: Elected, Revision: rev, Leader: o.leader(cur)})
	case old != nil && headPut:
		before, after := o.leader(old), o.leader(cur)
		if after.Proclaims != before.Proclaims {
			out = append(out, Event{Type: Proclaimed, Revision: rev, Leader: after})
		}
	}
	out = append(out, o.preemption(rev, cur, pre, false)...)
	if cur != nil && marked == cur.CreateRevision {
		out = append(out, o.revocation(rev, cur, false)...)
	}
	for term := range o.revoking {
		if cur == nil || term < cur.CreateRevision {
			delete(o.revoking, term) // its term ended (its mark goes with the session)
		}
	}
	return out
}
