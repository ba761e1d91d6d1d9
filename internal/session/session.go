package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
)

// TTL bounds. MinTTL keeps keep-alive traffic sane and stays above etcd's own
// minimum lease TTL (about 1.5 election timeouts at etcd's defaults); MaxTTL
// bounds how long a crashed holder can block others.
const (
	MinTTL = 2 * time.Second
	MaxTTL = time.Hour
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrNotFound is returned by Get, KeepAlive and Close when the session
	// does not exist: never created, closed, or expired.
	ErrNotFound = errkind.SessionNotFound.New("session: not found")
	// ErrInvalid is returned by every call given a malformed or out-of-bounds
	// argument (TTL, id, owner, labels). Nothing is changed.
	ErrInvalid = errkind.Invalid.New("session: invalid argument")
	// ErrTooLarge is returned by Create when the owner, hostname or labels
	// exceed their size limits. Nothing is changed.
	ErrTooLarge = errkind.TooLarge.New("session: value too large")
	// ErrQuota is returned by Create when the session's principal already
	// holds as many live sessions as LimitPerPrincipal allows.
	ErrQuota = errkind.QuotaExceeded.New("session: quota exceeded")
)

// ID identifies a session. It is the id of the session's etcd lease, written
// as 16 lower-case hexadecimal digits.
type ID int64

// String returns the id as 16 lower-case hexadecimal digits.
func (id ID) String() string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i, u := 15, uint64(id); i >= 0; i, u = i-1, u>>4 {
		b[i] = digits[u&0xf]
	}
	return string(b[:])
}

// Hint names an entry a session made under a lock or election name (an
// acquisition, a campaign) by the session and the request id that made it.
// A release or resignation given one goes straight to the entry's key
// instead of reading the queue to find it; a wrong hint only makes it fail
// (see lock.Manager.Release and election.Manager.Resign).
type Hint struct {
	Session   ID
	RequestID string
}

// ParseID parses an id written as 1 to 16 hexadecimal digits. It returns an
// error wrapping ErrInvalid for anything else, including zero.
func ParseID(s string) (ID, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: session id is required", ErrInvalid)
	}
	if len(s) > 16 {
		return 0, fmt.Errorf("%w: session id %.20q is not 1 to 16 hexadecimal digits", ErrInvalid, s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v == 0 || v > 1<<63-1 {
		return 0, fmt.Errorf("%w: session id %q is not a valid session id (1 to 16 hexadecimal digits)", ErrInvalid, s)
	}
	return ID(v), nil
}

// Spec describes a session to create.
type Spec struct {
	TTL      time.Duration     // Required; MinTTL..MaxTTL, rounded up to a whole second.
	Owner    string            // Optional; at most MaxOwnerBytes of UTF-8.
	Hostname string            // Optional; at most MaxHostnameBytes of UTF-8.
	Labels   map[string]string // Optional; see ValidateSpec for limits.
	// Principal is the authenticated caller that creates it (empty without
	// authentication); it owns the session.
	Principal string
}

// Info describes a live session.
type Info struct {
	ID        ID
	TTL       time.Duration // granted TTL
	Owner     string
	Hostname  string
	Labels    map[string]string
	Principal string // who owns it (see Spec.Principal)
	Created   time.Time
	// Remaining is the TTL left before expiry, truncated to whole seconds
	// as etcd reports it (0 means under a second). Only Get fills it.
	Remaining time.Duration
	// Keys are the etcd keys attached to the session's lease (its own
	// record, its lock and election entries), as etcd lists them at the
	// read. Only Get fills it.
	Keys []string
}

// record is the JSON stored under a session's key.
type record struct {
	TTLSeconds int64             `json:"ttl_seconds"`
	Owner      string            `json:"owner,omitempty"`
	Hostname   string            `json:"hostname,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Principal  string            `json:"principal,omitempty"`
	Created    time.Time         `json:"created"`
	// EndedBy names the member whose Clock ended the session; the record
	// stays until that member revokes the lease (a moment). A record with
	// it is a session that has ended.
	EndedBy string `json:"ended_by,omitempty"`
}

// Manager creates, renews, lists and closes sessions. It is safe for
// concurrent use.
type Manager struct {
	cli    *clientv3.Client
	prefix string // "<root>session/"
	owners string // "<root>session-owners/": one key per session of a principal
	now    func() time.Time
	renew  Renewer
	clock  *Clock
	// perPrincipal bounds each principal's live sessions; 0 is no bound.
	perPrincipal int
}

// Renewer renews the lease id once and returns its granted TTL in
// seconds, or an error; a lease that does not exist is rpctypes'
// ErrLeaseNotFound (or one that errors.Is it).
type Renewer func(ctx context.Context, id clientv3.LeaseID) (int64, error)

// RenewWith makes KeepAlive renew through r instead of a keep-alive
// stream of the etcd client (for the embedded member: its own lessor, or
// its etcd leader's, without a stream per renewal). Call it before use.
func (m *Manager) RenewWith(r Renewer) { m.renew = r }

// UseClock makes the sessions' time coordd's own (see Clock): Create
// gives the etcd lease Clock.BackstopTTL, KeepAlive renews through c, Get
// reports c's remaining time. Without it a session's time is its etcd
// lease's, with etcd's flaws (package doc). Call it before use.
func (m *Manager) UseClock(c *Clock) { m.clock = c }

// keepAliveOnce renews a lease with one keep-alive of cli.
func keepAliveOnce(cli *clientv3.Client) Renewer {
	return func(ctx context.Context, id clientv3.LeaseID) (int64, error) {
		resp, err := cli.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return resp.TTL, nil
	}
}

// NewManager returns a Manager that keeps session metadata under
// root+"session/". root is coordd's key root, for example "/coordd/".
func NewManager(cli *clientv3.Client, root string) *Manager {
	return &Manager{cli: cli, prefix: root + "session/", owners: root + "session-owners/", now: time.Now}
}

// LimitPerPrincipal makes Create refuse, with ErrQuota, a session for a
// principal that already holds n live sessions in the cluster (0: no
// limit). Sessions created without a principal are not counted. Each
// session of a principal then carries one more key, bound to its lease,
// so counting costs a read of that principal's keys only. Creations
// racing on several members may exceed n by as many as race.
func (m *Manager) LimitPerPrincipal(n int) { m.perPrincipal = n }

// ownersPrefix is where a principal's sessions are counted: its name is
// hashed, so any name makes one flat key.
func (m *Manager) ownersPrefix(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return m.owners + hex.EncodeToString(sum[:16]) + "/"
}

func (m *Manager) key(id ID) string { return m.prefix + id.String() }

// Create grants a lease of spec.TTL (rounded up to a whole second) and stores
// the session's metadata bound to it. It costs two etcd commits.
func (m *Manager) Create(ctx context.Context, spec Spec) (Info, error) {
	ttl, err := ValidateSpec(spec)
	if err != nil {
		return Info{}, err
	}
	counted := m.perPrincipal > 0 && spec.Principal != ""
	if counted {
		resp, err := m.cli.Get(ctx, m.ownersPrefix(spec.Principal), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return Info{}, fmt.Errorf("session: count %s's sessions: %w", spec.Principal, err)
		}
		if resp.Count >= int64(m.perPrincipal) {
			return Info{}, fmt.Errorf("%w: principal %s holds %d live sessions, the most it may (--max-sessions-per-principal); close some, or let them expire", ErrQuota, spec.Principal, resp.Count)
		}
	}
	secs := int64(ttl / time.Second)
	leaseTTL := secs
	if m.clock != nil {
		leaseTTL = int64(m.clock.BackstopTTL(ttl) / time.Second)
	}
	lease, err := m.cli.Grant(ctx, leaseTTL)
	if err != nil {
		return Info{}, fmt.Errorf("session: grant lease: %w", err)
	}
	if m.clock == nil {
		secs = lease.TTL // what etcd granted (at least its minimum)
	}
	info := Info{
		ID:       ID(lease.ID),
		TTL:      time.Duration(secs) * time.Second,
		Owner:    spec.Owner,
		Hostname: spec.Hostname,
		Labels:   spec.Labels,
		Created:  m.now().UTC().Truncate(time.Millisecond),

		Principal: spec.Principal,
	}
	val, err := json.Marshal(record{TTLSeconds: secs, Owner: info.Owner, Hostname: info.Hostname, Labels: info.Labels, Principal: info.Principal, Created: info.Created})
	if err != nil {
		return Info{}, fmt.Errorf("session: encode metadata: %w", err)
	}
	ops := []clientv3.Op{clientv3.OpPut(m.key(info.ID), string(val), clientv3.WithLease(lease.ID))}
	if counted {
		ops = append(ops, clientv3.OpPut(m.ownersPrefix(spec.Principal)+info.ID.String(), "", clientv3.WithLease(lease.ID)))
	}
	if _, err := m.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		// Do not leave a lease without metadata behind; it would expire on
		// its own, but nobody could see or close it by id in the meantime.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = m.cli.Revoke(cctx, lease.ID)
		return Info{}, fmt.Errorf("session: store metadata: %w", err)
	}
	return info, nil
}

// KeepAlive renews the session once and returns its granted TTL, counted
// from now. It returns ErrNotFound when the session has ended.
func (m *Manager) KeepAlive(ctx context.Context, id ID) (time.Duration, error) {
	if m.clock != nil {
		ttls, errs, err := m.clock.Renew(ctx, []ID{id})
		if err != nil {
			return 0, fmt.Errorf("session: keep-alive %s: %w", id, err)
		}
		return ttls[0], errs[0]
	}
	renew := m.renew
	if renew == nil {
		renew = keepAliveOnce(m.cli)
	}
	ttl, err := renew(ctx, clientv3.LeaseID(id))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return 0, fmt.Errorf("session: keep-alive %s: %w", id, err)
	}
	return time.Duration(ttl) * time.Second, nil
}

// KeepAliveAll renews the sessions ids at once: with a Clock, in one
// write. It returns each one's TTL or error (wrapping ErrNotFound for a
// session that has ended); err instead when none could be renewed.
func (m *Manager) KeepAliveAll(ctx context.Context, ids []ID) (ttls []time.Duration, errs []error, err error) {
	if m.clock != nil {
		ttls, errs, err = m.clock.Renew(ctx, ids)
		if err != nil {
			return nil, nil, fmt.Errorf("session: keep-alive: %w", err)
		}
		return ttls, errs, nil
	}
	ttls, errs = make([]time.Duration, len(ids)), make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { ttls[i], errs[i] = m.KeepAlive(ctx, id) })
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil && !errors.Is(e, ErrNotFound) {
			return nil, nil, e
		}
	}
	return ttls, errs, nil
}

// Get returns a live session with its remaining TTL. It returns ErrNotFound
// when the session has ended. The read is linearizable.
func (m *Manager) Get(ctx context.Context, id ID) (Info, error) {
	resp, err := m.cli.Get(ctx, m.key(id))
	if err != nil {
		return Info{}, fmt.Errorf("session: get %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	info, err := decode(id, resp.Kvs[0].Value)
	if err != nil {
		return Info{}, err
	}
	return m.Detail(ctx, info)
}

// Records reads the records (owner, hostname, labels; not Remaining nor
// Keys) of the sessions ids that exist, in one etcd transaction per 100
// of them: what names the holders and waiters of a page of a lock. A
// session that does not exist is left out.
func (m *Manager) Records(ctx context.Context, ids []ID) (map[ID]Info, error) {
	out := make(map[ID]Info, len(ids))
	for chunk := range slices.Chunk(ids, 100) {
		ops := make([]clientv3.Op, len(chunk))
		for i, id := range chunk {
			ops[i] = clientv3.OpGet(m.key(id))
		}
		resp, err := m.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("session: get records: %w", err)
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				if info, err := decode(chunk[i], kvs[0].Value); err == nil {
					out[chunk[i]] = info
				}
			}
		}
	}
	return out, nil
}

// Detail fills in a listed session's Remaining and Keys, with one read of
// its lease. A session that ended since fails with ErrNotFound.
func (m *Manager) Detail(ctx context.Context, info Info) (Info, error) {
	id := info.ID
	ttl, err := m.cli.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
	if err != nil {
		return Info{}, fmt.Errorf("session: time to live of %s: %w", id, err)
	}
	// etcd reports -1 for a lease that is gone, and truncates the remaining
	// time to whole seconds, so 0 means "alive, under a second left".
	if ttl.TTL < 0 {
		return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	info.Remaining = time.Duration(ttl.TTL) * time.Second
	if m.clock != nil {
		// The lease is the backstop; the session's time is the clock's.
		info.Remaining = min(info.Remaining, info.TTL)
		if left, ok := m.clock.Remaining(id); ok {
			info.Remaining = left.Truncate(time.Second)
		}
	}
	for _, k := range ttl.Keys {
		info.Keys = append(info.Keys, string(k))
	}
	return info, nil
}

// List returns up to limit live sessions with ids greater than after, in id
// order, and whether more follow. Remaining is not filled. The read is
// linearizable.
func (m *Manager) List(ctx context.Context, after ID, limit int) ([]Info, bool, error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("%w: list limit %d is not positive", ErrInvalid, limit)
	}
	from := m.prefix
	if after > 0 {
		from = m.key(after) + "\x00"
	}
	resp, err := m.cli.Get(ctx, from,
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(m.prefix)),
		clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, false, fmt.Errorf("session: list: %w", err)
	}
	out := make([]Info, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		id, err := ParseID(string(kv.Key[len(m.prefix):]))
		if err != nil {
			return nil, false, fmt.Errorf("session: list: unexpected key %q", kv.Key)
		}
		info, err := decode(id, kv.Value)
		if errors.Is(err, ErrNotFound) {
			continue // ended a moment ago
		}
		if err != nil {
			return nil, false, err
		}
		out = append(out, info)
	}
	return out, resp.More, nil
}

// Close revokes the session's lease: its metadata and every key attached to
// it (lock holders, waiters, candidacies) are deleted in the same etcd
// operation. It returns ErrNotFound when the session had already ended.
func (m *Manager) Close(ctx context.Context, id ID) error {
	if _, err := m.cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return fmt.Errorf("session: close %s: %w", id, err)
	}
	return nil
}

func decode(id ID, val []byte) (Info, error) {
	var r record
	if err := json.Unmarshal(val, &r); err != nil {
		return Info{}, fmt.Errorf("session: decode metadata of %s: %w", id, err)
	}
	if r.EndedBy != "" {
		return Info{}, fmt.Errorf("%w: %s (ended)", ErrNotFound, id)
	}
	return Info{
		ID:       id,
		TTL:      time.Duration(r.TTLSeconds) * time.Second,
		Owner:    r.Owner,
		Hostname: r.Hostname,
		Labels:   r.Labels,
		Created:  r.Created,

		Principal: r.Principal,
	}, nil
}

// Count counts the live sessions, from the local member (a serializable
// read: it may trail the cluster by a moment).
func (m *Manager) Count(ctx context.Context) (int64, error) {
	resp, err := m.cli.Get(ctx, m.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
	if err != nil {
		return 0, fmt.Errorf("session: count: %w", err)
	}
	return resp.Count, nil
}

// Record is what a session's etcd record says of it.
type Record struct {
	Owner     string
	Hostname  string
	Principal string
	// EndedBy names the member whose Clock ended the session for want of
	// renewals; empty while it lives, or when it was closed.
	EndedBy string
}

// RecordPrefix is the key prefix of session records under root: a
// session's record is RecordPrefix(root) + its ID's String.
func RecordPrefix(root string) string { return root + "session/" }

// ParseRecord decodes a session record's key (without RecordPrefix) and
// value. ok is false for anything that is not a session record.
func ParseRecord(key string, value []byte) (id ID, r Record, ok bool) {
	id, err := ParseID(key)
	if err != nil {
		return 0, Record{}, false
	}
	var rec record
	if json.Unmarshal(value, &rec) != nil {
		return 0, Record{}, false
	}
	return id, Record{Owner: rec.Owner, Hostname: rec.Hostname, Principal: rec.Principal, EndedBy: rec.EndedBy}, true
}

// Keys returns the keys bound to the session (its etcd lease): its lock
// entries, candidacies and seats among them. It returns ErrNotFound when
// the session has ended.
func (m *Manager) Keys(ctx context.Context, id ID) ([]string, error) {
	resp, err := m.cli.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
	if err != nil {
		return nil, fmt.Errorf("session: keys of %s: %w", id, err)
	}
	if resp.TTL < 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	keys := make([]string, len(resp.Keys))
	for i, k := range resp.Keys {
		keys[i] = string(k)
	}
	return keys, nil
}
