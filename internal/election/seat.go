package election

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/session"
)

// The seat is the leadership record: lead/<session>/<request id>, bound to
// the leader's session, at most one per election. Its create revision is
// the term. Every write that creates a seat checks, in its transaction,
// that no seat exists, and goes through the group committer as a creating
// transaction (one per election and batch), so two seats never coexist.

// seat is the JSON stored in a seat key: the leader's proclaimed state.
type seat struct {
	RequestID string `json:"request_id"`
	Value     string `json:"value"`
	Priority  int32  `json:"priority,omitempty"`
	Proclaims int64  `json:"proclaims,omitempty"`
	// ProclaimID is the id the last proclamation was made with, if any:
	// a repeat of it changes nothing (Manager.Proclaim).
	ProclaimID string    `json:"proclaim_id,omitempty"`
	Since      time.Time `json:"since"`
	// Enqueued is when the campaign began, for a seat given after a wait.
	Enqueued time.Time `json:"enqueued,omitzero"`
}

// preemption is the JSON stored in an election's preempt key: a waiting
// candidate's request that the leader of Term step down.
type preemption struct {
	Term      int64  `json:"term"`
	Session   string `json:"session"` // hex, as session.ID.String
	RequestID string `json:"request_id"`
	Priority  int32  `json:"priority"`
}

// entry is a candidate key, as a keys-only read shows it.
type entry struct {
	key       string
	session   session.ID
	requestID string
	priority  int32
	created   int64
	mod       int64
	lease     int64 // the session's lease: keys-only reads do not return it
}

// parseEntry reads a candidate key under the queue prefix q:
// q/<session>/<request id>/<priority>.
func parseEntry(q string, kv *mvccpb.KeyValue) (entry, bool) {
	rest, ok := strings.CutPrefix(string(kv.Key), q)
	if !ok {
		return entry{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return entry{}, false
	}
	sess, err := strconv.ParseUint(parts[0], 16, 64)
	if err != nil {
		return entry{}, false
	}
	prio, err := strconv.ParseInt(parts[2], 10, 32)
	if err != nil {
		return entry{}, false
	}
	return entry{key: string(kv.Key), session: session.ID(sess), requestID: parts[1], priority: int32(prio),
		created: kv.CreateRevision, mod: kv.ModRevision, lease: int64(sess)}, true
}

// before orders candidates for the seat: higher priority first, then
// arrival (create revision), then key.
func before(a, b entry) int {
	if c := cmp.Compare(b.priority, a.priority); c != 0 {
		return c
	}
	if c := cmp.Compare(a.created, b.created); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// seatOf names the campaign a seat key belongs to.
func seatOf(seats string, key []byte) (session.ID, string, bool) {
	rest, ok := strings.CutPrefix(string(key), seats)
	if !ok {
		return 0, "", false
	}
	s, id, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, "", false
	}
	sess, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, "", false
	}
	return session.ID(sess), id, true
}

// leaderFromSeat decodes a seat key into the leader it names.
func leaderFromSeat(seats string, kv *mvccpb.KeyValue) (Leader, error) {
	sess, _, ok := seatOf(seats, kv.Key)
	if !ok {
		return Leader{}, fmt.Errorf("election: malformed seat key %q", kv.Key)
	}
	var st seat
	if err := json.Unmarshal(kv.Value, &st); err != nil {
		return Leader{}, fmt.Errorf("election: decode %q: %w", kv.Key, err)
	}
	return Leader{Term: fencing.Token(kv.CreateRevision), Value: st.Value, Priority: st.Priority, Session: sess,
		RequestID: st.RequestID, Since: st.Since, Proclaims: st.Proclaims}, nil
}

// seatsOp reads an election's seat (the one with the lowest create
// revision, should a bug ever leave two).
func (m *Manager) seatsOp(name string) clientv3.Op {
	return clientv3.OpGet(m.seats(name), clientv3.WithPrefix(), clientv3.WithLimit(1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// candidatesOp reads an election's candidate keys, without their values.
func (m *Manager) candidatesOp(name string) clientv3.Op {
	return clientv3.OpGet(m.queue(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
}

// next picks the candidate that takes the seat from kvs (a keys-only read
// of the queue), leaving out the campaign whose key starts with skip.
func (m *Manager) next(name string, kvs []*mvccpb.KeyValue, skip string) (entry, bool) {
	q := m.queue(name)
	var best entry
	found := false
	for _, kv := range kvs {
		e, ok := parseEntry(q, kv)
		if !ok || (skip != "" && strings.HasPrefix(e.key, skip)) {
			continue
		}
		if !found || before(e, best) < 0 {
			best, found = e, true
		}
	}
	return best, found
}

// seatFor returns the compares and operations that give e the seat, as
// read at revision readAt: e is still there and no candidate joined since
// (one might outrank it). The caller adds that the seat is free (or that
// it holds it, for a hand-over). The seat carries e's value: taken from
// known (entries read with their values at readAt) if e is among them,
// else read.
func (m *Manager) seatFor(ctx context.Context, name string, e entry, readAt int64, known []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
	var value []byte
	for _, kv := range known {
		if string(kv.Key) == e.key && kv.ModRevision == e.mod {
			value = kv.Value
		}
	}
	if value == nil {
		resp, err := m.cli.Get(ctx, e.key, clientv3.WithRev(readAt))
		if err != nil {
			return nil, nil, fmt.Errorf("election: read %q: %w", name, err)
		}
		if len(resp.Kvs) == 1 {
			value = resp.Kvs[0].Value
		}
	}
	var c candidate
	_ = json.Unmarshal(value, &c)
	val, err := json.Marshal(seat{RequestID: e.requestID, Value: c.Value, Priority: e.priority, Since: m.now().UTC(), Enqueued: c.Enqueued})
	if err != nil {
		return nil, nil, err
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(e.key), "=", e.mod),
		clientv3.Compare(clientv3.CreateRevision(m.queue(name)), "<", readAt+1).WithPrefix(),
	}
	ops := []clientv3.Op{
		clientv3.OpPut(m.seatKey(name, e.session, e.requestID), string(val), clientv3.WithLease(clientv3.LeaseID(e.lease))),
		clientv3.OpDelete(m.preemptKey(name)),
	}
	return cmps, ops, nil
}

// promoteAttempts bounds one promotion's retries: a candidate that joined
// between the read and the commit makes it read again.
const promoteAttempts = 5

// promote gives a free seat to the first candidate in line. Every member
// with a waiting candidate does this when it sees the seat freed by an
// end that chose no successor (a session's end, a campaign abandoned);
// the seat's compare lets one of them win. It does nothing if the seat is
// taken or nobody waits.
func (m *Manager) promote(ctx context.Context, name string) error {
	for range promoteAttempts {
		resp, err := m.cli.Txn(ctx).Then(m.seatsOp(name), m.candidatesOp(name)).Commit()
		if err != nil {
			return fmt.Errorf("election: promote in %q: %w", name, err)
		}
		skip := ""
		if kv := first(resp.Responses[0].GetResponseRange().Kvs); kv != nil {
			if !m.unguarded.Load() {
				return nil
			}
			sess, rid, _ := seatOf(m.seats(name), kv.Key)
			skip = m.campaignPrefix(name, sess, rid)
		}
		e, ok := m.next(name, resp.Responses[1].GetResponseRange().Kvs, skip)
		if !ok {
			return nil
		}
		cmps, ops, err := m.seatFor(ctx, name, e, resp.Header.Revision, nil)
		if err != nil {
			return err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(m.seats(name)), "=", 0).WithPrefix())
		if m.unguarded.Load() {
			cmps = cmps[:1]
		}
		tr, err := m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), Creates: true, If: cmps, Then: ops})
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			continue // its session ended meanwhile: pick again
		}
		if err != nil {
			return fmt.Errorf("election: promote in %q: %w", name, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
	return nil // someone else's write keeps changing the line; its waiter promotes
}

// promoter runs promotions in the background, at most one per election at
// a time on this member; a request while one runs makes it run again once
// it ends, so a seat freed during a promotion's read is not left free.
type promoter struct {
	mu      sync.Mutex
	running map[string]bool // election -> another run was asked for
}

// kick promotes in name's election soon (see promote).
func (m *Manager) kick(name string) {
	p := &m.promoting
	p.mu.Lock()
	if again, ok := p.running[name]; ok {
		if !again {
			p.running[name] = true
		}
		p.mu.Unlock()
		return
	}
	if p.running == nil {
		p.running = map[string]bool{}
	}
	p.running[name] = false
	p.mu.Unlock()
	m.bg.Go(func(stop context.Context) {
		for {
			// A failed promotion (etcd unavailable, NOSPACE) is tried
			// again until it succeeds or finds nothing to do: nothing else
			// may change in the election to set a waiter off again.
			for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
				ctx, cancel := context.WithTimeout(stop, 5*time.Second)
				err := m.promote(ctx, name)
				cancel()
				if err == nil || stop.Err() != nil {
					break
				}
				select {
				case <-stop.Done():
				case <-time.After(backoff):
				}
			}
			p.mu.Lock()
			if !p.running[name] || stop.Err() != nil {
				delete(p.running, name)
				p.mu.Unlock()
				return
			}
			p.running[name] = false
			p.mu.Unlock()
		}
	})
}

// Transfer hands term's leadership to a waiting candidate of session to
// (its campaign requestID, or, if requestID is empty, its first in line:
// priority, then arrival) in one
// commit: the leader's campaign ends as with Resign, the successor leads
// from the same revision with a new term, which Transfer returns with the
// revision. Observers see RESIGNED and ELECTED at that revision, never a
// vacant seat. It fails with ErrNotLeader unless term leads, and with
// ErrNotCandidate unless the successor waits in this election.
func (m *Manager) Transfer(ctx context.Context, name string, term fencing.Token, to session.ID, requestID string) (fencing.Token, int64, error) {
	if err := validateTerm(name, term); err != nil {
		return 0, 0, err
	}
	if to <= 0 {
		return 0, 0, fmt.Errorf("%w: the successor's session is required", ErrInvalid)
	}
	succ := fmt.Sprintf("%s%016x/", m.queue(name), uint64(to))
	if requestID != "" {
		if err := checkRequestID(requestID); err != nil {
			return 0, 0, err
		}
		succ += requestID + "/"
	}
	for {
		resp, err := m.cli.Txn(ctx).Then(m.seatsOp(name), clientv3.OpGet(succ, clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
		if err != nil {
			return 0, 0, fmt.Errorf("election: transfer %q: %w", name, err)
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != int64(term) {
			return 0, 0, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
		}
		sess, rid, _ := seatOf(m.seats(name), kvs[0].Key)
		own := m.campaignPrefix(name, sess, rid)
		e, ok := m.next(name, resp.Responses[1].GetResponseRange().Kvs, own)
		if !ok {
			return 0, 0, fmt.Errorf("%w: session %s has no campaign waiting in %q", ErrNotCandidate, to, name)
		}
		cmps, ops, err := m.seatFor(ctx, name, e, resp.Header.Revision, nil)
		if err != nil {
			return 0, 0, err
		}
		// Only e must still be there: the leader chose it, whoever joined.
		cmps = append(cmps[:1], clientv3.Compare(clientv3.CreateRevision(string(kvs[0].Key)), "=", int64(term)))
		// The old seat's end first: a watcher sees the seat freed and
		// taken in that order within the revision, and ends "taken".
		ops = append(m.endOps(name, string(kvs[0].Key), own, term, kvs[0].Lease), ops...)
		if m.splitTransfer {
			cmps, ops = m.splitHandOver(ctx, cmps, ops)
		}
		tr, err := m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), Creates: true, If: cmps, Then: ops})
		if err != nil {
			return 0, 0, fmt.Errorf("election: transfer %q: %w", name, err)
		}
		if tr.Succeeded {
			m.ids.Released(own)
			return fencing.Token(tr.Header.Revision), tr.Header.Revision, nil
		}
		// The successor's entry changed (a take-over, its end) or the
		// term ended: read again.
	}
}

// splitHandOver (tests only) commits a hand-over's end of the old term
// alone and returns what is left, the new seat's: a broken Transfer
// with a vacancy between two commits.
func (m *Manager) splitHandOver(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) ([]clientv3.Cmp, []clientv3.Op) {
	_, _ = m.cli.Txn(ctx).If(cmps[1:]...).Then(ops[:3]...).Commit()
	return cmps[:1], ops[3:]
}

// endOps end the leadership of seatKey (term, bound to lease) and the
// campaign under own: the resignation marker tells observers it was not
// an expiry.
// A revocation mark of the term (a resignation from outside asked the
// leader to step down) goes with it.
func (m *Manager) endOps(name, seatKey, own string, term fencing.Token, lease int64) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpDelete(seatKey),
		clientv3.OpDelete(own, clientv3.WithPrefix()),
		clientv3.OpPut(m.resignedKey(name), strconv.FormatInt(int64(term), 10), clientv3.WithLease(clientv3.LeaseID(lease))),
		clientv3.OpDelete(m.markKey(name, term)),
	}
}

// endOpsLen is how many operations endOps returns.
const endOpsLen = 4

// askToStepDown records candidate e's request that the leader (its seat
// kv) step down, when e outranks it and no request at least as high is
// recorded for this term, and returns what it wrote ("" if nothing). The
// leader learns of it through Observe (PREEMPT_REQUESTED) and decides
// when to step down; nothing forces it. A request ends with the term (a
// new seat deletes it), the asker's session, or the asker's campaign
// (withdraw).
func (m *Manager) askToStepDown(ctx context.Context, name string, e entry, kv *mvccpb.KeyValue) (string, error) {
	var st seat
	if err := json.Unmarshal(kv.Value, &st); err != nil || e.priority <= st.Priority {
		return "", nil
	}
	resp, err := m.cli.Get(ctx, m.preemptKey(name))
	if err != nil {
		return "", err
	}
	var mod int64
	if len(resp.Kvs) == 1 {
		var p preemption
		if json.Unmarshal(resp.Kvs[0].Value, &p) == nil && p.Term == kv.CreateRevision && p.Priority >= e.priority {
			return "", nil
		}
		mod = resp.Kvs[0].ModRevision
	}
	val, err := json.Marshal(preemption{Term: kv.CreateRevision, Session: e.session.String(), RequestID: e.requestID, Priority: e.priority})
	if err != nil {
		return "", err
	}
	tr, err := m.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision),
		clientv3.Compare(clientv3.ModRevision(m.preemptKey(name)), "=", mod),
	).Then(clientv3.OpPut(m.preemptKey(name), string(val), clientv3.WithLease(clientv3.LeaseID(e.lease)))).Commit()
	if err != nil || !tr.Succeeded {
		return "", err
	}
	return string(val), nil
}

// withdraw is the operation that removes the preemption request asked,
// if it is still the one recorded ("": none).
func (m *Manager) withdraw(name, asked string) []clientv3.Op {
	if asked == "" {
		return nil
	}
	k := m.preemptKey(name)
	return []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", asked)}, []clientv3.Op{clientv3.OpDelete(k)}, nil)}
}
