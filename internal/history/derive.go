package history

import (
	"cmp"
	"container/list"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/flatjson"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
)

// state is what the recorder knows of etcd at one revision: every lock
// and election queue with its holders, and every session record.
type state struct {
	keys                                keys // the history's, for events' n/ prefixes
	lockRoot, electionRoot, sessionRoot string
	queues                              map[string]*queueState // by queue prefix
	sessions                            map[session.ID]session.Record
	// apply's scratch, emptied for every revision.
	touched  map[string]bool
	closed   map[session.ID]bool
	resigned map[string]int64
	revoked  map[*queueState]revoke.Ended // outcome records written this revision
	now      time.Time                    // when the revision being applied was seen
	out      []Event
	// emptied counts queues left empty since the last sweep: an empty
	// queue is kept for its lock's next acquisition (a lock taken and
	// released in turn empties its queue every time), and swept out
	// once as many queues were emptied as there are queues.
	emptied int
}

// queueState is one lock's or election's queue. Entries are kept in a
// list in create-revision order (new entries are the youngest, so they go
// at the back) with an index by key: a put, a delete and finding the
// holders cost O(1) plus the holders, whatever the queue's length.
type queueState struct {
	kind    Kind
	name    string
	named   string                   // its events' n/ prefix
	entries list.List                // of *entry, in create-revision order
	byKey   map[string]*list.Element // the entries' elements
	held    map[string]holder        // the entries that hold it, by key
	// revoking are the grants (by token) a revocation asked to let go,
	// and when the recorder saw the request.
	revoking map[int64]time.Time
}

// entry is a queue entry as etcd holds it, and its value decoded (once,
// when it is put: finding the holders reads it again and again).
type entry struct {
	kv *mvccpb.KeyValue
	v  entryValue
}

// sort puts the entries in create-revision order (after a load, which
// reads them in key order).
func (q *queueState) sort() {
	es := make([]*entry, 0, q.entries.Len())
	for e := q.entries.Front(); e != nil; e = e.Next() {
		es = append(es, e.Value.(*entry))
	}
	slices.SortFunc(es, func(a, b *entry) int { return cmp.Compare(a.kv.CreateRevision, b.kv.CreateRevision) })
	q.entries.Init()
	for _, en := range es {
		q.byKey[string(en.kv.Key)] = q.entries.PushBack(en)
	}
}

// first returns up to n entries from the head.
func (q *queueState) first(n int) []*entry {
	var out []*entry
	for e := q.entries.Front(); e != nil && len(out) < n; e = e.Next() {
		out = append(out, e.Value.(*entry))
	}
	return out
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
	Limit     int       `json:"limit"` // a lock's
	RequestID string    `json:"request_id"`
	Read      bool      `json:"read"`
	Enqueued  time.Time `json:"enqueued"`
	Granted   time.Time `json:"granted"`
	Since     time.Time `json:"since"` // a seat's
}

func newState(root string) *state {
	return &state{
		keys:     keys{base: root + "timeline/"},
		lockRoot: root + "lock/", electionRoot: root + "election/", sessionRoot: session.RecordPrefix(root),
		queues: map[string]*queueState{}, sessions: map[session.ID]session.Record{},
		touched: map[string]bool{}, closed: map[session.ID]bool{}, resigned: map[string]int64{},
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
		q.sort()
		for _, en := range q.holders() {
			kv, v := en.kv, en.v
			since := v.Enqueued
			for _, t := range []time.Time{v.Granted, v.Since} {
				if !t.IsZero() {
					since = t
				}
			}
			q.held[string(kv.Key)] = holder{token: kv.CreateRevision, lease: kv.Lease, since: since}
		}
	}
	return rev, nil
}

// decodeEntry decodes a queue entry's value as json.Unmarshal does (a
// value it cannot decode gives what it decoded before the failure): the
// values coordd writes without reflection, anything else with
// encoding/json.
func decodeEntry(b []byte) entryValue {
	if v, ok := decodeEntryFlat(b); ok {
		return v
	}
	var v entryValue
	_ = json.Unmarshal(b, &v)
	return v
}

// decodeEntryFlat decodes b if package flatjson reads it and every member
// it names is of its field's type.
func decodeEntryFlat(b []byte) (entryValue, bool) {
	var v entryValue
	o := flatjson.NewObject(b)
	for {
		key, raw, more := o.Next()
		if !more {
			return v, o.Readable()
		}
		ok := true
		switch string(key) {
		case "limit":
			var n int64
			n, ok = flatjson.Int(raw)
			v.Limit = int(n)
		case "request_id":
			v.RequestID, ok = flatjson.String(raw)
		case "read":
			v.Read, ok = flatjson.Bool(raw)
		case "enqueued":
			ok = raw[0] == '"' && v.Enqueued.UnmarshalJSON(raw) == nil
		case "granted":
			ok = raw[0] == '"' && v.Granted.UnmarshalJSON(raw) == nil
		case "since":
			ok = raw[0] == '"' && v.Since.UnmarshalJSON(raw) == nil
		default:
			// encoding/json matches a field's name in any case.
			for _, f := range entryFields {
				if strings.EqualFold(string(key), f) {
					return v, false
				}
			}
		}
		if !ok {
			return v, false
		}
	}
}

// entryFields are entryValue's JSON names.
var entryFields = [...]string{"limit", "request_id", "read", "enqueued", "granted", "since"}

// queueOf returns the queue an entry key belongs to (its prefix,
// "<root>lock/<escaped name>/", a part of key), or "" for any other key;
// esc is the name as escaped in the key; marker reports the key of an
// election's resignation marker instead.
func (s *state) queueOf(key string) (prefix string, k Kind, esc string, marker bool) {
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
		prefix = key[:len(r.root)+len(esc)+1]
		switch {
		case r.kind == Lock && strings.HasPrefix(sub, "q/"):
			return prefix, r.kind, esc, false
		case r.kind == Election && strings.HasPrefix(sub, "lead/"):
			// An election's entries are its seats: who leads, not who
			// waits (package election).
			return prefix, r.kind, esc, false
		case r.kind == Election && sub == "resigned":
			return prefix, r.kind, esc, true
		}
		return "", "", "", false
	}
	return "", "", "", false
}

// revocationOf returns, for a revocation mark (mark) or a record of how
// one ended (!mark) of a lock or election, its queue prefix and the
// mark's token; ok false for any other key.
func (s *state) revocationOf(key string) (prefix string, token int64, mark, ok bool) {
	for _, root := range []string{s.lockRoot, s.electionRoot} {
		rest, found := strings.CutPrefix(key, root)
		if !found {
			continue
		}
		esc, sub, found := strings.Cut(rest, "/")
		if !found {
			return "", 0, false, false
		}
		prefix = key[:len(root)+len(esc)+1]
		if sub == "revoked" {
			return prefix, 0, false, true
		}
		if t, found := strings.CutPrefix(sub, "revoke/"); found {
			token, err := strconv.ParseInt(t, 10, 64)
			return prefix, token, true, err == nil
		}
		return "", 0, false, false
	}
	return "", 0, false, false
}

// putRevocation applies a put of a revocation mark or outcome record.
func (s *state) putRevocation(prefix string, token int64, mark bool, kv *mvccpb.KeyValue) {
	q := s.queues[prefix]
	if q == nil {
		return // written for holders, whose queue is known
	}
	if !mark {
		if rec, ok := revoke.DecodeEnded(kv.Value); ok && s.revoked != nil {
			s.revoked[q] = rec
		}
		return
	}
	if q.revoking == nil {
		q.revoking = map[int64]time.Time{}
	}
	if _, ok := q.revoking[token]; !ok {
		q.revoking[token] = s.now
	}
}

// put applies a put of kv. touched collects the queues it changes,
// resigned the terms whose resignation markers it writes.
func (s *state) put(kv *mvccpb.KeyValue, touched map[string]bool, resigned map[string]int64) {
	key := string(kv.Key)
	if prefix, token, mark, ok := s.revocationOf(key); ok {
		s.putRevocation(prefix, token, mark, kv)
		return
	}
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
	prefix, k, esc, marker := s.queueOf(key)
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
		name := names.Unescape(esc)
		q = &queueState{kind: k, name: name, named: s.keys.named(k, name), byKey: map[string]*list.Element{}, held: map[string]holder{}}
		s.queues[prefix] = q
	}
	if touched != nil {
		touched[prefix] = true
	}
	en := &entry{kv: kv, v: decodeEntry(kv.Value)}
	if e := q.byKey[key]; e != nil {
		e.Value = en // a new value for the same entry
		return
	}
	q.byKey[key] = q.entries.PushBack(en) // new entries are the youngest
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
	if e := q.byKey[key]; e != nil {
		q.entries.Remove(e)
		delete(q.byKey, key)
		touched[prefix] = true
	}
}

// holders returns the entries at the head that hold the lock or lead. It
// looks at twice as many entries as hold it at most (a lock's holders are
// the first of its entries, and lock.HeldOf tells how many of a prefix).
// An election's entries are its seats, which all lead (one at most).
func (q *queueState) holders() []*entry {
	if q.kind == Election {
		return q.first(q.entries.Len())
	}
	for n := 2; ; n *= 2 {
		head := q.first(n)
		if len(head) == 0 {
			return nil
		}
		h := lock.HeldOf(len(head), head[0].v.Limit, func(i int) bool { return head[i].v.Read })
		if h < len(head) || len(head) < n {
			return head[:h]
		}
	}
}

// apply applies the events of revision rev, seen at now, and returns the
// history events they make (valid until the next call), numbered from 0
// in a fixed order (queues by key, ends before grants, ends by token), so
// that deriving a revision again from the same state gives the same
// events.
func (s *state) apply(rev int64, evs []*clientv3.Event, now time.Time) []Event {
	touched, closed, resigned := s.touched, s.closed, s.resigned
	clear(touched)
	clear(closed)
	clear(resigned)
	if s.revoked == nil {
		s.revoked = map[*queueState]revoke.Ended{}
	}
	clear(s.revoked)
	s.now = now
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			s.del(string(ev.Kv.Key), touched, closed)
		} else {
			s.put(ev.Kv, touched, resigned)
		}
	}
	out := s.out[:0]
	for _, prefix := range slices.Sorted(maps.Keys(touched)) {
		q := s.queues[prefix]
		out = s.step(out, q, rev, now, closed, resigned[prefix])
		if q.entries.Len() == 0 && len(q.held) == 0 {
			s.emptied++
		}
	}
	if s.emptied >= max(4096, len(s.queues)) {
		for prefix, q := range s.queues {
			if q.entries.Len() == 0 && len(q.held) == 0 {
				delete(s.queues, prefix)
			}
		}
		s.emptied = 0
	}
	for id := range closed {
		delete(s.sessions, id)
	}
	for i := range out {
		out[i].seq = i
	}
	s.out = out
	return out
}

// step appends one queue's events at rev to out: the ends of holders
// whose entries are gone, then the grants to entries that came to hold
// it.
func (s *state) step(out []Event, q *queueState, rev int64, now time.Time, closed map[session.ID]bool, resignedTerm int64) []Event {
	first := len(out)
	var ended []string
	for key := range q.held {
		if q.byKey[key] == nil {
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
		s.revocation(&e, q, now)
		out = append(out, e)
	}
	for _, en := range q.holders() {
		kv, v := en.kv, en.v
		key := string(kv.Key)
		if _, ok := q.held[key]; ok {
			continue
		}
		e := s.event(q, kv.Lease, rev, now)
		e.Type, e.Token, e.RequestID, e.Read = Granted, kv.CreateRevision, v.RequestID, v.Read
		if q.kind == Election {
			e.Type = Elected
		}
		// A seat given after a wait names the campaign's start.
		if (kv.CreateRevision != rev || q.kind == Election) && !v.Enqueued.IsZero() {
			e.Waited = max(now.Sub(v.Enqueued), 0)
		}
		if len(ended) > 0 {
			e.HandedFrom = out[first].Token
		}
		q.held[key] = holder{token: kv.CreateRevision, lease: kv.Lease, since: now}
		out = append(out, e)
	}
	return out
}

// revocation completes e, the end of a grant of q, if a revocation ended
// it: how (the holder let go when asked, the bound passed, or it was
// forced) and how long it waited for the holder.
func (s *state) revocation(e *Event, q *queueState, now time.Time) {
	asked, wasAsked := q.revoking[e.Token]
	delete(q.revoking, e.Token)
	rec, recorded := s.revoked[q]
	if recorded && rec.Token != e.Token {
		recorded = false
	}
	switch {
	case recorded:
		e.Revocation = rec.Outcome
	case wasAsked:
		e.Revocation = revoke.Acknowledged
	default:
		return
	}
	if wasAsked {
		e.RevokeWaited = max(now.Sub(asked), 0)
	}
	what := "released"
	if q.kind == Election {
		what = "resigned"
	}
	switch e.Revocation {
	case revoke.Acknowledged:
		e.Reason = what + " from outside: the holder let go when asked"
	case revoke.Bound:
		e.Reason = what + " from outside: the holder did not let go within the bound"
	case revoke.Forced:
		e.Reason = what + " from outside, forced: the holder was not asked"
	}
}

// event starts an event of q for the session of lease.
func (s *state) event(q *queueState, lease, rev int64, now time.Time) Event {
	rec := s.sessions[session.ID(lease)]
	return Event{Kind: q.kind, Name: q.name, Session: session.ID(lease).String(), Owner: rec.Owner,
		Principal: rec.Principal, Hostname: rec.Hostname, Revision: rev, Time: now, named: q.named}
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
