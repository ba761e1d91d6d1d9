package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/queue"
)

// Acquire queues for the lock and blocks until it is granted, the waiter's
// session ends (ErrSessionNotFound), or ctx ends (ctx's error). Either way
// an unsuccessful Acquire removes its waiter entry (retrying in the
// background if etcd is unavailable; the session's end removes it at the
// latest).
func (m *Manager) Acquire(ctx context.Context, req Request) (Grant, error) {
	return m.acquire(ctx, req, true)
}

// TryAcquire takes the lock if it can be taken now, and returns ErrHeld
// otherwise, leaving nothing behind.
func (m *Manager) TryAcquire(ctx context.Context, req Request) (Grant, error) {
	return m.acquire(ctx, req, false)
}

// entry is one Acquire call's waiter entry.
type entry struct {
	key   string
	rev   int64  // create revision: the token
	owned int64  // the revision of this call's write of the entry (rev, or its take-over's)
	value string // the value this call wrote; dequeue compares it
	w     waiter
}

func (m *Manager) acquire(ctx context.Context, req Request, wait bool) (Grant, error) {
	g, _, err := m.acquireOr(ctx, req, wait, nil)
	return g, err
}

// Later is how an acquisition that must wait goes on without its caller's
// goroutine (see AcquireLater).
type Later struct {
	// Ctx governs the wait and what follows it (the call's deadline and
	// cancellation), in place of the context given to AcquireLater, which
	// governs the acquisition until it waits. It must end after Done.
	Ctx context.Context
	// Done is called once with the outcome, on a goroutine of its own.
	Done func(Grant, error)
}

// AcquireLater is Acquire for callers that answer without a goroutine of
// their own per waiting call (coordd's call stream): when the lock is
// granted at once, or the acquisition fails before it waits, it returns
// that outcome with later false, as Acquire would; otherwise it parks the
// wait in the member's queue view (queue.Waiters.Park), returns later
// true at once, and calls l.Done once with the outcome. A parked wait
// holds no goroutine: it costs its registration and l's contexts.
func (m *Manager) AcquireLater(ctx context.Context, req Request, l Later) (g Grant, later bool, err error) {
	return m.acquireOr(ctx, req, true, &l)
}

// acquireOr acquires (see Acquire and TryAcquire), parking the wait when
// l is set (see AcquireLater).
func (m *Manager) acquireOr(ctx context.Context, req Request, wait bool, l *Later) (Grant, bool, error) {
	a, holders, delay, err := m.start(ctx, req, wait)
	if err != nil {
		return Grant{}, false, err
	}
	g, holders, done, err := a.before(ctx, holders, delay, wait)
	if done || err != nil {
		return g, false, err
	}
	t := m.turn(req, a.e, holders)
	if l != nil {
		m.waits.Park(l.Ctx, t, func(rev int64, err error) {
			l.Done(recovered(req, func() (Grant, error) { return a.turned(l.Ctx, rev, t, err) }))
		})
		return Grant{}, true, nil
	}
	rev, err := m.waits.Wait(ctx, t)
	g, err = a.turned(ctx, rev, t, err)
	return g, false, err
}

// acquisition is one Acquire call whose entry is written: what its wait
// and its end need (one allocation per waiting call).
type acquisition struct {
	m      *Manager
	req    Request
	e      entry
	g      Grant
	picked bool // the member picked the request id
}

// start writes the call's entry (see enqueue) and returns it with the
// lock's holders and lock-delay state as the write saw them.
func (m *Manager) start(ctx context.Context, req Request, wait bool) (*acquisition, []*mvccpb.KeyValue, delayState, error) {
	picked := req.RequestID == "" && req.Session > 0 && validateName(req.Name) == nil
	var reused bool
	key := func(id string) string { return m.waiterKey(req.Name, req.Session, id) }
	if picked {
		req.RequestID, reused = m.ids.Take(int64(req.Session), req.Name, req.Read, false, key)
	}
	if err := validateRequest(&req); err != nil {
		return nil, nil, delayState{}, err
	}
	began := m.txns.Began(ctx)
	e, holders, delay, err := m.enqueue(ctx, req, began, !wait && req.Limit == 1 && !req.Read, reused)
	if errors.Is(err, errIDInUse) {
		// Another call of the session named the id meanwhile: never join
		// it; start anew under an id nobody has.
		req.RequestID, _ = m.ids.Take(int64(req.Session), req.Name, req.Read, true, key)
		e, holders, delay, err = m.enqueue(ctx, req, began, !wait && req.Limit == 1 && !req.Read, false)
	}
	if errors.Is(err, errNotEnqueued) {
		// Nothing was written: an id made up for this call may serve the next.
		m.ids.Released(m.waiterKey(req.Name, req.Session, req.RequestID))
		if lim, ok := limitOf(holders); ok && lim != req.Limit {
			return nil, nil, delayState{}, fmt.Errorf("%w: lock %q allows %d holders, the request says %d", ErrLimitMismatch, req.Name, lim, req.Limit)
		}
		return nil, nil, delayState{}, fmt.Errorf("%w: %q", ErrHeld, req.Name)
	}
	if err != nil {
		return nil, nil, delayState{}, err
	}
	g := Grant{Name: req.Name, Token: fencing.Token(e.rev), Key: e.key, Session: req.Session, RequestID: req.RequestID, Read: req.Read}
	return &acquisition{m: m, req: req, e: e, g: g, picked: picked}, holders, delay, nil
}

// before decides what an acquisition whose entry is written does before
// any wait: it is granted at once (done), refused (err), or waits behind
// the holders it returns (read again in checkNotWaitingForItself's case).
func (a *acquisition) before(ctx context.Context, holders []*mvccpb.KeyValue, delay delayState, wait bool) (Grant, []*mvccpb.KeyValue, bool, error) {
	m, req, e := a.m, a.req, a.e
	// The head's limit is the lock's; when the head is this entry, it is
	// the request's own (nothing to read: the common, uncontended case).
	if len(holders) > 0 && string(holders[0].Key) != e.key {
		if lim, ok := limitOf(holders); ok && lim != req.Limit {
			g, err := a.fail(ctx, fmt.Errorf("%w: lock %q allows %d holders, the request says %d", ErrLimitMismatch, req.Name, lim, req.Limit))
			return g, nil, true, err
		}
	}
	if slices.ContainsFunc(holders, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == e.key }) {
		// Granted at once, unless a holder that asked for a lock-delay
		// ended without a release (or a delay is still running).
		if !wait {
			if until := delay.until(m.now(), holders); until.After(m.now()) {
				g, err := a.fail(ctx, fmt.Errorf("%w: %q is in a lock-delay until %s", ErrHeld, req.Name, until.UTC().Format(time.RFC3339Nano)))
				return g, nil, true, err
			}
		}
		waited, err := m.settleDelay(ctx, req, e, delay, holders)
		if err != nil {
			g, err := a.fail(ctx, err)
			return g, nil, true, err
		}
		g := a.g
		g.Revision, g.DelayWaited = e.rev, waited
		return g, nil, true, nil
	}
	if !wait {
		g, err := a.fail(ctx, fmt.Errorf("%w: %q", ErrHeld, req.Name))
		return g, nil, true, err
	}
	if e.owned == e.rev {
		// A retry that took its entry over (e.owned is its take-over's
		// revision) waits where its first attempt did, which passed this
		// check when it queued.
		var err error
		if holders, err = m.checkNotWaitingForItself(ctx, req, e, holders); err != nil {
			g, err := a.fail(ctx, err)
			return g, nil, true, err
		}
	}
	return Grant{}, holders, false, nil
}

// fail ends an acquisition that will not be granted with err.
func (a *acquisition) fail(ctx context.Context, err error) (Grant, error) {
	// A wait its member gave up keeps its entry for the client's retry
	// (queue.Abandoned), if the client named the request: a retry
	// without a request id would queue anew.
	if a.picked || !queue.Abandoned(ctx) {
		a.m.dequeue(ctx, a.e)
	}
	return Grant{}, err
}

// turned ends the wait for a's turn, which came at rev unless err: it
// settles a lock-delay and notes the grant.
func (a *acquisition) turned(ctx context.Context, rev int64, t *queue.Turn, err error) (Grant, error) {
	m, req := a.m, a.req
	g := a.g
	err = turnErr(req, err)
	if err == nil && (req.LockDelay > 0 || slices.ContainsFunc(t.Gone, func(g queue.Gone) bool { return delayOf(g.KV.Value) > 0 })) {
		// Only locks that use lock-delay pay this read on hand-off.
		g.DelayWaited, err = m.settleDelayAfterWait(ctx, req, a.e)
	}
	if err != nil {
		return a.fail(ctx, err)
	}
	g.Revision = rev
	a.e.w.Granted = m.now().UTC()
	m.markGranted(a.e)
	return g, nil
}

// recovered runs f, turning a panic into an error: a parked wait goes on
// on a goroutine that no interceptor of its call recovers.
func recovered(req Request, f func() (Grant, error)) (g Grant, err error) {
	defer func() {
		if p := recover(); p != nil {
			g, err = Grant{}, fmt.Errorf("lock: acquire %q: internal error after the wait: %v", req.Name, p)
		}
	}()
	return f()
}

// turn is e's turn in its queue, behind holders, the entries that held the
// lock when it queued.
func (m *Manager) turn(req Request, e entry, holders []*mvccpb.KeyValue) *queue.Turn {
	t := queue.NewTurn(m.queue(req.Name), e.key, e.rev, req.Limit, holders)
	t.OwnedAt = e.owned
	if req.Read {
		t.Blocks = isWriter // readers ahead share the lock with this one
	}
	if m.beforeWait != nil {
		m.beforeWait()
	}
	return t
}

// turnErr says why a wait for req's turn ended without it.
func turnErr(req Request, err error) error {
	switch {
	case errors.Is(err, queue.ErrEntryGone):
		return fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	case errors.Is(err, queue.ErrTakenOver):
		// A retry owns the entry now and waits in this call's place; this
		// call's caller gave up on it (or sent the same request twice).
		return fmt.Errorf("lock: acquisition %s of %q was taken over by a retry with the same request id: %w", req.RequestID, req.Name, context.Canceled)
	}
	return err
}

// checkNotWaitingForItself fails with ErrHeld when waiting would wait for
// the request's own session: a mutex already held by this same session
// under another request would make this waiter wait for itself forever.
// So would a reader queued behind a writer that waits for this session's
// own read grant, and a writer behind it: a writer learns from its enqueue
// only the head, so it reads the readers that hold. It returns the holders
// ahead of e, read again in that case.
func (m *Manager) checkNotWaitingForItself(ctx context.Context, req Request, e entry, holders []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, error) {
	if !req.Read && req.Limit == 1 && len(holders) > 0 && isReader(holders[0]) {
		resp, err := m.cli.Get(ctx, m.queue(req.Name), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(e.rev-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			return nil, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
		}
		holders = resp.Kvs[:granted(resp.Kvs, 1)]
	}
	own := m.queue(req.Name) + fmt.Sprintf("%016x/", uint64(req.Session))
	if i := slices.IndexFunc(holders, func(kv *mvccpb.KeyValue) bool { return strings.HasPrefix(string(kv.Key), own) }); req.Limit == 1 && i >= 0 {
		return nil, fmt.Errorf("%w by this same session under request %[3]s: waiting for %[2]q would wait for itself forever; release it first",
			ErrHeld, req.Name, strings.TrimPrefix(string(holders[i].Key), own))
	}
	return holders, nil
}

func modeName(read bool) string {
	if read {
		return "read"
	}
	return "write"
}

// headsToRead is how many entries at a queue's head tell whom req's lock
// is granted to: its limit, or for a reader the whole queue (the readers
// before the first writer hold it together).
func headsToRead(req Request) int {
	if req.Read {
		return 0 // no limit
	}
	return req.Limit
}

// heldOf returns the entries of heads (read with headsToRead) that hold the
// lock.
func heldOf(req Request, heads []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	if !req.Read {
		return heads
	}
	return heads[:granted(heads, 1)]
}

// errNotEnqueued: a mutex try-lock found the queue busy and wrote nothing.
var errNotEnqueued = errors.New("lock: not enqueued")

// errIDInUse: an entry with a request id the server picked again already
// exists (see queue.IDs); nothing was written.
var errIDInUse = errors.New("lock: request id in use")

// errEntryNewer: the entry of the call's session and request id was
// written after the call began, so it may not be the call's to take over;
// nothing was written, and a retry takes it over if it is (see enqueue).
var errEntryNewer = errkind.Unavailable.New("lock: the acquisition's entry was written after this call began")

// enqueue puts this call's waiter entry into the queue (or takes over the
// entry of an earlier call with the same request id) and returns it with
// the lock's first Limit entries and its lock-delay state. An uncontended
// acquire is this one transaction.
//
// onlyIfEmpty (a mutex try-lock) enqueues only into an empty queue, so a
// refused try-lock writes nothing that others would have to wait behind;
// it returns errNotEnqueued then. mustCreate (a request id the server
// picked again) refuses to take an existing entry over: errIDInUse.
//
// An entry that vanishes between the transaction and its take-over (a
// clean-up of a failed earlier attempt removed it) is created anew.
//
// An entry is taken over only if it was written before the call began
// (its create revision at most began, the newest revision the member had
// seen then): a retry finds what its earlier attempts wrote. One written
// later may be an earlier attempt's, still in flight when the call began,
// or, once the id's grant was released and the id used again, a later
// acquisition's: an attempt stuck in etcd while its caller retried and
// went on must never take over, and then remove, the grant of the
// acquisition that followed. The call fails with errEntryNewer (Unavailable)
// instead; its transaction raised the member's revision past the entry,
// so a retry takes over an entry that is its own.
func (m *Manager) enqueue(ctx context.Context, req Request, began int64, onlyIfEmpty, mustCreate bool) (entry, []*mvccpb.KeyValue, delayState, error) {
	for attempt := 1; ; attempt++ {
		e, holders, delay, err := m.enqueueOnce(ctx, req, began, onlyIfEmpty, mustCreate)
		if errors.Is(err, errEntryVanished) && attempt < 3 {
			continue
		}
		if errors.Is(err, errEntryVanished) {
			err = fmt.Errorf("%w: the acquisition %s ended while it was retried", ErrSessionNotFound, req.RequestID)
		}
		return e, holders, delay, err
	}
}

// errEntryVanished: the entry to take over was gone by the take-over.
var errEntryVanished = errors.New("lock: entry vanished")

func (m *Manager) enqueueOnce(ctx context.Context, req Request, began int64, onlyIfEmpty, mustCreate bool) (entry, []*mvccpb.KeyValue, delayState, error) {
	q := m.queue(req.Name)
	e := entry{key: m.waiterKey(req.Name, req.Session, req.RequestID)}
	e.w = waiter{Attempt: names.NewRequestID(), Limit: req.Limit, RequestID: req.RequestID, Metadata: req.Metadata, Enqueued: m.now().UTC(), Read: req.Read}
	if req.LockDelay > 0 {
		e.w.LockDelay = req.LockDelay.String()
	}
	val, err := json.Marshal(e.w)
	if err != nil {
		return entry{}, nil, delayState{}, err
	}
	e.value = string(val)
	if !onlyIfEmpty && !mustCreate && !req.Read && !viewless(ctx) {
		if e, holders, delay, err := m.retryBehind(ctx, req, began, e); !errors.Is(err, errHeadsMoved) {
			return e, holders, delay, err
		}
	}
	heads := queue.HeadsOp(q, headsToRead(req))
	delayGet := clientv3.OpGet(m.delayKey(req.Name))
	heldGet := clientv3.OpGet(m.heldPrefix(req.Name), clientv3.WithPrefix())
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.key), "=", 0)}
	if onlyIfEmpty {
		// True only if no key at all is under the queue prefix.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q), "=", 0).WithPrefix())
	}
	if m.beforeEnqueue != nil {
		m.beforeEnqueue()
	}
	// behind: the queue's heads as this member's view of a crowded queue
	// shows them when the transaction is sent, if it was sent that way.
	var behind []*mvccpb.KeyValue
	resp, err := m.txns.Commit(ctx, groupcommit.Txn{
		Name:    q,
		Creates: true,
		If:      cmps,
		Then:    []clientv3.Op{clientv3.OpPut(e.key, e.value, clientv3.WithLease(clientv3.LeaseID(req.Session))), heads, delayGet, heldGet},
		Else:    []clientv3.Op{clientv3.OpGet(e.key), heads, delayGet, heldGet},
		Prepare: func(t *groupcommit.Txn) {
			if known, ok := m.waits.Heads(q, req.Limit, req.Limit); ok && !req.Read && !viewless(ctx) {
				behind = known
				t.If, t.Then, t.Else = m.behindTxn(req, e, known, onlyIfEmpty)
			}
		},
	})
	if err == nil && behind != nil {
		e, holders, delay, mine, err := m.behindResult(resp, e, behind, onlyIfEmpty)
		switch {
		case errors.Is(err, errHeadsMoved):
			return m.enqueueOnce(withoutView(ctx), req, began, onlyIfEmpty, mustCreate)
		case err == nil && mine != nil && mustCreate:
			return entry{}, holders, delay, errIDInUse
		case err == nil && mine != nil:
			// A retry behind the heads the view showed: take its entry
			// over, without reading the head etcd would sort.
			if e, err = m.takeOver(ctx, req, began, e, mine); err != nil {
				return entry{}, nil, delayState{}, err
			}
		}
		return e, holders, delay, err
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return entry{}, nil, delayState{}, fmt.Errorf("%w: %016x", ErrSessionNotFound, uint64(req.Session))
		}
		// The put may have committed although the answer was lost, or may
		// still commit later: remove it if it is, or becomes, exactly ours.
		queue.RemoveLate(m.cli, m.dels, &m.bg, e.key, e.value)
		return entry{}, nil, delayState{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	holders := heldOf(req, resp.Responses[1].GetResponseRange().Kvs)
	delay := delayState{held: resp.Responses[3].GetResponseRange().Kvs}
	delay.running, _ = decodeDelay(resp.Responses[2].GetResponseRange().Kvs)
	if resp.Succeeded {
		e.rev = resp.Header.Revision
		e.owned = e.rev
		return e, holders, delay, nil
	}
	mine := resp.Responses[0].GetResponseRange().Kvs
	if len(mine) == 0 {
		return entry{}, holders, delay, errNotEnqueued // only with onlyIfEmpty
	}
	if mustCreate {
		return entry{}, holders, delay, errIDInUse
	}
	// An idempotent retry: take the entry over.
	if e, err = m.takeOver(ctx, req, began, e, mine[0]); err != nil {
		return entry{}, nil, delayState{}, err
	}
	return e, holders, delay, nil
}

// retryBehind is enqueue for a retry whose entry this member's view of
// a crowded queue shows: it takes the entry over in one transaction that
// checks the queue's first entries the view shows are still there (so
// they hold the lock, as in behindTxn), without joining the lock's lane
// of creating transactions (a crowd retrying after its member restarted
// would otherwise take over one entry per commit, behind each other) and
// without reading the head etcd would sort. It fails with errHeadsMoved,
// having written nothing, when the view cannot tell or the heads moved.
func (m *Manager) retryBehind(ctx context.Context, req Request, began int64, e entry) (entry, []*mvccpb.KeyValue, delayState, error) {
	q := m.queue(req.Name)
	if m.txns.Crowded(q) {
		// A crowd joins (or retries, after its member restarted): have
		// this member's view of it, which a crowd's waits keep anyway,
		// before taking a place in its line of creations.
		release, err := m.waits.Hold(ctx, q, req.Limit)
		if err != nil {
			return entry{}, nil, delayState{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
		}
		defer release()
	}
	kv, ok := m.waits.Entry(q, req.Limit, e.key)
	if !ok {
		return entry{}, nil, delayState{}, errHeadsMoved
	}
	heads, ok := m.waits.Heads(q, req.Limit, req.Limit)
	if !ok {
		return entry{}, nil, delayState{}, errHeadsMoved
	}
	e, err := m.takeOverValue(req, began, e, kv)
	if err != nil {
		return entry{}, nil, delayState{}, err
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.key), "=", e.rev)}
	for _, h := range heads {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(string(h.Key)), "=", h.CreateRevision))
	}
	resp, err := m.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(e.key, e.value, clientv3.WithIgnoreLease()),
		clientv3.OpGet(m.delayKey(req.Name)), clientv3.OpGet(m.heldPrefix(req.Name), clientv3.WithPrefix())).Commit()
	if err != nil {
		return entry{}, nil, delayState{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	if !resp.Succeeded {
		return entry{}, nil, delayState{}, errHeadsMoved // or the entry went: the long way tells
	}
	delay := delayState{held: resp.Responses[2].GetResponseRange().Kvs}
	delay.running, _ = decodeDelay(resp.Responses[1].GetResponseRange().Kvs)
	e.owned = resp.Header.Revision
	m.joinsBehind.Add(1)
	return e, heads, delay, nil
}

// takeOver takes kv, the entry of an earlier call with the same request
// id, over for e's call, keeping its enqueue time, so that a failing
// earlier call can no longer remove it.
func (m *Manager) takeOver(ctx context.Context, req Request, began int64, e entry, kv *mvccpb.KeyValue) (entry, error) {
	e, err := m.takeOverValue(req, began, e, kv)
	if err != nil {
		return entry{}, err
	}
	if e.owned, err = queue.TakeOver(ctx, m.cli, e.key, e.rev, e.value); err != nil {
		return entry{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	if e.owned == 0 {
		return entry{}, errEntryVanished
	}
	return e, nil
}

// takeOverValue is e, taking kv over: kv's create revision, and the value
// a take-over writes (kv's enqueue time kept). It refuses kv if it was
// written after the call began (see enqueue), or in the other mode.
func (m *Manager) takeOverValue(req Request, began int64, e entry, kv *mvccpb.KeyValue) (entry, error) {
	if kv.CreateRevision > began {
		return entry{}, fmt.Errorf("%w (lock %q, request %s: by an earlier attempt still in flight, or a later acquisition under the same id); retry", errEntryNewer, req.Name, req.RequestID)
	}
	e.rev = kv.CreateRevision
	var prev waiter
	if json.Unmarshal(kv.Value, &prev) == nil {
		if prev.Read != req.Read {
			// A retry must not turn a reader into a writer (or back) behind
			// the others' backs: they were granted or queued by its mode.
			return entry{}, fmt.Errorf("%w: acquisition %s of %q asked for a %s grant; a retry must ask for the same", ErrInvalid, req.RequestID, req.Name, modeName(prev.Read))
		}
		e.w.Enqueued, e.w.Granted = prev.Enqueued, prev.Granted
	}
	val, err := json.Marshal(e.w)
	if err != nil {
		return entry{}, err
	}
	e.value = string(val)
	return e, nil
}

// behindTxn is the enqueue transaction for a queue that this member's
// view shows with at least Limit entries (a crowd, waiting here): instead
// of reading the queue's head, which etcd sorts whole (O(n) for each join,
// O(n²) for a crowd), it checks that the first entries the view saw,
// heads, still exist. Then they are still the queue's first Limit entries
// (entries only join at the tail) and hold the lock, so e waits behind
// them (a try-lock, onlyIfEmpty, is refused): O(Limit · log n). When the
// check fails (a head left since, or e's key exists: a retry), nothing is
// written; see behindResult.
func (m *Manager) behindTxn(req Request, e entry, heads []*mvccpb.KeyValue, onlyIfEmpty bool) (cmps []clientv3.Cmp, then, els []clientv3.Op) {
	headsThere := make([]clientv3.Cmp, 0, len(heads))
	for _, kv := range heads {
		headsThere = append(headsThere, clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision))
	}
	cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.key), "=", 0)}, headsThere...)
	delayGet, heldGet := clientv3.OpGet(m.delayKey(req.Name)), clientv3.OpGet(m.heldPrefix(req.Name), clientv3.WithPrefix())
	then = []clientv3.Op{delayGet, heldGet}
	if !onlyIfEmpty {
		then = append(then, clientv3.OpPut(e.key, e.value, clientv3.WithLease(clientv3.LeaseID(req.Session))))
	}
	// Failed: with the heads there, e's key exists (a retry, which takes
	// it over behind them, see behindResult).
	els = []clientv3.Op{clientv3.OpTxn(headsThere, []clientv3.Op{clientv3.OpGet(e.key), delayGet, heldGet}, nil)}
	return cmps, then, els
}

// behindResult reads the answer of behindTxn. It returns errHeadsMoved
// when the heads changed (nothing was written): the caller enqueues the
// long way. For a retry (e's key exists, the heads did not change) it
// returns that entry as mine, for the caller to take over.
func (m *Manager) behindResult(resp *clientv3.TxnResponse, e entry, heads []*mvccpb.KeyValue, onlyIfEmpty bool) (entry, []*mvccpb.KeyValue, delayState, *mvccpb.KeyValue, error) {
	if !resp.Succeeded {
		inner := resp.Responses[0].GetResponseTxn()
		if !inner.GetSucceeded() || len(inner.GetResponses()) < 3 || len(inner.Responses[0].GetResponseRange().GetKvs()) == 0 {
			return entry{}, nil, delayState{}, nil, errHeadsMoved
		}
		delay := delayState{held: inner.Responses[2].GetResponseRange().Kvs}
		delay.running, _ = decodeDelay(inner.Responses[1].GetResponseRange().Kvs)
		m.joinsBehind.Add(1)
		return e, heads, delay, inner.Responses[0].GetResponseRange().Kvs[0], nil
	}
	m.joinsBehind.Add(1)
	delay := delayState{held: resp.Responses[1].GetResponseRange().Kvs}
	delay.running, _ = decodeDelay(resp.Responses[0].GetResponseRange().Kvs)
	if onlyIfEmpty {
		return entry{}, heads, delay, nil, errNotEnqueued
	}
	e.rev = resp.Header.Revision
	e.owned = e.rev
	return e, heads, delay, nil, nil
}

// errHeadsMoved: behindTxn's check found the queue's heads changed (or the
// entry there already); nothing was written.
var errHeadsMoved = errors.New("lock: the queue's heads moved")

// viewlessKey marks, in a context, an enqueue that must read the queue's
// heads from etcd: its check against the member's view failed once.
type viewlessKey struct{}

func withoutView(ctx context.Context) context.Context {
	return context.WithValue(ctx, viewlessKey{}, true)
}

func viewless(ctx context.Context) bool { v, _ := ctx.Value(viewlessKey{}).(bool); return v }

// Lock-delay. A holder that asked for a lock-delay leaves a record,
// "held/<token>", that outlives its session (no lease); a clean Release
// deletes it in the same transaction as the entry. So a record whose entry
// is gone marks a holder that ended without a release. Whoever is granted
// next finds it, starts the delay (from that moment: the exact end of the
// session is not known, so the delay errs long), and records it in the
// "delay" key, bound to its own session, where Describe, fenced checks and
// later acquirers see it.

// lockDelay is a running delay: the entry whose token is Token may not act
// before Until.
type lockDelay struct {
	Token int64     `json:"token"`
	Until time.Time `json:"until"`
}

// heldRecord is the value of a held/<token> record.
type heldRecord struct {
	LockDelay string `json:"lock_delay"`
}

// delayState is what a grant needs to know about lock-delay.
type delayState struct {
	running lockDelay          // the delay key, if any
	held    []*mvccpb.KeyValue // held/ records
}

func (m *Manager) delayKey(name string) string   { return m.locks + escape(name) + "/delay" }
func (m *Manager) heldPrefix(name string) string { return m.locks + escape(name) + "/held/" }

func decodeDelay(kvs []*mvccpb.KeyValue) (lockDelay, bool) {
	if len(kvs) == 0 {
		return lockDelay{}, false
	}
	var d lockDelay
	if json.Unmarshal(kvs[0].Value, &d) != nil {
		return lockDelay{}, false
	}
	return d, true
}

// delayOf is the lock-delay a waiter entry's value asks for.
func delayOf(value []byte) time.Duration {
	var w waiter
	if json.Unmarshal(value, &w) != nil || w.LockDelay == "" {
		return 0
	}
	d, _ := time.ParseDuration(w.LockDelay)
	return d
}

// orphans returns the held/ records whose holder is no longer among the
// lock's live holders, and the longest delay they ask for.
func (d delayState) orphans(holders []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, time.Duration) {
	var out []*mvccpb.KeyValue
	var longest time.Duration
	for _, rec := range d.held {
		token := rec.Key[strings.LastIndexByte(string(rec.Key), '/')+1:]
		live := slices.ContainsFunc(holders, func(kv *mvccpb.KeyValue) bool {
			return strconv.FormatInt(kv.CreateRevision, 10) == string(token)
		})
		if live {
			continue
		}
		out = append(out, rec)
		var r heldRecord
		if json.Unmarshal(rec.Value, &r) == nil {
			if dur, err := time.ParseDuration(r.LockDelay); err == nil && dur > longest {
				longest = dur
			}
		}
	}
	return out, longest
}

// until is when a grant made now could act: now, or later if a delay runs
// or an orphaned holder record starts one.
func (d delayState) until(now time.Time, holders []*mvccpb.KeyValue) time.Time {
	until := now
	if d.running.Until.After(until) {
		until = d.running.Until
	}
	if _, longest := d.orphans(holders); now.Add(longest).After(until) {
		until = now.Add(longest)
	}
	return until
}

// settleDelayAfterWait reads the lock-delay state once a waiter's turn has
// come, then settles it.
func (m *Manager) settleDelayAfterWait(ctx context.Context, req Request, e entry) (time.Duration, error) {
	resp, err := m.cli.Txn(ctx).Then(
		queue.HeadsOp(m.queue(req.Name), headsToRead(req)),
		clientv3.OpGet(m.delayKey(req.Name)),
		clientv3.OpGet(m.heldPrefix(req.Name), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("lock: read lock-delay: %w", err)
	}
	d := delayState{held: resp.Responses[2].GetResponseRange().Kvs}
	d.running, _ = decodeDelay(resp.Responses[1].GetResponseRange().Kvs)
	return m.settleDelay(ctx, req, e, d, heldOf(req, resp.Responses[0].GetResponseRange().Kvs))
}

// settleDelay makes a grant respect lock-delay: it starts a delay for
// orphaned holder records (deleting them), inherits a running one, records
// this holder's own record if it asks for a delay, and sits the delay out.
// holders are the lock's live holders, this entry among them. Locks that
// never used lock-delay write nothing here. It returns how long it sat the
// delay out.
func (m *Manager) settleDelay(ctx context.Context, req Request, e entry, d delayState, holders []*mvccpb.KeyValue) (time.Duration, error) {
	now := m.now()
	orphans, _ := d.orphans(holders)
	until := d.until(now, holders)
	delayed := until.After(now)
	if !delayed && req.LockDelay == 0 && len(orphans) == 0 {
		return 0, nil
	}
	var ops []clientv3.Op
	if delayed {
		val, err := json.Marshal(lockDelay{Token: e.rev, Until: until.UTC()})
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(m.delayKey(req.Name), string(val), clientv3.WithLease(clientv3.LeaseID(req.Session))))
	}
	for _, rec := range orphans {
		ops = append(ops, clientv3.OpDelete(string(rec.Key)))
	}
	if req.LockDelay > 0 {
		val, err := json.Marshal(heldRecord{LockDelay: req.LockDelay.String()})
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(m.heldPrefix(req.Name)+strconv.FormatInt(e.rev, 10), string(val)))
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", e.rev)).
		Then(ops...).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("lock: record lock-delay: %w", err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	}
	if !delayed {
		return 0, nil
	}
	start := m.now()
	timer := time.NewTimer(until.Sub(start))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-timer.C:
	}
	cur, err := m.cli.Get(ctx, e.key)
	if err != nil {
		return 0, fmt.Errorf("lock: after lock-delay: %w", err)
	}
	if len(cur.Kvs) == 0 || cur.Kvs[0].CreateRevision != e.rev {
		return 0, fmt.Errorf("%w: the waiter's session ended during the lock-delay", ErrSessionNotFound)
	}
	return m.now().Sub(start), nil
}

// markGranted records in the background when a waiter was granted, for
// Describe. It is off the hand-off path on purpose (see queue.Restamp). A
// lost mark only makes Describe report the enqueue time.
func (m *Manager) markGranted(e entry) {
	if val, err := json.Marshal(e.w); err == nil {
		queue.Restamp(&m.bg, m.cli, e.key, e.value, string(val))
	}
}

// dequeue removes e's entry if it is still exactly what this call wrote;
// see queue.Remove.
func (m *Manager) dequeue(ctx context.Context, e entry) {
	queue.Remove(ctx, m.cli, &m.bg, e.key, e.value)
}
