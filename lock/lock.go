package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coordd/coordd/fencing"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed or out-of-bounds argument; nothing changed.
	ErrInvalid = errors.New("lock: invalid argument")
	// ErrTooLarge: metadata or a fenced value over its size limit; nothing changed.
	ErrTooLarge = errors.New("lock: value too large")
	// ErrHeld: TryAcquire found the lock held (all permits taken).
	ErrHeld = errors.New("lock: held by another session")
	// ErrNotHolder: Release was given a token that holds nothing now.
	ErrNotHolder = errors.New("lock: not the holder")
	// ErrStaleToken: a fenced call's token no longer holds the lock.
	ErrStaleToken = errors.New("lock: stale fencing token")
	// ErrLimitMismatch: Acquire asked for another limit than the lock has.
	ErrLimitMismatch = errors.New("lock: limit differs from the lock's")
	// ErrSessionNotFound: the session does not exist, or ended while its
	// acquire waited.
	ErrSessionNotFound = errors.New("lock: session not found")
)

// Limits.
const (
	MaxNameBytes      = 256
	MaxRequestIDBytes = 64
	MaxMetadataBytes  = 1024
	MaxLimit          = 1024
	MaxKeyBytes       = 512
	MaxValueBytes     = 512 << 10
	MaxLockDelay      = time.Minute
)

// Manager runs lock operations. It is safe for concurrent use.
type Manager struct {
	cli   *clientv3.Client
	locks string // "<root>lock/"
	kv    string // "<root>kv/"
	now   func() time.Time

	marks sync.WaitGroup // markGranted goroutines; Close waits for them
}

// NewManager returns a Manager that keeps locks under root+"lock/" and
// fenced keys under root+"kv/".
func NewManager(cli *clientv3.Client, root string) *Manager {
	return &Manager{cli: cli, locks: root + "lock/", kv: root + "kv/", now: time.Now}
}

// Close waits for the background writes that record when waiters were
// granted (at most a few seconds each). Call it before closing the client.
func (m *Manager) Close() { m.marks.Wait() }

// Request asks for a lock.
type Request struct {
	Name    string
	Session clientv3.LeaseID // the waiter's session; required
	// Limit is the number of holders the lock allows: 1 (the default when
	// zero) for a mutex, more for a semaphore. Every caller of one lock must
	// give the same limit.
	Limit int
	// RequestID makes Acquire idempotent: a retry with the same session
	// and request id returns the same grant. Empty means a fresh id.
	RequestID string
	// Metadata is shown by Describe (for example who holds the lock and
	// why); at most MaxMetadataBytes.
	Metadata string
	// LockDelay, when positive, keeps the lock from the next waiter for
	// this long after this holder's session expires (not after a clean
	// Release), so a holder that lost its session has time to notice and
	// stop before anyone else acts. At most MaxLockDelay.
	LockDelay time.Duration
}

// Grant is a held lock.
type Grant struct {
	Name      string
	Token     fencing.Token // the waiter key's create revision
	Key       string        // the waiter key in etcd
	Revision  int64         // the etcd revision at which the grant was observed
	Session   clientv3.LeaseID
	RequestID string
}

// waiter is the JSON stored in a waiter key.
type waiter struct {
	Limit     int       `json:"limit"`
	LockDelay string    `json:"lock_delay,omitempty"` // a time.Duration
	RequestID string    `json:"request_id"`
	Metadata  string    `json:"metadata,omitempty"`
	Enqueued  time.Time `json:"enqueued"`
	Granted   time.Time `json:"granted,omitzero"` // set after a grant that had to wait
}

func (m *Manager) queue(name string) string { return m.locks + escape(name) + "/q/" }

func (m *Manager) waiterKey(name string, session clientv3.LeaseID, requestID string) string {
	return fmt.Sprintf("%s%016x/%s", m.queue(name), uint64(session), requestID)
}

// Hint names a grant's session and request id (see Release).
type Hint struct {
	Session   clientv3.LeaseID
	RequestID string
}

// Acquire queues for the lock and blocks until it is granted, the waiter's
// session ends (ErrSessionNotFound), or ctx ends (ctx's error). Either way
// an unsuccessful Acquire leaves no waiter key behind.
func (m *Manager) Acquire(ctx context.Context, req Request) (Grant, error) {
	return m.acquire(ctx, req, true)
}

// TryAcquire takes the lock if it can be taken now, and returns ErrHeld
// otherwise, leaving nothing behind.
func (m *Manager) TryAcquire(ctx context.Context, req Request) (Grant, error) {
	return m.acquire(ctx, req, false)
}

func (m *Manager) acquire(ctx context.Context, req Request, wait bool) (Grant, error) {
	if err := validateRequest(&req); err != nil {
		return Grant{}, err
	}
	q := m.queue(req.Name)
	key := m.waiterKey(req.Name, req.Session, req.RequestID)
	w := waiter{Limit: req.Limit, RequestID: req.RequestID, Metadata: req.Metadata, Enqueued: m.now().UTC()}
	if req.LockDelay > 0 {
		w.LockDelay = req.LockDelay.String()
	}
	val, err := json.Marshal(w)
	if err != nil {
		return Grant{}, err
	}
	heads := clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(req.Limit)))
	// One transaction enqueues (unless this request is already queued) and
	// reads the holders, so an uncontended acquire is one etcd commit.
	delayKey := m.delayKey(req.Name)
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(req.Session)), heads, clientv3.OpGet(delayKey)).
		Else(clientv3.OpGet(key), heads, clientv3.OpGet(delayKey)).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return Grant{}, fmt.Errorf("%w: %016x", ErrSessionNotFound, uint64(req.Session))
		}
		return Grant{}, fmt.Errorf("lock: acquire %q: %w", req.Name, err)
	}
	created := resp.Succeeded
	myRev := resp.Header.Revision
	if !created {
		// A retry: the queued entry, with its enqueue time, is the truth.
		kv := resp.Responses[0].GetResponseRange().Kvs[0]
		myRev = kv.CreateRevision
		_ = json.Unmarshal(kv.Value, &w)
	}
	g := Grant{Name: req.Name, Token: fencing.Token(myRev), Key: key, Revision: resp.Header.Revision, Session: req.Session, RequestID: req.RequestID}
	holders := resp.Responses[1].GetResponseRange().Kvs

	if lim, ok := limitOf(holders); ok && lim != req.Limit {
		if created {
			m.dequeue(ctx, key, myRev)
		}
		return Grant{}, fmt.Errorf("%w: lock %q allows %d holders, the request says %d", ErrLimitMismatch, req.Name, lim, req.Limit)
	}
	for _, kv := range holders {
		if string(kv.Key) == key {
			// A retried acquire may find this grant inside its lock-delay.
			if d, ok := decodeDelay(resp.Responses[2].GetResponseRange().Kvs); ok && d.Token == myRev {
				if err := m.sitOutDelay(ctx, key, myRev, d.Until); err != nil {
					m.dequeue(ctx, key, myRev)
					return Grant{}, err
				}
			}
			return g, nil
		}
	}
	if !wait {
		if created {
			m.dequeue(ctx, key, myRev)
		}
		return Grant{}, fmt.Errorf("%w: %q", ErrHeld, req.Name)
	}
	// A mutex already held by this same session under another request
	// would make this waiter wait for itself forever.
	if own := q + fmt.Sprintf("%016x/", uint64(req.Session)); req.Limit == 1 && len(holders) > 0 && strings.HasPrefix(string(holders[0].Key), own) {
		if created {
			m.dequeue(ctx, key, myRev)
		}
		return Grant{}, fmt.Errorf("%w: this session already holds %q (request %s); waiting would deadlock, release it first",
			ErrHeld, req.Name, strings.TrimPrefix(string(holders[0].Key), own))
	}
	rev, prev, err := m.waitTurn(ctx, q, key, myRev, req.Limit)
	if err == nil && prev != nil {
		err = m.applyLockDelay(ctx, req, key, myRev, rev, prev)
	}
	if err != nil {
		m.dequeue(ctx, key, myRev)
		return Grant{}, err
	}
	g.Revision = rev
	w.Granted = m.now().UTC()
	m.markGranted(key, myRev, w)
	return g, nil
}

// markGranted records in the background when a waiter was granted, for
// Describe. It is off the hand-off path on purpose: it costs a commit, and
// the holder must not wait for it. A lost mark only makes Describe report
// the enqueue time.
func (m *Manager) markGranted(key string, rev int64, w waiter) {
	val, err := json.Marshal(w)
	if err != nil {
		return
	}
	m.marks.Add(1)
	go func() {
		defer m.marks.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease())).
			Commit()
	}()
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

// applyLockDelay runs after a waiter's turn came at revision rev because
// prev (the last key ahead of it) went away. If prev asked for a lock-delay
// and went away without a clean Release (its session expired or was
// closed), the waiter records the delay, visible to Describe and to fenced
// checks, and sits it out before it is granted.
func (m *Manager) applyLockDelay(ctx context.Context, req Request, key string, myRev, rev int64, prev *mvccpb.KeyValue) error {
	var w waiter
	if json.Unmarshal(prev.Value, &w) != nil || w.LockDelay == "" {
		return nil
	}
	delay, err := time.ParseDuration(w.LockDelay)
	if err != nil || delay <= 0 {
		return nil
	}
	rel, err := m.cli.Get(ctx, m.releasedKey(req.Name), clientv3.WithRev(rev))
	if err != nil {
		return fmt.Errorf("lock: read release marker: %w", err)
	}
	if len(rel.Kvs) == 1 && rel.Kvs[0].ModRevision == rev && string(rel.Kvs[0].Value) == strconv.FormatInt(prev.CreateRevision, 10) {
		return nil // released cleanly in the same transaction that freed our turn
	}
	until := m.now().Add(delay).UTC()
	val, err := json.Marshal(lockDelay{Token: myRev, Until: until})
	if err != nil {
		return err
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", myRev)).
		Then(clientv3.OpPut(m.delayKey(req.Name), string(val), clientv3.WithLease(req.Session))).
		Commit()
	if err != nil {
		return fmt.Errorf("lock: record lock-delay: %w", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	}
	return m.sitOutDelay(ctx, key, myRev, until)
}

// sitOutDelay waits until until, then checks that the waiter's key (and so
// its session) is still there.
func (m *Manager) sitOutDelay(ctx context.Context, key string, myRev int64, until time.Time) error {
	if wait := until.Sub(m.now()); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	resp, err := m.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("lock: after lock-delay: %w", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != myRev {
		return fmt.Errorf("%w: the waiter's session ended during the lock-delay", ErrSessionNotFound)
	}
	return nil
}

// waitTurn waits until fewer than limit keys older than myRev remain in
// queue q, and returns the revision at which that became true and the key
// whose deletion made it so (nil if it was already true). It fails with
// ErrSessionNotFound when the waiter's own key goes away.
//
// It opens a watch at the current revision W first, then counts the keys
// ahead at exactly W, so every later deletion arrives as one watch event
// and no further reads are needed. Opening the watch at the current
// revision matters: etcd serves watches that start at a past revision from
// a loop that runs every 100 ms, which is what makes etcd's own mutex hand
// off in about 100 ms.
func (m *Manager) waitTurn(ctx context.Context, q, key string, myRev int64, limit int) (int64, *mvccpb.KeyValue, error) {
	for {
		rev, prev, err := m.watchTurn(ctx, q, key, myRev, limit)
		if errors.Is(err, errRewatch) {
			continue
		}
		return rev, prev, err
	}
}

var errRewatch = errors.New("lock: watch ended; count again")

func (m *Manager) watchTurn(ctx context.Context, q, key string, myRev int64, limit int) (int64, *mvccpb.KeyValue, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := m.cli.Watch(wctx, q, clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	created, ok := <-wch
	if !ok || created.Err() != nil {
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		return 0, nil, errRewatch
	}
	w := created.Header.Revision // the watch delivers events after w
	// The keys up to and including ours at w. (Count the returned keys:
	// etcd's Count ignores the create revision filter.)
	resp, err := m.cli.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithRev(w), clientv3.WithMaxCreateRev(myRev), clientv3.WithKeysOnly())
	if err != nil {
		return 0, nil, fmt.Errorf("lock: wait: %w", err)
	}
	var ahead int64
	mine := false
	for _, kv := range resp.Kvs {
		if string(kv.Key) == key && kv.CreateRevision == myRev {
			mine = true
		} else {
			ahead++
		}
	}
	if !mine {
		return 0, nil, fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
	}
	if ahead < int64(limit) {
		return w, nil, nil
	}
	for wr := range wch {
		if err := wr.Err(); err != nil {
			if ctx.Err() != nil {
				return 0, nil, ctx.Err()
			}
			return 0, nil, errRewatch // compacted, leader lost, ...: count again
		}
		for _, ev := range wr.Events {
			if ev.Type != mvccpb.DELETE || ev.PrevKv == nil {
				continue
			}
			if string(ev.PrevKv.Key) == key {
				return 0, nil, fmt.Errorf("%w: the waiter's session ended while it waited", ErrSessionNotFound)
			}
			if ev.PrevKv.CreateRevision < myRev {
				if ahead--; ahead < int64(limit) {
					return ev.Kv.ModRevision, ev.PrevKv, nil
				}
			}
		}
	}
	if ctx.Err() != nil {
		return 0, nil, ctx.Err()
	}
	return 0, nil, errRewatch
}

// dequeue removes this request's waiter key (if it is still the same
// incarnation), also when ctx has ended.
func (m *Manager) dequeue(ctx context.Context, key string, rev int64) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = m.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
}

// Release gives up the grant that token names. It returns ErrNotHolder if
// that grant no longer exists (released, or its session ended): a late or
// retried release never removes a newer holder.
//
// hint, when not zero, names the grant's session and request id; it saves
// the read that finds the grant's key. A wrong hint only makes the release
// fail with ErrNotHolder.
func (m *Manager) Release(ctx context.Context, name string, token fencing.Token, hint Hint) error {
	if err := validateName(name); err != nil {
		return err
	}
	if token <= 0 {
		return fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	key, lease := "", hint.Session
	if hint.Session > 0 && hint.RequestID != "" {
		if err := validateRequestID(hint.RequestID); err != nil {
			return err
		}
		key = m.waiterKey(name, hint.Session, hint.RequestID)
	} else {
		h, err := m.holder(ctx, name, token)
		if err != nil {
			return err
		}
		key, lease = h.key, h.lease
	}
	if key == "" {
		return fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	// The release marker, written in the same transaction as the delete,
	// tells the next waiter this was a clean release (no lock-delay). It is
	// bound to the releaser's session so it does not outlive it.
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", int64(token))).
		Then(clientv3.OpDelete(key), clientv3.OpPut(m.releasedKey(name), strconv.FormatInt(int64(token), 10), clientv3.WithLease(lease))).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: token %d of lock %q: its session has ended", ErrNotHolder, token, name)
	}
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	return nil
}

// holderState is what one linearizable read says about a token.
type holderState struct {
	key     string           // the waiter key whose create revision is the token; "" if none
	lease   clientv3.LeaseID // that key's session
	granted bool             // the key is among the first limit keys and not inside a lock-delay
}

// holder finds the waiter key that token names and whether it holds the
// lock, in one snapshot. A key that holds the lock keeps holding it until
// it is deleted (keys ahead of it can only go away), which is what lets
// fenced writes check only the key's create revision in their transaction.
func (m *Manager) holder(ctx context.Context, name string, token fencing.Token) (holderState, error) {
	q := m.queue(name)
	resp, err := m.cli.Txn(ctx).Then(
		clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithMinCreateRev(int64(token)), clientv3.WithMaxCreateRev(int64(token))),
		clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(int64(token)), clientv3.WithKeysOnly()),
		clientv3.OpGet(m.delayKey(name)),
	).Commit()
	if err != nil {
		return holderState{}, fmt.Errorf("lock: read %q: %w", name, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return holderState{}, nil
	}
	var w waiter
	if err := json.Unmarshal(kvs[0].Value, &w); err != nil {
		return holderState{}, fmt.Errorf("lock: decode %q: %w", kvs[0].Key, err)
	}
	// Granted if the key is among the first Limit keys in queue order: the
	// keys created up to and including it number at most Limit. (Count the
	// keys; etcd's Count ignores the create revision filter.)
	upTo := len(resp.Responses[1].GetResponseRange().Kvs)
	h := holderState{key: string(kvs[0].Key), lease: clientv3.LeaseID(kvs[0].Lease), granted: upTo <= max(w.Limit, 1)}
	if d, ok := decodeDelay(resp.Responses[2].GetResponseRange().Kvs); ok && d.Token == int64(token) && m.now().Before(d.Until) {
		h.granted = false // still sitting out a lock-delay
	}
	return h, nil
}

// ValidateFence reports whether token currently holds the lock: nil if it
// does, ErrStaleToken if not. The check is linearizable.
func (m *Manager) ValidateFence(ctx context.Context, name string, token fencing.Token) error {
	if err := validateName(name); err != nil {
		return err
	}
	if token <= 0 {
		return fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	h, err := m.holder(ctx, name, token)
	if err != nil {
		return err
	}
	if !h.granted {
		return fmt.Errorf("%w: token %d does not hold lock %q", ErrStaleToken, token, name)
	}
	return nil
}

// FencedPut writes value at key in coordd's KV only if token still holds
// the lock, in the same etcd transaction as the check. It returns the
// write's revision, or ErrStaleToken and writes nothing.
func (m *Manager) FencedPut(ctx context.Context, name string, token fencing.Token, key, value string) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	if len(value) > MaxValueBytes {
		return 0, fmt.Errorf("%w: value is %d bytes, at most %d are allowed", ErrTooLarge, len(value), MaxValueBytes)
	}
	return m.fenced(ctx, name, token, clientv3.OpPut(m.kv+key, value))
}

// FencedDelete deletes key from coordd's KV only if token still holds the
// lock, in the same etcd transaction as the check.
func (m *Manager) FencedDelete(ctx context.Context, name string, token fencing.Token, key string) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	return m.fenced(ctx, name, token, clientv3.OpDelete(m.kv+key))
}

func (m *Manager) fenced(ctx context.Context, name string, token fencing.Token, op clientv3.Op) (int64, error) {
	if err := validateName(name); err != nil {
		return 0, err
	}
	if token <= 0 {
		return 0, fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	h, err := m.holder(ctx, name, token)
	if err != nil {
		return 0, err
	}
	if !h.granted {
		return 0, fmt.Errorf("%w: token %d does not hold lock %q", ErrStaleToken, token, name)
	}
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", int64(token))).
		Then(op).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("lock: fenced write under %q: %w", name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: token %d lost lock %q", ErrStaleToken, token, name)
	}
	return resp.Header.Revision, nil
}

// Get reads a key of coordd's KV (for checking fenced writes).
func (m *Manager) Get(ctx context.Context, key string) (value string, modRev int64, found bool, err error) {
	if err := validateKey(key); err != nil {
		return "", 0, false, err
	}
	resp, err := m.cli.Get(ctx, m.kv+key)
	if err != nil {
		return "", 0, false, err
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false, nil
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision, true, nil
}

// Entry is one holder or waiter in a Description.
type Entry struct {
	Session   clientv3.LeaseID
	RequestID string
	Metadata  string
	Token     fencing.Token // create revision of the waiter key
	Enqueued  time.Time
	// Since is when a holder was granted: its enqueue time if it was
	// granted at once, else when its wait ended. Zero for waiters.
	Since time.Time
}

// Description is a lock's state at one revision.
type Description struct {
	Name    string
	Limit   int // 0 when nobody holds or waits
	Holders []Entry
	Waiters []Entry // in grant order
	// DelayedUntil, when not zero, is the end of a lock-delay: the first
	// waiter is granted then (a holder's session expired).
	DelayedUntil time.Time
	Revision     int64
}

// Describe returns the lock's holders and waiters. The read is
// linearizable.
func (m *Manager) Describe(ctx context.Context, name string) (Description, error) {
	if err := validateName(name); err != nil {
		return Description{}, err
	}
	q := m.queue(name)
	tresp, err := m.cli.Txn(ctx).Then(
		clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(m.delayKey(name)),
	).Commit()
	if err != nil {
		return Description{}, fmt.Errorf("lock: describe %q: %w", name, err)
	}
	kvs := tresp.Responses[0].GetResponseRange().Kvs
	d := Description{Name: name, Revision: tresp.Header.Revision}
	if lim, ok := limitOf(kvs); ok {
		d.Limit = lim
	}
	delayed := int64(0)
	if dl, ok := decodeDelay(tresp.Responses[1].GetResponseRange().Kvs); ok && m.now().Before(dl.Until) {
		d.DelayedUntil, delayed = dl.Until, dl.Token
	}
	for i, kv := range kvs {
		var w waiter
		if err := json.Unmarshal(kv.Value, &w); err != nil {
			return Description{}, fmt.Errorf("lock: decode %q: %w", kv.Key, err)
		}
		e := Entry{Session: clientv3.LeaseID(kv.Lease), RequestID: w.RequestID, Metadata: w.Metadata, Token: fencing.Token(kv.CreateRevision), Enqueued: w.Enqueued}
		if i < d.Limit && kv.CreateRevision != delayed {
			e.Since = w.Enqueued
			if !w.Granted.IsZero() {
				e.Since = w.Granted
			}
			d.Holders = append(d.Holders, e)
		} else {
			d.Waiters = append(d.Waiters, e)
		}
	}
	return d, nil
}

// List returns the names of locks that have holders or waiters and start
// with prefix, at most limit of them, starting after the name after (""
// for the first page). The order is stable, so pages do not overlap.
func (m *Manager) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if prefix != "" {
		if err := validateName(prefix); err != nil {
			return nil, err
		}
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", ErrInvalid, limit)
	}
	from := m.locks + escape(prefix)
	if after != "" {
		// Skip every key of lock `after`: its subtree ends before after+"/\xff".
		from = m.locks + escape(after) + "/\xff"
	}
	end := clientv3.GetPrefixRangeEnd(m.locks + escape(prefix))
	var names []string
	for len(names) < limit {
		resp, err := m.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)*4))
		if err != nil {
			return nil, fmt.Errorf("lock: list: %w", err)
		}
		for _, kv := range resp.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), m.locks)
			esc, sub, ok := strings.Cut(rest, "/")
			if !ok || !strings.HasPrefix(sub, "q/") {
				continue // release and delay markers do not make a lock busy
			}
			if n := unescape(esc); len(names) == 0 || names[len(names)-1] != n {
				names = append(names, n)
				if len(names) == limit {
					break
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return names, nil
}

func limitOf(kvs []*mvccpb.KeyValue) (int, bool) {
	if len(kvs) == 0 {
		return 0, false
	}
	var w waiter
	if json.Unmarshal(kvs[0].Value, &w) != nil || w.Limit <= 0 {
		return 1, true
	}
	return w.Limit, true
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
