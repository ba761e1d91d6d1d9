package session

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Clock keeps coordd's session time, so that a session ends one TTL after
// its last renewal whatever etcd's leadership does. See docs/sessions.md
// for why etcd's lease expiry cannot give that, and what this costs.
//
// How: a renewal is a write. The renewals a member receives are merged
// into one put of a single key (<root>session-clock), one put per round
// trip, and answered once the member has seen that put in its own watch.
// Every member watches that key and the session records, and notes, on its
// own monotonic clock, when it saw each session's last renewal (or its
// record's creation). A member ends a session that it has not seen renewed
// for its TTL with one transaction that compares the clock key's revision
// with the last one it saw: if anyone renewed anything since, the
// transaction fails and the member looks again. The transaction marks the
// record ended; the member then revokes the session's etcd lease, which
// deletes its keys (lock holders, waiters, candidacies) at once. The etcd
// lease is a backstop: its TTL is BackstopTTL and members renew it
// every third of that, so etcd ends a session on its own only when no
// member runs.
//
// Guarantees:
//   - A session is ended only by a member that saw no renewal of it for its
//     TTL, and only if no renewal was committed after what that member saw.
//     A member that was paused (SIGSTOP, a long GC, a stalled disk) and
//     resumes cannot end a session renewed meanwhile: its transaction's
//     compare fails.
//   - A renewal is answered only after it is committed and this member has
//     seen it; it is answered "not found" if the member saw the session end
//     first. So a client's deadline (its send time + TTL) is never later
//     than the earliest time any member may end the session, as long as
//     the hosts' monotonic clocks run at about the same rate.
//   - A session nobody renews ends within its TTL plus one transaction,
//     plus Stagger if the member that last renewed it is gone, plus the
//     time until etcd has a leader: etcd's leader changes do not extend it.
//
// Non-guarantees:
//   - A member that starts (or whose watch fell behind etcd's compaction)
//     counts every session as renewed at that moment: sessions may then
//     outlive their TTL by up to one TTL.
//   - With no coordd member running, sessions end only with their etcd
//     lease, BackstopTTL after their last renewal.
type Clock struct {
	cli     *clientv3.Client
	key     string // <root>session-clock: the renewals
	records string // <root>session/
	member  string // this member's name in the renewals it writes
	lg      *zap.Logger
	renew   Renewer // the backstop lease's renewals

	// Ended, if set, is told how many sessions this member ended for want
	// of renewals, each time it ends some (for a metric). Set it before
	// Run.
	Ended func(n int)

	// Stagger is how long a member waits past a session's deadline before
	// it ends a session that another member renewed last (that member
	// ends it first; this one only if that one is gone).
	Stagger time.Duration

	mu       sync.Mutex
	entries  map[ID]*entry
	view     int64         // the revision this member has seen up to
	advanced chan struct{} // closed and replaced when view advances
	due      dueHeap
	wake     chan struct{} // the ender's: the earliest deadline moved
	// backstop are sessions whose etcd lease is due for renewal, for
	// renewLeases (woken by backstopKick).
	backstop     []ID
	backstopKick chan struct{}
	stopped      chan struct{} // closed when Run returns

	fmu     sync.Mutex
	pending []ID
	batch   *flushBatch   // what the next put carries
	kick    chan struct{} // the flusher's: pending is not empty

	backstopExtra time.Duration // BackstopTTL's minute

	// hooks for tests
	beforeApply func() // runs before each watch response is applied
	noFence     bool   // end without the compare (a test shows it matters)
}

// entry is one live session as this member sees it.
type entry struct {
	id      ID
	ttl     time.Duration
	renewed time.Time // when this member saw its last renewal (monotonic)
	home    string    // the member that renewed it last ("" unknown)
	recRev  int64     // its record's mod revision
	ended   bool      // its record is marked ended; the lease revoke is due
	revoke  time.Time // ended: when this member revokes the lease (again) if still there

	etcdNext time.Time // when this member renews the backstop lease next

	at     time.Time // its place in due
	queued bool
	index  int
}

// flushBatch is one put of renewals: done is closed once it is committed
// (rev) or failed (err).
type flushBatch struct {
	done chan struct{}
	rev  int64
	err  error
}

// BackstopTTL is the TTL of a session's etcd lease: its own TTL and a
// minute. A paused etcd leader revokes, when it resumes, the leases that
// expired on its clock (etcd issue 15247); members renew the lease every
// third of this, so a pause shorter than two thirds of it (40 s and more)
// cannot end a session.
func (c *Clock) BackstopTTL(ttl time.Duration) time.Duration { return ttl + c.backstopExtra }

// maxFlush bounds the ids one put carries (17 bytes each: 280 KiB).
const maxFlush = 16384

// NewClock returns a clock for the sessions under root+"session/". member
// names this member in the renewals it writes; renew renews a session's
// etcd lease (nil: a keep-alive of cli). Run it before use.
func NewClock(cli *clientv3.Client, root, member string, renew Renewer, lg *zap.Logger) *Clock {
	if renew == nil {
		renew = keepAliveOnce(cli)
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	return &Clock{
		cli: cli, key: root + "session-clock", records: root + "session/", member: member, lg: lg, renew: renew,
		Stagger: 500 * time.Millisecond, backstopExtra: time.Minute, entries: map[ID]*entry{}, advanced: make(chan struct{}),
		wake: make(chan struct{}, 1), backstopKick: make(chan struct{}, 1), stopped: make(chan struct{}), kick: make(chan struct{}, 1),
		batch: &flushBatch{done: make(chan struct{})},
	}
}

// Run follows the sessions, writes renewals and ends overdue sessions
// until ctx ends. Renewals fail with Unavailable after it returns.
func (c *Clock) Run(ctx context.Context) {
	defer close(c.stopped)
	var wg sync.WaitGroup
	wg.Go(func() { c.follow(ctx) })
	wg.Go(func() { c.flush(ctx) })
	wg.Go(func() { c.end(ctx) })
	wg.Go(func() { c.renewLeases(ctx) })
	wg.Wait()
}

var errStopped = errkind.Unavailable.New("session clock: this member is stopping")

// Renew renews the sessions ids and returns, for each, its TTL or an error
// (one wrapping ErrNotFound for a session that has ended). err is set
// instead when nothing could be renewed (etcd unavailable, ctx ended).
func (c *Clock) Renew(ctx context.Context, ids []ID) (ttls []time.Duration, errs []error, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	rev, err := c.commit(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	if err := c.waitView(ctx, rev); err != nil {
		return nil, nil, err
	}
	ttls, errs = make([]time.Duration, len(ids)), make([]error, len(ids))
	now := time.Now()
	c.mu.Lock()
	for i, id := range ids {
		e := c.entries[id]
		if e == nil || e.ended {
			errs[i] = fmt.Errorf("%w: %s", ErrNotFound, id)
			continue
		}
		ttls[i] = e.ttl
		if !now.Before(e.etcdNext) {
			e.etcdNext = now.Add(time.Minute) // set again once renewed
			c.backstop = append(c.backstop, id)
		}
	}
	kick := len(c.backstop) > 0
	c.mu.Unlock()
	if kick {
		select {
		case c.backstopKick <- struct{}{}:
		default:
		}
	}
	return ttls, errs, nil
}

// backstopRenewers is how many etcd lease renewals renewLeases runs at
// once (one forwarded to the etcd leader takes a round trip).
const backstopRenewers = 16

// renewLeases renews the etcd leases of the sessions queued in backstop
// until ctx ends, off the renewals' path: a lease has a minute to spare.
func (c *Clock) renewLeases(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.backstopKick:
		}
		c.mu.Lock()
		ids := c.backstop
		c.backstop = nil
		c.mu.Unlock()
		each(ids, backstopRenewers, func(id ID) { c.renewLease(ctx, id) })
	}
}

// renewLease renews the etcd lease of session id and notes when it is due
// again.
func (c *Clock) renewLease(ctx context.Context, id ID) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	granted, err := c.renew(rctx, clientv3.LeaseID(id))
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[id]
	if e == nil {
		return
	}
	switch {
	case err == nil:
		e.etcdNext = time.Now().Add(time.Duration(granted) * time.Second / 3)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// Its record goes with it: the watch removes the entry.
	default:
		e.etcdNext = time.Time{} // at its next renewal
		if ctx.Err() == nil {
			c.lg.Warn("session clock: renewing a session's etcd lease failed; retried at its next renewal", zap.Stringer("session", id), zap.Error(err))
		}
	}
}

// Remaining returns how long this member will wait before it ends session
// id, and false if it does not know the session (not yet seen, or ended).
func (c *Clock) Remaining(id ID) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[id]
	if e == nil || e.ended {
		return 0, false
	}
	return max(time.Until(e.renewed.Add(e.ttl)), 0), true
}

// commit queues ids for the next put and waits until it is committed.
func (c *Clock) commit(ctx context.Context, ids []ID) (int64, error) {
	c.fmu.Lock()
	c.pending = append(c.pending, ids...)
	b := c.batch
	c.fmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	select {
	case <-b.done:
		return b.rev, b.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-c.stopped:
		return 0, errStopped
	}
}

// flush writes the pending renewals, one put per round trip, until ctx
// ends. A batch larger than maxFlush ids goes as several puts; its callers
// get the last one's revision.
func (c *Clock) flush(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			c.fmu.Lock()
			b := c.batch
			c.pending, c.batch = nil, &flushBatch{done: make(chan struct{})}
			c.fmu.Unlock()
			b.err = errStopped
			close(b.done)
			return
		case <-c.kick:
		}
		for {
			c.fmu.Lock()
			ids, b, whole := c.pending, c.batch, true
			if len(ids) > maxFlush {
				ids, c.pending, whole = ids[:maxFlush], ids[maxFlush:], false
			} else {
				c.pending = nil
			}
			if whole && len(ids) > 0 {
				c.batch = &flushBatch{done: make(chan struct{})}
			}
			c.fmu.Unlock()
			if len(ids) == 0 {
				break
			}
			// A session renewed by several calls at once goes once: a put
			// carries at most each live session, however often it is renewed.
			slices.Sort(ids)
			ids = slices.Compact(ids)
			resp, err := c.cli.Put(ctx, c.key, encodeRenewals(c.member, ids))
			if err != nil {
				if !whole { // the rest of this batch fails with it
					c.fmu.Lock()
					c.pending, c.batch = nil, &flushBatch{done: make(chan struct{})}
					c.fmu.Unlock()
				}
				b.err = fmt.Errorf("session: write renewals: %w", err)
				if ctx.Err() != nil {
					b.err = errStopped
				}
				close(b.done)
				continue
			}
			b.rev = resp.Header.Revision
			if whole {
				close(b.done)
			}
		}
	}
}

// encodeRenewals writes "member id,id,...": ids in hexadecimal.
func encodeRenewals(member string, ids []ID) string {
	var sb strings.Builder
	sb.Grow(len(member) + 1 + 17*len(ids))
	sb.WriteString(member)
	sb.WriteByte(' ')
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatUint(uint64(id), 16))
	}
	return sb.String()
}

func decodeRenewals(v []byte) (member string, ids []ID) {
	member, list, ok := strings.Cut(string(v), " ")
	if !ok {
		return "", nil
	}
	for part := range strings.SplitSeq(list, ",") {
		if n, err := strconv.ParseUint(part, 16, 64); err == nil {
			ids = append(ids, ID(n))
		}
	}
	return member, ids
}

// waitView waits until this member has seen revision rev.
func (c *Clock) waitView(ctx context.Context, rev int64) error {
	for {
		c.mu.Lock()
		view, advanced := c.view, c.advanced
		c.mu.Unlock()
		if view >= rev {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stopped:
			return errStopped
		}
	}
}

// follow keeps entries and view current until ctx ends: a read of every
// record, then a watch from there; again after any watch failure.
func (c *Clock) follow(ctx context.Context) {
	for ctx.Err() == nil {
		rev, err := c.load(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.lg.Warn("session clock: reading the sessions failed; retrying", zap.Error(err))
				select {
				case <-time.After(200 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := c.cli.Watch(wctx, c.key, clientv3.WithRange(clientv3.GetPrefixRangeEnd(c.records)), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil {
					c.lg.Info("session clock: watch ended; reading the sessions again", zap.Error(err))
				}
				break
			}
			if c.beforeApply != nil {
				c.beforeApply()
			}
			c.apply(resp.Events)
		}
		cancel()
	}
}

// load reads every session record and counts each as renewed now: what
// happened before is unknown to this member.
func (c *Clock) load(ctx context.Context) (int64, error) {
	resp, err := c.cli.Get(ctx, c.records, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[ID]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		id, rec, ok := c.parseRecord(kv)
		if !ok {
			continue
		}
		seen[id] = true
		e := c.entries[id]
		if e != nil {
			e.renewed, e.home = now, "" // what happened before is unknown
		}
		c.noteRecord(id, rec, kv.ModRevision, now)
	}
	for id := range c.entries {
		if !seen[id] {
			delete(c.entries, id)
		}
	}
	c.advance(resp.Header.Revision)
	return resp.Header.Revision, nil
}

func (c *Clock) parseRecord(kv *mvccpb.KeyValue) (ID, record, bool) {
	id, err := ParseID(string(kv.Key[len(c.records):]))
	if err != nil {
		return 0, record{}, false
	}
	var r record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return 0, record{}, false
	}
	return id, r, true
}

// noteRecord notes session id's record (at revision rev), seen at now: a
// new session counts as renewed then. c.mu is held.
func (c *Clock) noteRecord(id ID, r record, rev int64, now time.Time) {
	e := c.entries[id]
	if e == nil {
		e = &entry{id: id, renewed: now}
		c.entries[id] = e
	}
	e.ttl, e.recRev = time.Duration(r.TTLSeconds)*time.Second, rev
	c.markEnded(e, r, now)
	c.schedule(e)
}

// markEnded notes a record marked ended.
func (c *Clock) markEnded(e *entry, r record, now time.Time) {
	if r.EndedBy == "" || e.ended {
		return
	}
	e.ended = true
	// Revoked at once by the member that ended it (again, if it
	// restarted before its revoke went through), a second later by the
	// others if still there.
	e.revoke = now
	if r.EndedBy != c.member {
		e.revoke = now.Add(time.Second)
	}
}

func (c *Clock) apply(events []*clientv3.Event) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var last int64
	for _, ev := range events {
		kv := ev.Kv
		last = kv.ModRevision
		key := string(kv.Key)
		switch {
		case key == c.key:
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			member, ids := decodeRenewals(kv.Value)
			for _, id := range ids {
				if e := c.entries[id]; e != nil && !e.ended {
					e.renewed, e.home = now, member
					c.schedule(e) // earlier, if it now waits no Stagger
				}
			}
		case strings.HasPrefix(key, c.records):
			if ev.Type == clientv3.EventTypeDelete {
				id, err := ParseID(key[len(c.records):])
				if err == nil {
					delete(c.entries, id)
				}
				continue
			}
			if id, rec, ok := c.parseRecord(kv); ok {
				c.noteRecord(id, rec, kv.ModRevision, now)
			}
		}
	}
	c.advance(last)
}

// advance moves view to rev and wakes its waiters; c.mu is held.
func (c *Clock) advance(rev int64) {
	if rev <= c.view {
		return
	}
	c.view = rev
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// deadline is when this member acts on e next; c.mu is held.
func (c *Clock) deadline(e *entry) time.Time {
	if e.ended {
		return e.revoke
	}
	at := e.renewed.Add(e.ttl)
	if e.home != "" && e.home != c.member {
		at = at.Add(c.Stagger)
	}
	return at
}

// schedule makes sure e is in due, no later than its deadline; c.mu is
// held.
func (c *Clock) schedule(e *entry) {
	at := c.deadline(e)
	if e.queued && !at.Before(e.at) {
		return
	}
	e.at = at
	if e.queued {
		heap.Fix(&c.due, e.index)
	} else {
		e.queued = true
		heap.Push(&c.due, e)
	}
	if c.due[0] == e {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// maxEnd bounds the sessions one ending transaction marks (etcd allows 128
// operations per transaction by default).
const maxEnd = 100

// end ends overdue sessions until ctx ends.
func (c *Clock) end(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		overdue, revoke, view, next := c.takeDue(time.Now())
		for len(overdue) > 0 {
			n := min(len(overdue), maxEnd)
			c.endSessions(ctx, overdue[:n], view)
			overdue = overdue[n:]
		}
		c.revokeLeases(ctx, revoke)
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

type overdueSession struct {
	id     ID
	ttl    time.Duration
	recRev int64
}

// takeDue pops what is due at now: sessions to end, and leases to revoke
// (sessions another member ended, whose lease is still there). next is
// the earliest deadline left.
func (c *Clock) takeDue(now time.Time) (overdue []overdueSession, revoke []ID, view int64, next time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.due) > 0 && !c.due[0].at.After(now) {
		e := heap.Pop(&c.due).(*entry)
		e.queued = false
		if c.entries[e.id] != e {
			continue // gone
		}
		if at := c.deadline(e); at.After(now) {
			c.schedule(e) // renewed since it was queued
			continue
		}
		if e.ended {
			revoke = append(revoke, e.id)
			e.revoke = now.Add(time.Second) // again, until its record goes
			c.schedule(e)
			continue
		}
		overdue = append(overdue, overdueSession{e.id, e.ttl, e.recRev})
		// Looked at again if the transaction fails.
		e.at = now.Add(100 * time.Millisecond)
		e.queued = true
		heap.Push(&c.due, e)
	}
	if len(c.due) > 0 {
		next = c.due[0].at
	}
	return overdue, revoke, c.view, next
}

// endSessions marks the records of overdue sessions ended, provided no
// renewal was committed after view and no record changed, then revokes
// their leases.
func (c *Clock) endSessions(ctx context.Context, overdue []overdueSession, view int64) {
	var cmps []clientv3.Cmp
	if !c.noFence {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.key), "<", view+1))
	}
	ops := make([]clientv3.Op, 0, len(overdue))
	for _, s := range overdue {
		key := c.records + s.id.String()
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", s.recRev))
		v, _ := json.Marshal(record{TTLSeconds: int64(s.ttl / time.Second), EndedBy: c.member})
		ops = append(ops, clientv3.OpPut(key, string(v), clientv3.WithIgnoreLease()))
	}
	// Bounded: without a quorum the member looks again later rather than
	// wait here.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := c.cli.Txn(tctx).If(cmps...).Then(ops...).Commit()
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.lg.Warn("session clock: ending overdue sessions failed; retrying", zap.Int("sessions", len(overdue)), zap.Error(err))
		}
		return
	}
	if !resp.Succeeded {
		return // a renewal or a record this member has not seen yet: looked at again
	}
	c.mu.Lock()
	for _, s := range overdue {
		if e := c.entries[s.id]; e != nil {
			e.ended, e.revoke = true, time.Now().Add(time.Second) // a retry, if the revoke below fails
		}
	}
	c.mu.Unlock()
	if c.Ended != nil {
		c.Ended(len(overdue))
	}
	ids := make([]ID, len(overdue))
	for i, s := range overdue {
		c.lg.Info("session ended: not renewed within its TTL", zap.Stringer("session", s.id), zap.Duration("ttl", s.ttl))
		ids[i] = s.id
	}
	c.revokeLeases(ctx, ids)
}

// revokers is how many lease revokes one member sends at once: many
// sessions ending together (a fleet of clients gone) are not revoked one
// round trip after another.
const revokers = 16

// revokeLeases revokes the leases ids, revokers at a time.
func (c *Clock) revokeLeases(ctx context.Context, ids []ID) {
	each(ids, revokers, func(id ID) { c.revokeLease(ctx, id) })
}

// each calls fn for every id, at most n at once, and returns when all
// have returned.
func each(ids []ID, n int, fn func(ID)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(id)
		})
	}
	wg.Wait()
}

func (c *Clock) revokeLease(ctx context.Context, id ID) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.cli.Revoke(rctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && ctx.Err() == nil {
		c.lg.Warn("session clock: revoking an ended session's lease failed; a member retries", zap.Stringer("session", id), zap.Error(err))
	}
}

// dueHeap orders entries by when they are due.
type dueHeap []*entry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
