package history

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/lock"
	"github.com/coordd/coordd/session"
)

// state is what the recorder knows of etcd at one revision: every lock
// and election queue with its holders, and every session record.
type state struct {
	lockRoot, electionRoot, sessionRoot string
	queues                              map[string]*queueState // by queue prefix
	sessions                            map[session.ID]session.Record
}

// queueState is one lock's or election's queue.
type queueState struct {
	kind    Kind
	name    string
	entries []*mvccpb.KeyValue // in create-revision order
	held    map[string]holder  // the entries that hold it, by key
}

// holder is an entry that holds its lock (or leads), and since when.
type holder struct {
	token int64
	lease int64
	since time.Time
}

// entryValue is what the recorder reads of a lock waiter's or a
// candidate's JSON.
type entryValue struct {
	RequestID string    `json:"request_id"`
	Read      bool      `json:"read"`
	Enqueued  time.Time `json:"enqueued"`
	Granted   time.Time `json:"granted"`
	Elected   time.Time `json:"elected"`
}

func newState(root string) *state {
	return &state{
		lockRoot: root + "lock/", electionRoot: root + "election/", sessionRoot: session.RecordPrefix(root),
		queues: map[string]*queueState{}, sessions: map[session.ID]session.Record{},
	}
}

// load reads the state at revision rev (0: the current one) and returns
// the revision it read.
func (s *state) load(ctx context.Context, cli *clientv3.Client, rev int64) (int64, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(s.sessionRoot, opts...),
		clientv3.OpGet(s.lockRoot, opts...),
		clientv3.OpGet(s.electionRoot, opts...),
	).Commit()
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			s.put(kv, nil, nil)
		}
	}
	for _, q := range s.queues {
		slices.SortFunc(q.entries, func(a, b *mvccpb.KeyValue) int { return int(a.CreateRevision - b.CreateRevision) })
		for _, kv := range q.entries[:q.heldCount()] {
			v := decodeEntry(kv.Value)
			since := v.Enqueued
			for _, t := range []time.Time{v.Granted, v.Elected} {
				if !t.IsZero() {
					since = t
				}
			}
			q.held[string(kv.Key)] = holder{token: kv.CreateRevision, lease: kv.Lease, since: since}
		}
	}
	return rev, nil
}

func decodeEntry(b []byte) entryValue {
	var v entryValue
	_ = json.Unmarshal(b, &v)
	return v
}

// queueOf returns the queue an entry key belongs to (its prefix), or ""
// for any other key; marker reports the key of an election's resignation
// marker instead.
func (s *state) queueOf(key string) (prefix string, k Kind, name string, marker bool) {
	for _, r := range []struct {
		root string
		kind Kind
	}{{s.lockRoot, Lock}, {s.electionRoot, Election}} {
		rest, ok := strings.CutPrefix(key, r.root)
		if !ok {
			continue
		}
		esc, sub, ok := strings.Cut(rest, "/")
		if !ok {
			return "", "", "", false
		}
		prefix = r.root + esc + "/q/"
		switch {
		case strings.HasPrefix(sub, "q/"):
			return prefix, r.kind, names.Unescape(esc), false
		case r.kind == Election && sub == "resigned":
			return prefix, r.kind, names.Unescape(esc), true
		}
		return "", "", "", false
	}
	return "", "", "", false
}

// put applies a put of kv. touched collects the queues it changes,
// resigned the terms whose resignation markers it writes.
func (s *state) put(kv *mvccpb.KeyValue, touched map[string]bool, resigned map[string]int64) {
	key := string(kv.Key)
	if rest, ok := strings.CutPrefix(key, s.sessionRoot); ok {
		if id, rec, ok := session.ParseRecord(rest, kv.Value); ok {
			if rec.EndedBy != "" {
				// The clock marks an ended session with a record that
				// names only the member: keep who it was.
				prev := s.sessions[id]
				prev.EndedBy = rec.EndedBy
				rec = prev
			}
			s.sessions[id] = rec
		}
		return
	}
	prefix, k, name, marker := s.queueOf(key)
	if prefix == "" {
		return
	}
	if marker {
		if term, err := strconv.ParseInt(string(kv.Value), 10, 64); err == nil && resigned != nil {
			resigned[prefix] = term
		}
		return
	}
	q := s.queues[prefix]
	if q == nil {
		q = &queueState{kind: k, name: name, held: map[string]holder{}}
		s.queues[prefix] = q
	}
	if touched != nil {
		touched[prefix] = true
	}
	for i, e := range q.entries {
		if string(e.Key) == key {
			q.entries[i] = kv // a new value for the same entry
			return
		}
	}
	q.entries = append(q.entries, kv) // new entries are the youngest
}

// del applies a delete of key. closed collects the sessions whose records
// it deletes.
func (s *state) del(key string, touched map[string]bool, closed map[session.ID]bool) {
	if rest, ok := strings.CutPrefix(key, s.sessionRoot); ok {
		if id, err := session.ParseID(rest); err == nil {
			closed[id] = true
		}
		return
	}
	prefix, _, _, marker := s.queueOf(key)
	q := s.queues[prefix]
	if q == nil || marker {
		return
	}
	if i := slices.IndexFunc(q.entries, func(e *mvccpb.KeyValue) bool { return string(e.Key) == key }); i >= 0 {
		q.entries = slices.Delete(q.entries, i, i+1)
		touched[prefix] = true
	}
}

// heldCount is how many entries at the head hold the lock or lead.
func (q *queueState) heldCount() int {
	if q.kind == Election {
		return min(1, len(q.entries))
	}
	return lock.HeldCount(q.entries)
}

// apply applies the events of revision rev, seen at now, and returns the
// history events they make, numbered from 0 in a fixed order (queues by
// key, ends before grants, ends by token), so that deriving a revision
// again from the same state gives the same events.
func (s *state) apply(rev int64, evs []*clientv3.Event, now time.Time) []Event {
	touched, closed, resigned := map[string]bool{}, map[session.ID]bool{}, map[string]int64{}
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			s.del(string(ev.Kv.Key), touched, closed)
		} else {
			s.put(ev.Kv, touched, resigned)
		}
	}
	var out []Event
	for _, prefix := range slices.Sorted(maps.Keys(touched)) {
		out = append(out, s.step(s.queues[prefix], rev, now, closed, resigned[prefix])...)
		if q := s.queues[prefix]; len(q.entries) == 0 && len(q.held) == 0 {
			delete(s.queues, prefix)
		}
	}
	for id := range closed {
		delete(s.sessions, id)
	}
	for i := range out {
		out[i].seq = i
	}
	return out
}

// step derives one queue's events at rev: the ends of holders whose
// entries are gone, then the grants to entries that came to hold it.
func (s *state) step(q *queueState, rev int64, now time.Time, closed map[session.ID]bool, resignedTerm int64) []Event {
	present := make(map[string]bool, len(q.entries))
	for _, e := range q.entries {
		present[string(e.Key)] = true
	}
	var out []Event
	var ended []string
	for key := range q.held {
		if !present[key] {
			ended = append(ended, key)
		}
	}
	slices.SortFunc(ended, func(a, b string) int { return int(q.held[a].token - q.held[b].token) })
	for _, key := range ended {
		h := q.held[key]
		delete(q.held, key)
		e := s.event(q, h.lease, rev, now)
		e.Token, e.Held = h.token, max(now.Sub(h.since), 0)
		e.Type, e.Reason = s.endReason(q.kind, h, closed, resignedTerm)
		out = append(out, e)
	}
	for _, kv := range q.entries[:q.heldCount()] {
		key := string(kv.Key)
		if _, ok := q.held[key]; ok {
			continue
		}
		v := decodeEntry(kv.Value)
		e := s.event(q, kv.Lease, rev, now)
		e.Type, e.Token, e.RequestID, e.Read = Granted, kv.CreateRevision, v.RequestID, v.Read
		if q.kind == Election {
			e.Type = Elected
		}
		if kv.CreateRevision != rev && !v.Enqueued.IsZero() {
			e.Waited = max(now.Sub(v.Enqueued), 0)
		}
		if len(ended) > 0 {
			e.HandedFrom = out[0].Token
		}
		q.held[key] = holder{token: kv.CreateRevision, lease: kv.Lease, since: now}
		out = append(out, e)
	}
	return out
}

// event starts an event of q for the session of lease.
func (s *state) event(q *queueState, lease, rev int64, now time.Time) Event {
	rec := s.sessions[session.ID(lease)]
	return Event{Kind: q.kind, Name: q.name, Session: fmt.Sprintf("%016x", uint64(lease)), Owner: rec.Owner,
		Principal: rec.Principal, Hostname: rec.Hostname, Revision: rev, Time: now}
}

// endReason says why the holding h ended at a revision that closed the
// sessions in closed and resigned the term resignedTerm (0: none).
func (s *state) endReason(k Kind, h holder, closed map[session.ID]bool, resignedTerm int64) (Type, string) {
	id := session.ID(h.lease)
	switch {
	case k == Election && resignedTerm == h.token:
		return Resigned, "the leader resigned"
	case closed[id]:
		if by := s.sessions[id].EndedBy; by != "" {
			return Expired, "its session was not renewed within its TTL; member " + by + " ended it"
		}
		return SessionClosed, "its session was closed (or its etcd lease ended)"
	case k == Lock:
		return Released, "released"
	}
	return Removed, "its candidacy was removed without a resignation"
}
