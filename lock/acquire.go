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

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	value string // the value this call wrote; dequeue compares it
	w     waiter
}

func (m *Manager) acquire(ctx context.Context, req Request, wait bool) (Grant, error) {
	if err := validateRequest(&req); err != nil {
		return Grant{}, err
	}
	e, holders, delay, err := m.enqueue(ctx, req, !wait && req.Limit == 1)
	if errors.Is(err, errNotEnqueued) {
		if lim, ok := limitOf(holders); ok && lim != req.Limit {
			return Grant{}, fmt.Errorf("%w: lock %q allows %d holders, the request says %d", ErrLimitMismatch, req.Name, lim, req.Limit)
		}
		return Grant{}, fmt.Errorf("%w: %q", ErrHeld, req.Name)
	}
	if err != nil {
		return Grant{}, err
	}
	g := Grant{Name: req.Name, Token: fencing.Token(e.rev), Key: e.key, Session: req.Session, RequestID: req.RequestID}
	fail := func(err error) (Grant, error) {
		m.dequeue(ctx, e)
		return Grant{}, err
	}

	if lim, ok := limitOf(holders); ok && lim != req.Limit {
		return fail(fmt.Errorf("%w: lock %q allows %d holders, the request says %d", ErrLimitMismatch, req.Name, lim, req.Limit))
	}
	if slices.ContainsFunc(holders, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == e.key }) {
		// Granted at once. A lock-delay left by an expired holder (for
		// this entry or one that gave up during it) still applies.
		if until := delay.Until; until.After(m.now()) {
			if !wait {
				return fail(fmt.Errorf("%w: %q is in a lock-delay until %s", ErrHeld, req.Name, until.UTC().Format(time.RFC3339Nano)))
			}
			if err := m.sitOutDelay(ctx, req, e, until); err != nil {
				return fail(err)
			}
		}
		g.Revision = e.rev
		return g, nil
	}
	if !wait {
		return fail(fmt.Errorf("%w: %q", ErrHeld, req.Name))
	}
	// A mutex already held by this same session under another request
	// would make this waiter wait for itself forever.
	own := m.queue(req.Name) + fmt.Sprintf("%016x/", uint64(req.Session))
	if req.Limit == 1 && len(holders) > 0 && strings.HasPrefix(string(holders[0].Key), own) {
		return fail(fmt.Errorf("%w: this session already holds %q (request %s); waiting would deadlock, release it first",
			ErrHeld, req.Name, strings.TrimPrefix(string(holders[0].Key), own)))
	}

	t := queue.NewTurn(m.queue(req.Name), e.key, e.rev, req.Limit, holders)
	rev, err := queue.Wait(ctx, m.cli, t)
	if errors.Is(err, queue.ErrEntryGone) {
		err = fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	}
	if err == nil {
		err = m.applyLockDelay(ctx, req, e, t.Gone)
	}
	if err != nil {
		return fail(err)
	}
	g.Revision = rev
	e.w.Granted = m.now().UTC()
	m.markGranted(e)
	return g, nil
}

// errNotEnqueued: a mutex try-lock found the queue busy and wrote nothing.
var errNotEnqueued = errors.New("lock: not enqueued")

// enqueue puts this call's waiter entry into the queue (or takes over the
// entry of an earlier call with the same request id) and returns it with
// the lock's first Limit entries and its lock-delay state. An uncontended
// acquire is this one transaction.
//
// onlyIfEmpty (a mutex try-lock) enqueues only into an empty queue, so a
// refused try-lock writes nothing that others would have to wait behind;
// it returns errNotEnqueued then.
func (m *Manager) enqueue(ctx context.Context, req Request, onlyIfEmpty bool) (entry, []*mvccpb.KeyValue, lockDelay, error) {
	q := m.queue(req.Name)
	e := entry{key: m.waiterKey(req.Name, req.Session, req.RequestID)}
	e.w = waiter{Attempt: newRequestID(), Limit: req.Limit, RequestID: req.RequestID, Metadata: req.Metadata, Enqueued: m.now().UTC()}
	if req.LockDelay > 0 {
		e.w.LockDelay = req.LockDelay.String()
	}
	val, err := json.Marshal(e.w)
	if err != nil {
		return entry{}, nil, lockDelay{}, err
	}
	e.value = string(val)
	heads := clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(req.Limit)))
	delayGet := clientv3.OpGet(m.delayKey(req.Name))
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.key), "=", 0)}
	if onlyIfEmpty {
		// True only if no key at all is under the queue prefix.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q), "=", 0).WithPrefix())
	}
	resp, err := m.cli.Txn(ctx).
		If(cmps...).
		Then(clientv3.OpPut(e.key, e.value, clientv3.WithLease(req.Session)), heads, delayGet).
		Else(clientv3.OpGet(e.key), heads, delayGet).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return entry{}, nil, lockDelay{}, fmt.Errorf("%w: %016x", ErrSessionNotFound, uint64(req.Session))
		}
		// The put may have committed although the answer was lost: remove
		// it if it is still exactly ours.
		m.dequeue(ctx, e)
		return entry{}, nil, lockDelay{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	holders := resp.Responses[1].GetResponseRange().Kvs
	delay, _ := decodeDelay(resp.Responses[2].GetResponseRange().Kvs)
	if resp.Succeeded {
		e.rev = resp.Header.Revision
		return e, holders, delay, nil
	}
	mine := resp.Responses[0].GetResponseRange().Kvs
	if len(mine) == 0 {
		return entry{}, holders, delay, errNotEnqueued // only with onlyIfEmpty
	}
	// An idempotent retry: take the entry over, keeping its enqueue time,
	// so that a failing earlier call can no longer remove it.
	kv := mine[0]
	e.rev = kv.CreateRevision
	var prev waiter
	if json.Unmarshal(kv.Value, &prev) == nil {
		e.w.Enqueued, e.w.Granted = prev.Enqueued, prev.Granted
	}
	if val, err = json.Marshal(e.w); err != nil {
		return entry{}, nil, lockDelay{}, err
	}
	e.value = string(val)
	stamp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", e.rev)).
		Then(clientv3.OpPut(e.key, e.value, clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return entry{}, nil, lockDelay{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	if !stamp.Succeeded {
		return entry{}, nil, lockDelay{}, fmt.Errorf("%w: the acquisition %s ended while it was retried", ErrSessionNotFound, req.RequestID)
	}
	return e, holders, delay, nil
}

// lockDelay is the delay state of a lock: the waiter whose token is Token
// may not act before Until. It is stored bound to that waiter's lease.
type lockDelay struct {
	Token int64     `json:"token"`
	Until time.Time `json:"until"`
}

func (m *Manager) delayKey(name string) string    { return m.locks + escape(name) + "/delay" }
func (m *Manager) releasedKey(name string) string { return m.locks + escape(name) + "/released" }

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

// applyLockDelay runs when a waiter's turn has come. A holder ahead of it
// that asked for a lock-delay and went away without a clean Release (its
// session expired or was closed) delays the grant; so does a delay still
// running from an earlier expiry (its waiter may have given up). The delay
// is recorded, visible to Describe and to fenced checks, and sat out.
// Locks without lock-delay pay no extra read.
func (m *Manager) applyLockDelay(ctx context.Context, req Request, e entry, gone []queue.Gone) error {
	var delay time.Duration
	for _, g := range gone {
		var w waiter
		if json.Unmarshal(g.KV.Value, &w) != nil || w.LockDelay == "" {
			continue
		}
		d, err := time.ParseDuration(w.LockDelay)
		if err != nil || d <= delay {
			continue
		}
		clean, err := m.releasedCleanly(ctx, req.Name, g)
		if err != nil {
			return err
		}
		if !clean {
			delay = d
		}
	}
	if delay == 0 && req.LockDelay == 0 {
		return nil
	}
	until := time.Time{}
	if delay > 0 {
		until = m.now().Add(delay)
	}
	cur, err := m.cli.Get(ctx, m.delayKey(req.Name))
	if err != nil {
		return fmt.Errorf("lock: read lock-delay: %w", err)
	}
	if d, ok := decodeDelay(cur.Kvs); ok && d.Until.After(until) {
		until = d.Until // inherit a delay that is still running
	}
	if !until.After(m.now()) {
		return nil
	}
	return m.sitOutDelay(ctx, req, e, until)
}

// releasedCleanly reports whether a holder that went away was released by
// Release: the release marker, written in the same transaction, names its
// token. Without the exact revision of its deletion, only the current
// marker can be checked; a later release may have replaced it, and then
// the holder counts as expired (the delay errs on the safe side).
func (m *Manager) releasedCleanly(ctx context.Context, name string, g queue.Gone) (bool, error) {
	opts := []clientv3.OpOption{}
	if g.Rev > 0 {
		opts = append(opts, clientv3.WithRev(g.Rev))
	}
	rel, err := m.cli.Get(ctx, m.releasedKey(name), opts...)
	if err != nil {
		return false, fmt.Errorf("lock: read release marker: %w", err)
	}
	if len(rel.Kvs) != 1 || string(rel.Kvs[0].Value) != strconv.FormatInt(g.KV.CreateRevision, 10) {
		return false, nil
	}
	return g.Rev == 0 || rel.Kvs[0].ModRevision == g.Rev, nil
}

// sitOutDelay records that e waits out a lock-delay until until, waits, and
// checks that e (and so its session) is still there.
func (m *Manager) sitOutDelay(ctx context.Context, req Request, e entry, until time.Time) error {
	val, err := json.Marshal(lockDelay{Token: e.rev, Until: until.UTC()})
	if err != nil {
		return err
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", e.rev)).
		Then(clientv3.OpPut(m.delayKey(req.Name), string(val), clientv3.WithLease(req.Session))).
		Commit()
	if err != nil {
		return fmt.Errorf("lock: record lock-delay: %w", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	}
	if wait := until.Sub(m.now()); wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
	cur, err := m.cli.Get(ctx, e.key)
	if err != nil {
		return fmt.Errorf("lock: after lock-delay: %w", err)
	}
	if len(cur.Kvs) == 0 || cur.Kvs[0].CreateRevision != e.rev {
		return fmt.Errorf("%w: the waiter's session ended during the lock-delay", ErrSessionNotFound)
	}
	return nil
}

// markGranted records in the background when a waiter was granted, for
// Describe. It is off the hand-off path on purpose: it costs a commit, and
// the holder must not wait for it. A lost mark only makes Describe report
// the enqueue time.
func (m *Manager) markGranted(e entry) {
	val, err := json.Marshal(e.w)
	if err != nil {
		return
	}
	m.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(e.key), "=", e.value)).
			Then(clientv3.OpPut(e.key, string(val), clientv3.WithIgnoreLease())).
			Commit()
	})
}

// dequeue removes e's entry if it is still exactly what this call wrote;
// see queue.Remove.
func (m *Manager) dequeue(ctx context.Context, e entry) {
	queue.Remove(ctx, m.cli, &m.bg, e.key, e.value)
}
