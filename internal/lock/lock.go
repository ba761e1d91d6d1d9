package lock

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/kv"
	"github.com/coordd/coordd/internal/session"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed or out-of-bounds argument; nothing changed.
	ErrInvalid = errkind.Invalid.New("lock: invalid argument")
	// ErrTooLarge: metadata or a fenced value over its size limit; nothing changed.
	ErrTooLarge = errkind.TooLarge.New("lock: value too large")
	// ErrHeld: TryAcquire found the lock held (all permits taken) or in a
	// lock-delay; or Acquire would wait behind its own session's grant.
	ErrHeld = errkind.Held.New("lock: held")
	// ErrNotHolder: Release was given a token that holds nothing now.
	ErrNotHolder = errkind.NotHolder.New("lock: not the holder")
	// ErrStaleToken: a fenced call's token no longer holds the lock.
	ErrStaleToken = errkind.StaleToken.New("lock: stale fencing token")
	// ErrLimitMismatch: Acquire asked for another limit than the lock has.
	ErrLimitMismatch = errkind.LimitMismatch.New("lock: limit differs from the lock's")
	// ErrSessionNotFound: the session does not exist, or ended while its
	// acquire waited.
	ErrSessionNotFound = errkind.SessionNotFound.New("lock: session not found")
)

// Limits.
const (
	MaxNameBytes      = names.MaxName
	MaxRequestIDBytes = names.MaxRequestID
	MaxMetadataBytes  = 1024
	MaxLimit          = 1024
	MaxKeyBytes       = kv.MaxKeyBytes
	MaxValueBytes     = 512 << 10
	MaxLockDelay      = time.Minute
)

// Manager runs lock operations. It is safe for concurrent use.
type Manager struct {
	cli   *clientv3.Client
	locks string // "<root>lock/"
	kv    string // "<root>kv/"
	now   func() time.Time
	dels  *grantwatch.Watcher // wakes waiters
	waits *queue.Waiters      // waiters on this member, woken by dels
	txns  *groupcommit.Committer

	bg  queue.Background // background writes (grant times, clean-ups)
	ids queue.IDs        // request ids made up for callers that named none

	beforeEnqueue func() // tests: runs before each enqueue transaction
	beforeWait    func() // tests: runs before an acquisition registers its wait
	// joinsBehind counts the enqueues that the member's view of a crowded
	// queue served (see behindTxn).
	joinsBehind atomic.Int64
}

// NewManager returns a Manager that keeps locks under root+"lock/" and
// fenced keys under root+"kv/". Waiters learn of the deletions ahead of
// them from w, which must watch root+"lock/" and run (grantwatch.Run)
// while the Manager is used: however many wait, no etcd watch is opened
// per waiter. Acquisitions and releases go through c, which batches them
// with other changes (see groupcommit; nil: each commits alone).
func NewManager(cli *clientv3.Client, root string, w *grantwatch.Watcher, c *groupcommit.Committer) *Manager {
	if c == nil {
		c = groupcommit.Direct(cli)
	}
	// Readers wait only for writers; a waiter hears of a holder that
	// went away only if it asked for a lock-delay.
	waits := queue.NewWaiters(cli, w, queue.WaitersOptions{Exclusive: isWriter, Notable: func(kv *mvccpb.KeyValue) bool { return delayOf(kv.Value) > 0 }})
	return &Manager{cli: cli, locks: root + "lock/", kv: root + "kv/", now: time.Now, dels: w, waits: waits, txns: c}
}

// Close cancels background writes (grant times, clean-ups of failed
// acquisitions), waits for them to return and starts no new ones. An entry
// whose clean-up is cancelled stays until its session ends. Call it once no
// calls are in flight, before closing the etcd client.
func (m *Manager) Close() { m.bg.Close() }

// Request asks for a lock.
type Request struct {
	Name    string
	Session session.ID // the waiter's session; required
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
	// Read asks for a shared (read) grant of a mutex (Limit 1): readers
	// hold it together, a writer (any request without Read) alone. The
	// queue stays FIFO across modes: a reader waits for every writer
	// queued before it, and a queued writer keeps later readers out.
	Read bool
}

// Grant is a held lock.
type Grant struct {
	Name      string
	Token     fencing.Token // the waiter key's create revision
	Key       string        // the waiter key in etcd
	Revision  int64         // the etcd revision at which the grant was observed
	Session   session.ID
	RequestID string
	// DelayWaited is how long this grant sat out a lock-delay (0 if none).
	DelayWaited time.Duration
	// Read marks a shared (read) grant: others may hold read grants at
	// the same time; fenced writes need a write grant.
	Read bool
}

// waiter is the JSON stored in a waiter key.
type waiter struct {
	// Attempt changes with every Acquire call that enqueues or resumes
	// this entry, so a failed call removes the entry only if no later
	// call (an idempotent retry) has taken it over.
	Attempt   string    `json:"attempt"`
	Limit     int       `json:"limit"`
	LockDelay string    `json:"lock_delay,omitempty"` // a time.Duration
	RequestID string    `json:"request_id"`
	Metadata  string    `json:"metadata,omitempty"`
	Enqueued  time.Time `json:"enqueued"`
	Granted   time.Time `json:"granted,omitzero"` // set after a grant that had to wait
	Read      bool      `json:"read,omitempty"`   // a shared (read) entry
}

// isReader reports whether a queue entry asks for a read grant.
func isReader(kv *mvccpb.KeyValue) bool {
	var w waiter
	return json.Unmarshal(kv.Value, &w) == nil && w.Read
}

// isWriter reports whether a queue entry asks for an exclusive grant: it
// blocks every entry behind it, readers included.
func isWriter(kv *mvccpb.KeyValue) bool { return !isReader(kv) }

// granted is how many entries at the head of a queue (in queue order) hold
// the lock: the first limit of a semaphore; of a mutex, a writer alone, or
// the readers before the first writer.
func granted(kvs []*mvccpb.KeyValue, limit int) int {
	return HeldOf(len(kvs), limit, func(i int) bool { return isReader(kvs[i]) })
}

// HeldOf is how many of n entries at the head of a lock's queue (in queue
// order) hold it, given the limit its head states (0 or less: a mutex) and
// which of them ask for a read grant (a running lock-delay is not taken
// into account). Package history derives grants from it.
func HeldOf(n, limit int, reader func(i int) bool) int {
	if limit > 1 || n == 0 {
		return min(max(limit, 1), n)
	}
	held := 0
	for i := range n {
		if !reader(i) {
			if held == 0 {
				return 1 // a writer at the head
			}
			break
		}
		held++
	}
	return held
}

func (m *Manager) queue(name string) string { return m.locks + escape(name) + "/q/" }

func (m *Manager) waiterKey(name string, sess session.ID, requestID string) string {
	return fmt.Sprintf("%s%016x/%s", m.queue(name), uint64(sess), requestID)
}

// EntryKey is the etcd key of the queue entry with which session sess
// holds (or waits for) the named lock under request id requestID; the
// entry's create revision is its grant's token. It is what a holder's
// server-side watch (package grantwatch) watches. It fails with ErrInvalid
// for a bad name or request id.
func (m *Manager) EntryKey(name string, sess session.ID, requestID string) (string, error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	if err := validateRequestID(requestID); err != nil {
		return "", err
	}
	return m.waiterKey(name, sess, requestID), nil
}

// Release gives up the grant that token names. It returns ErrNotHolder if
// that grant no longer exists (released, or its session ended): a late or
// retried release never removes a newer holder.
//
// hint, when it names a session and a request id, names the grant's key;
// it saves the read that finds it. A hint that names only a session makes
// the release remove the grant only if it belongs to that session. A
// wrong hint only makes the release fail with ErrNotHolder: it never
// removes another session's grant.
func (m *Manager) Release(ctx context.Context, name string, token fencing.Token, hint session.Hint) error {
	_, err := m.release(ctx, name, token, hint, false)
	return err
}

// ReleaseAt is Release (ReleaseRevoked when revoked) that also returns the
// etcd revision of the release's commit, at which the grant history
// records it (history.Query.MinRevision).
func (m *Manager) ReleaseAt(ctx context.Context, name string, token fencing.Token, hint session.Hint, revoked bool) (int64, error) {
	if revoked && hint.Session == 0 {
		return 0, fmt.Errorf("%w: a release that answers a revocation names the holder's session", ErrInvalid)
	}
	return m.release(ctx, name, token, hint, revoked)
}

// ReleaseRevoked is the holder's Release (hint names its session) in
// answer to a revocation (see Revoke) that asked it to let go: the
// revocation is recorded as acknowledged, in the same commit.
func (m *Manager) ReleaseRevoked(ctx context.Context, name string, token fencing.Token, hint session.Hint) error {
	_, err := m.ReleaseAt(ctx, name, token, hint, true)
	return err
}

func (m *Manager) release(ctx context.Context, name string, token fencing.Token, hint session.Hint, revoked bool) (int64, error) {
	if err := validateName(name); err != nil {
		return 0, err
	}
	if token <= 0 {
		return 0, fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	key := ""
	if hint.Session > 0 && hint.RequestID != "" {
		if err := validateRequestID(hint.RequestID); err != nil {
			return 0, err
		}
		key = m.waiterKey(name, hint.Session, hint.RequestID)
	} else if f, ok := m.waits.Find(m.queue(name), int64(token)); ok {
		// This member's mirror of a crowded queue names the key in
		// O(log n); the transaction below checks it still holds.
		if f.KV == nil {
			return 0, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
		}
		if hint.Session > 0 && session.ID(f.KV.Lease) != hint.Session {
			return 0, fmt.Errorf("%w: token %d of lock %q is not a grant of session %s", ErrNotHolder, token, name, hint.Session)
		}
		key = string(f.KV.Key)
	} else {
		h, err := m.holder(ctx, name, token)
		if err != nil {
			return 0, err
		}
		if hint.Session > 0 && h.session != hint.Session {
			return 0, fmt.Errorf("%w: token %d of lock %q is not a grant of session %s", ErrNotHolder, token, name, hint.Session)
		}
		key = h.key
	}
	if key == "" {
		return 0, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	// Deleting the holder's lock-delay record (if it has one) in the same
	// transaction marks this as a clean release: no lock-delay follows.
	resp, err := m.txns.Commit(ctx, groupcommit.Txn{
		Name: m.queue(name),
		If:   []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", int64(token))},
		// A revocation mark (a release from outside asked the holder to let
		// go) goes with it: this release is the holder's answer.
		Then: append([]clientv3.Op{clientv3.OpDelete(key), clientv3.OpDelete(m.heldPrefix(name) + strconv.FormatInt(int64(token), 10)),
			clientv3.OpDelete(m.markKey(name, token))}, m.acknowledged(name, token, hint, revoked)...),
	})
	if err != nil {
		return 0, fmt.Errorf("lock: release %q: %w", name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	m.ids.Released(key)
	return resp.Header.Revision, nil
}

// holderState is what one linearizable read says about a token.
type holderState struct {
	key     string     // the waiter key whose create revision is the token; "" if none
	session session.ID // the session whose lease the key is bound to
	granted bool       // the key is among the first limit keys and not inside a lock-delay
	read    bool       // a shared (read) grant or wait
}

// holder finds the waiter key that token names and whether it holds the
// lock, in one snapshot. A key that holds the lock keeps holding it until
// it is deleted (keys ahead of it can only go away), which is what lets
// fenced writes check only the key's create revision in their transaction.
func (m *Manager) holder(ctx context.Context, name string, token fencing.Token) (holderState, error) {
	if h, ok, err := m.holderFromMirror(ctx, name, token); ok || err != nil {
		return h, err
	}
	kv, place, extra, err := queue.Position(ctx, m.cli, m.queue(name), int64(token), clientv3.OpGet(m.delayKey(name)))
	if err != nil {
		return holderState{}, fmt.Errorf("lock: read %q: %w", name, err)
	}
	if kv == nil {
		return holderState{}, nil
	}
	var w waiter
	if err := json.Unmarshal(kv.Value, &w); err != nil {
		return holderState{}, fmt.Errorf("lock: decode %q: %w", kv.Key, err)
	}
	// Granted if the key is among the first Limit keys in queue order; a
	// reader, if no writer is ahead of it.
	h := holderState{key: string(kv.Key), session: session.ID(kv.Lease), granted: place <= max(w.Limit, 1), read: w.Read}
	if w.Read && !h.granted {
		// Read after the snapshot: entries only join behind, and writers
		// ahead only leave, so a reader granted now stays granted.
		ahead, err := m.cli.Get(ctx, m.queue(name), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(int64(token)-1))
		if err != nil {
			return holderState{}, fmt.Errorf("lock: read %q: %w", name, err)
		}
		h.granted = !slices.ContainsFunc(ahead.Kvs, isWriter)
	}
	if d, ok := decodeDelay(extra[0].GetResponseRange().Kvs); ok && d.Token == int64(token) && m.now().Before(d.Until) {
		h.granted = false // still sitting out a lock-delay
	}
	return h, nil
}

// holderFromMirror is holder answered from this member's mirror of the
// queue, when it keeps one that has seen token's entry and says it holds
// (ok false otherwise: read etcd). One transaction of point operations
// checks that the entry still exists and reads the lock-delay: O(log n)
// however long the queue. A grant keeps holding until its entry is
// deleted, and a deleted entry never comes back, so what the mirror saw at
// its revision is still true of an entry that exists now.
func (m *Manager) holderFromMirror(ctx context.Context, name string, token fencing.Token) (holderState, bool, error) {
	f, ok := m.waits.Find(m.queue(name), int64(token))
	if !ok {
		return holderState{}, false, nil
	}
	if f.KV == nil {
		return holderState{}, true, nil // deleted: it never comes back
	}
	var w waiter
	if json.Unmarshal(f.KV.Value, &w) != nil || max(w.Limit, 1) != f.Limit || !f.Turn {
		return holderState{}, false, nil // not granted then: it may be now
	}
	key := string(f.KV.Key)
	resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", int64(token))).Then(clientv3.OpGet(m.delayKey(name))).Commit()
	if err != nil {
		return holderState{}, true, fmt.Errorf("lock: read %q: %w", name, err)
	}
	if !resp.Succeeded {
		return holderState{}, true, nil
	}
	h := holderState{key: key, session: session.ID(f.KV.Lease), granted: true, read: w.Read}
	if d, ok := decodeDelay(resp.Responses[0].GetResponseRange().Kvs); ok && d.Token == int64(token) && m.now().Before(d.Until) {
		h.granted = false // still sitting out a lock-delay
	}
	return h, true, nil
}

// GrantSession returns the session that owns the grant (or the waiting
// entry) token names, read linearizably. It returns ErrNotHolder when
// there is none.
func (m *Manager) GrantSession(ctx context.Context, name string, token fencing.Token) (session.ID, error) {
	if f, ok := m.waits.Find(m.queue(name), int64(token)); ok {
		if f.KV != nil {
			// Seen by this member's mirror: check that it still exists.
			resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(string(f.KV.Key)), "=", int64(token))).Commit()
			if err != nil {
				return 0, fmt.Errorf("lock: read %q: %w", name, err)
			}
			if resp.Succeeded {
				return session.ID(f.KV.Lease), nil
			}
		}
		return 0, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	kv, _, _, err := queue.Position(ctx, m.cli, m.queue(name), int64(token))
	if err != nil {
		return 0, fmt.Errorf("lock: read %q: %w", name, err)
	}
	if kv == nil {
		return 0, fmt.Errorf("%w: token %d of lock %q holds nothing", ErrNotHolder, token, name)
	}
	return session.ID(kv.Lease), nil
}

// A Grantor is what grants the fencing tokens a fenced write names: a
// lock (Manager) or an election's leadership (election.Manager). Holding checks, linearizably,
// that token holds name now and returns an etcd comparison that stays true
// exactly as long as it keeps holding it, for a write's own transaction.
// A token that does not hold name fails with an error wrapping the
// implementation's stale-token sentinel.
type Grantor interface {
	Holding(ctx context.Context, name string, token fencing.Token) (clientv3.Cmp, error)
}

// ValidateFence reports whether token currently holds the lock: nil if it
// does, ErrStaleToken if not. The check is linearizable.
func (m *Manager) ValidateFence(ctx context.Context, name string, token fencing.Token) error {
	_, err := m.Holding(ctx, name, token)
	return err
}

// Holding implements Fence for locks. A grant that holds the lock keeps
// holding it until its waiter key is deleted (keys ahead of it can only go
// away), so the comparison is on the key's create revision alone.
func (m *Manager) Holding(ctx context.Context, name string, token fencing.Token) (clientv3.Cmp, error) {
	return m.holding(ctx, name, token, false)
}

// holding is Holding; with write set, a read grant is refused
// (ErrNotHolder): fenced writes under a lock need a write grant.
func (m *Manager) holding(ctx context.Context, name string, token fencing.Token, write bool) (clientv3.Cmp, error) {
	if err := validateName(name); err != nil {
		return clientv3.Cmp{}, err
	}
	if token <= 0 {
		return clientv3.Cmp{}, fmt.Errorf("%w: token must be positive", ErrInvalid)
	}
	h, err := m.holder(ctx, name, token)
	if err != nil {
		return clientv3.Cmp{}, err
	}
	if !h.granted {
		return clientv3.Cmp{}, fmt.Errorf("%w: token %d does not hold lock %q", ErrStaleToken, token, name)
	}
	if write && h.read {
		return clientv3.Cmp{}, fmt.Errorf("%w: token %d is a read grant of lock %q; a fenced write needs a write grant", ErrNotHolder, token, name)
	}
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", int64(token)), nil
}

// FencedPut writes value at key in coordd's KV only if token still holds
// name under f (a lock: pass the Manager itself; or an election), in the
// same etcd transaction as the check. It returns the write's revision, or
// f's stale-token error (ErrStaleToken for locks) and writes nothing.
func (m *Manager) FencedPut(ctx context.Context, f Grantor, name string, token fencing.Token, key, value string) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	if len(value) > MaxValueBytes {
		return 0, fmt.Errorf("%w: value is %d bytes, at most %d are allowed", ErrTooLarge, len(value), MaxValueBytes)
	}
	return m.fenced(ctx, f, name, token, clientv3.OpPut(m.kv+key, value))
}

// FencedDelete deletes key from coordd's KV only if token still holds name
// under f, in the same etcd transaction as the check.
func (m *Manager) FencedDelete(ctx context.Context, f Grantor, name string, token fencing.Token, key string) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	return m.fenced(ctx, f, name, token, clientv3.OpDelete(m.kv+key))
}

func (m *Manager) fenced(ctx context.Context, f Grantor, name string, token fencing.Token, op clientv3.Op) (int64, error) {
	holding := f.Holding
	if f == Grantor(m) {
		holding = func(ctx context.Context, name string, token fencing.Token) (clientv3.Cmp, error) {
			return m.holding(ctx, name, token, true)
		}
	}
	cmp, err := holding(ctx, name, token)
	if err != nil {
		return 0, err
	}
	// Holding is checked again in the write's own transaction: the grant may
	// have ended since the read above.
	resp, err := m.cli.Txn(ctx).If(cmp).Then(op).Commit()
	if err != nil {
		return 0, fmt.Errorf("lock: fenced write under %q: %w", name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: token %d lost %q", ErrStaleToken, token, name)
	}
	return resp.Header.Revision, nil
}

// Entry is one holder or waiter in a Description.
type Entry struct {
	Session   session.ID
	RequestID string
	Metadata  string
	Token     fencing.Token // create revision of the waiter key
	Enqueued  time.Time
	// Since is when a holder was granted: its enqueue time if it was
	// granted at once, else when its wait ended. Zero for waiters.
	Since time.Time
	Read  bool // a shared (read) grant or wait
	// RevokingSince and RevokingUntil, on a holder, say that a release
	// from outside asked it to let go, when, and when the grant ends if
	// it has not by then (see Revoke). Zero otherwise.
	RevokingSince, RevokingUntil time.Time
}

// Description is a lock's state at one revision.
type Description struct {
	Name    string
	Limit   int // 0 when nobody holds or waits
	Holders []Entry
	Waiters []Entry // in grant order
	// Holding and Waiting count the lock's holders and waiters, those of
	// other pages included.
	Holding, Waiting int
	// Next, when not zero, is the Page.After of the next page: more
	// entries follow this page's.
	Next fencing.Token
	// DelayedUntil, when not zero, is the end of a lock-delay: the first
	// waiter is granted then (a holder's session expired).
	DelayedUntil time.Time
	Revision     int64
}

// Page bounds.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Page selects part of a lock's queue: Size entries (holders first, then
// waiters, in queue order) after the entry whose token is After (0: from
// the head). Size 0 means DefaultPageSize.
type Page struct {
	After fencing.Token
	Size  int
}

// Describe returns the lock's holders and all its waiters. The read is
// linearizable. For a crowded lock, DescribePage returns a page of it.
func (m *Manager) Describe(ctx context.Context, name string) (Description, error) {
	return m.describe(ctx, name, Page{}, true)
}

// DescribePage returns the lock's holder and waiter counts and the page p
// of its queue. The read is linearizable. On a member where calls wait
// for the lock (a crowd), it is served from the member's ordered view of
// the queue in O(log n + page size), once that view has caught up with
// the revision the read began at; elsewhere it reads the queue from etcd.
func (m *Manager) DescribePage(ctx context.Context, name string, p Page) (Description, error) {
	if p.Size < 0 || p.Size > MaxPageSize {
		return Description{}, fmt.Errorf("%w: page size %d: 1 to %d entries (0: %d)", ErrInvalid, p.Size, MaxPageSize, DefaultPageSize)
	}
	if p.After < 0 {
		return Description{}, fmt.Errorf("%w: a page starts after a positive token", ErrInvalid)
	}
	if p.Size == 0 {
		p.Size = DefaultPageSize
	}
	return m.describe(ctx, name, p, false)
}

func (m *Manager) describe(ctx context.Context, name string, p Page, all bool) (Description, error) {
	if err := validateName(name); err != nil {
		return Description{}, err
	}
	q := m.queue(name)
	ops := []clientv3.Op{clientv3.OpGet(m.delayKey(name))}
	crowd := m.waits.Viewed(q)
	if !crowd {
		ops = append(ops, clientv3.OpGet(q, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
	}
	// Revocations in progress: one mark per holder at most.
	ops = append(ops, clientv3.OpGet(m.markPrefix(name), clientv3.WithPrefix(), clientv3.WithLimit(MaxLimit)))
	tresp, err := m.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return Description{}, fmt.Errorf("lock: describe %q: %w", name, err)
	}
	d := Description{Name: name, Revision: tresp.Header.Revision}
	delayed := int64(0)
	if dl, ok := decodeDelay(tresp.Responses[0].GetResponseRange().Kvs); ok && m.now().Before(dl.Until) {
		d.DelayedUntil, delayed = dl.Until, dl.Token
	}
	var found []queue.Found
	delayedHolds := false // the delayed entry's turn came: counted as holding
	if crowd {
		size := p.Size + 1
		if all {
			size = math.MaxInt
		}
		pg, ok, err := m.waits.Page(ctx, q, d.Revision, int64(p.After), size)
		if err != nil {
			return Description{}, err
		}
		if !ok { // the view went or is reloading: read etcd
			return m.describe(ctx, name, p, all)
		}
		found, d.Holding, d.Waiting, d.Revision = pg.Entries, pg.Turns, pg.Len-pg.Turns, pg.Pos
		if pg.Len > 0 {
			d.Limit = pg.Limit
		}
		if delayed != 0 {
			f, ok := m.waits.Find(q, delayed)
			delayedHolds = ok && f.KV != nil && f.Turn
		}
	} else {
		kvs := tresp.Responses[1].GetResponseRange().Kvs
		if lim, ok := limitOf(kvs); ok {
			d.Limit = lim
		}
		held := granted(kvs, d.Limit)
		d.Holding, d.Waiting = held, len(kvs)-held
		for i, kv := range kvs {
			delayedHolds = delayedHolds || (kv.CreateRevision == delayed && i < held)
			if kv.CreateRevision > int64(p.After) && (all || len(found) <= p.Size) {
				found = append(found, queue.Found{KV: kv, Turn: i < held})
			}
		}
	}
	if !all && len(found) > p.Size {
		found = found[:p.Size]
		d.Next = fencing.Token(found[len(found)-1].KV.CreateRevision)
	}
	marks := map[int64]revoke.Mark{}
	for _, kv := range tresp.Responses[len(ops)-1].GetResponseRange().Kvs {
		t, err := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), m.markPrefix(name)), 10, 64)
		if mk, ok := revoke.DecodeMark(kv.Value); ok && err == nil {
			marks[t] = mk
		}
	}
	for _, f := range found {
		if err := d.add(f, delayed, marks); err != nil {
			return Description{}, err
		}
	}
	if delayedHolds {
		d.Holding, d.Waiting = d.Holding-1, d.Waiting+1 // its turn came, but it sits out the delay
	}
	return d, nil
}

// add adds f, an entry of d's lock, to its holders or waiters: an entry
// whose turn came holds, unless it sits out the lock-delay (token delayed).
func (d *Description) add(f queue.Found, delayed int64, marks map[int64]revoke.Mark) error {
	kv := f.KV
	var w waiter
	if err := json.Unmarshal(kv.Value, &w); err != nil {
		return fmt.Errorf("lock: decode %q: %w", kv.Key, err)
	}
	e := Entry{Session: session.ID(kv.Lease), RequestID: w.RequestID, Metadata: w.Metadata, Token: fencing.Token(kv.CreateRevision), Enqueued: w.Enqueued, Read: w.Read}
	if f.Turn && kv.CreateRevision != delayed {
		e.Since = w.Enqueued
		if !w.Granted.IsZero() {
			e.Since = w.Granted
		}
		if mk, ok := marks[kv.CreateRevision]; ok {
			e.RevokingSince, e.RevokingUntil = mk.Since, mk.Until
		}
		d.Holders = append(d.Holders, e)
	} else {
		d.Waiters = append(d.Waiters, e)
	}
	return nil
}

// List returns the names of locks that have holders or waiters and start
// with prefix, at most limit of them, starting after the name after (""
// for the first page). The order is stable, so pages do not overlap.
func (m *Manager) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if prefix != "" {
		// A prefix is any start of a name ("reports/", "rep").
		if err := names.CheckKey("lock name prefix", prefix); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
		}
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", ErrInvalid, limit)
	}
	list, err := queue.Names(ctx, m.cli, m.locks, prefix, after, limit)
	if err != nil {
		return nil, fmt.Errorf("lock: list: %w", err)
	}
	return list, nil
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

// Counts are how many locks are held, by how many grants, and how many
// waiters queue behind them, cluster-wide.
type Counts struct {
	Locks   int // locks with at least one holder
	Holders int // grants held (a semaphore may have several)
	Waiters int
}

// Count counts every lock's holders and waiters, from the local member (a
// serializable read: it may trail the cluster by a moment). It reads every
// queue entry: for metrics, not for a request path.
func (m *Manager) Count(ctx context.Context) (Counts, error) {
	st, err := queue.Count(ctx, m.cli, m.locks, func(entries []*mvccpb.KeyValue) int {
		limit, _ := limitOf(entries)
		return granted(entries, limit)
	})
	if err != nil {
		return Counts{}, fmt.Errorf("lock: count: %w", err)
	}
	return Counts{Locks: st.Queues, Holders: st.Holding, Waiters: st.Waiting}, nil
}

// NamesIn returns the names of the locks that the entries among keys belong
// to (a session's attached keys, session.Info.Keys: the locks it
// holds or waits for), sorted and without repeats. Other keys are ignored.
func (m *Manager) NamesIn(keys []string) []string { return queue.NamesIn(m.locks, keys) }
