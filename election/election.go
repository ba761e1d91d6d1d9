package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/base/kind"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/session"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed or out-of-bounds argument; nothing changed.
	ErrInvalid = kind.Invalid.New("election: invalid argument")
	// ErrTooLarge: a value over MaxValueBytes; nothing changed.
	ErrTooLarge = kind.TooLarge.New("election: value too large")
	// ErrSessionNotFound: the session does not exist, or ended while its
	// campaign waited.
	ErrSessionNotFound = kind.SessionNotFound.New("election: session not found")
	// ErrNotLeader: Proclaim or Resign by a term that does not lead.
	ErrNotLeader = kind.NotLeader.New("election: not the leader")
	// ErrNoLeader: nobody leads the election.
	ErrNoLeader = kind.NoLeader.New("election: no leader")
	// ErrStaleTerm: a fenced check's term no longer leads.
	ErrStaleTerm = kind.StaleToken.New("election: stale term")
	// ErrAlreadyLeader: Campaign by a session that already leads the
	// election under another request id; waiting would never end.
	ErrAlreadyLeader = kind.AlreadyLeader.New("election: this session already leads")
)

// errCandidacyNewer: the candidacy of the call's session and request id was
// written after the call began, so it may not be the call's to take over;
// nothing was written, and a retry takes it over if it is (Unavailable).
var errCandidacyNewer = kind.Unavailable.New("election: the campaign's candidacy was written after this call began")

// MaxValueBytes bounds a candidate's value.
const MaxValueBytes = 64 << 10

// Manager runs elections. It is safe for concurrent use.
type Manager struct {
	cli   *clientv3.Client
	root  string // "<root>election/"
	now   func() time.Time
	dels  *grantwatch.Watcher // wakes waiting candidates
	waits *queue.Waiters      // candidates waiting on this member, woken by dels
	txns  *groupcommit.Committer

	bg  queue.Background // background writes (election times, clean-ups)
	ids queue.IDs        // request ids made up for callers that named none

	beforeCampaign func() // tests: runs before each campaign transaction
}

// NewManager returns a Manager that keeps elections under root+"election/".
// Waiting candidates learn of the deletions ahead of them from w, which
// must watch root+"election/" and run (grantwatch.Run) while the Manager
// is used. Campaigns, proclamations and resignations go through c, which
// batches them with other changes (see groupcommit; nil: each commits alone).
func NewManager(cli *clientv3.Client, root string, w *grantwatch.Watcher, c *groupcommit.Committer) *Manager {
	if c == nil {
		c = groupcommit.Direct(cli)
	}
	return &Manager{cli: cli, root: root + "election/", now: time.Now, dels: w, waits: queue.NewWaiters(cli, w, queue.WaitersOptions{}), txns: c}
}

// Close cancels background writes, waits for them and starts no new ones.
// Call it once no calls are in flight, before closing the etcd client.
func (m *Manager) Close() { m.bg.Close() }

// Request is a campaign.
type Request struct {
	Name    string
	Session session.ID // the candidate's session; required
	// Value is what the candidate proclaims once elected (for example its
	// address); at most MaxValueBytes of UTF-8.
	Value string
	// RequestID makes Campaign idempotent: a retry with the same session
	// and request id continues the same candidacy (and keeps its first
	// value). Empty means a fresh id.
	RequestID string
}

// Leadership is a won election.
type Leadership struct {
	Name      string
	Term      fencing.Token // the candidate key's create revision
	Key       string        // the candidate key in etcd
	Value     string
	Session   session.ID
	RequestID string
	Revision  int64 // the etcd revision at which leadership was observed
}

// Leader is who leads an election.
type Leader struct {
	Term      fencing.Token
	Value     string
	Session   session.ID
	RequestID string
	// Since is when the leader was elected: its campaign's start if it was
	// elected at once, else when its wait ended (recorded shortly after).
	Since time.Time
	// Proclaims counts the leader's proclamations.
	Proclaims int64
}

// Candidate is a campaign waiting for its turn.
type Candidate struct {
	Term      fencing.Token // the term it will hold once elected
	Value     string
	Session   session.ID
	RequestID string
	Enqueued  time.Time
}

// candidate is the JSON stored in a candidate key.
type candidate struct {
	// Attempt changes with every Campaign call that joins or resumes this
	// candidacy, so a failed call removes the entry only if no later call
	// (an idempotent retry) has taken it over.
	Attempt   string    `json:"attempt"`
	RequestID string    `json:"request_id"`
	Value     string    `json:"value"`
	Proclaims int64     `json:"proclaims,omitempty"`
	Enqueued  time.Time `json:"enqueued"`
	Elected   time.Time `json:"elected,omitzero"` // set after an election that had to wait
}

func (m *Manager) prefix(name string) string      { return m.root + names.Escape(name) + "/" }
func (m *Manager) queue(name string) string       { return m.prefix(name) + "q/" }
func (m *Manager) resignedKey(name string) string { return m.prefix(name) + "resigned" }

func (m *Manager) candidateKey(name string, sess session.ID, requestID string) string {
	return fmt.Sprintf("%s%016x/%s", m.queue(name), uint64(sess), requestID)
}

// CandidateKey is the etcd key of the candidate entry with which session
// sess campaigns in (or leads) the named election under request id
// requestID; the entry's create revision is its term. It is what a
// leader's server-side watch (package grantwatch) watches. It fails with
// ErrInvalid for a bad name or request id.
func (m *Manager) CandidateKey(name string, sess session.ID, requestID string) (string, error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	if err := names.CheckRequestID(requestID); err != nil {
		return "", fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return m.candidateKey(name, sess, requestID), nil
}

func validateName(name string) error {
	if err := names.Check("election name", name); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
}

func validateValue(v string) error {
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%w: value is %d bytes, at most %d are allowed", ErrTooLarge, len(v), MaxValueBytes)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%w: value is not valid UTF-8", ErrInvalid)
	}
	return nil
}

func validateTerm(name string, term fencing.Token) error {
	if err := validateName(name); err != nil {
		return err
	}
	if term <= 0 {
		return fmt.Errorf("%w: term must be positive", ErrInvalid)
	}
	return nil
}

func validateRequest(req *Request) error {
	if err := validateName(req.Name); err != nil {
		return err
	}
	if req.Session <= 0 {
		return fmt.Errorf("%w: session is required", ErrInvalid)
	}
	if req.RequestID == "" {
		req.RequestID = names.NewRequestID()
	}
	if err := names.CheckRequestID(req.RequestID); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return validateValue(req.Value)
}

// Campaign joins the election and blocks until the candidate leads, its
// session ends (ErrSessionNotFound) or ctx ends (ctx's error). An
// unsuccessful Campaign removes its candidacy (retrying in the background
// if etcd is unavailable; the session's end removes it at the latest). A
// session that already leads under another request id is refused with
// ErrAlreadyLeader instead of waiting for itself.
func (m *Manager) Campaign(ctx context.Context, req Request) (Leadership, error) {
	picked := req.RequestID == "" && req.Session > 0 && validateName(req.Name) == nil
	var reused bool
	keyOf := func(id string) string { return m.candidateKey(req.Name, req.Session, id) }
	if picked {
		req.RequestID, reused = m.ids.Take(int64(req.Session), req.Name, false, false, keyOf)
	}
	if err := validateRequest(&req); err != nil {
		return Leadership{}, err
	}
	q := m.queue(req.Name)
	var (
		key, value string
		c          candidate
		head       []*mvccpb.KeyValue
		l          Leadership
		readAt     int64 // the revision of the transaction's read of head
	)
	// A candidacy is taken over only if it was written before the call
	// began (see lock.Manager's enqueue): one written later may be an
	// earlier attempt's, still in flight, or a later campaign's under the
	// same id, which an attempt stuck in etcd must never take over and
	// then remove.
	began := m.txns.Began(ctx)
	for attempt := 1; ; attempt++ {
		key = keyOf(req.RequestID)
		c = candidate{Attempt: names.NewRequestID(), RequestID: req.RequestID, Value: req.Value, Enqueued: m.now().UTC()}
		val, err := json.Marshal(c)
		if err != nil {
			return Leadership{}, err
		}
		value = string(val)
		if m.beforeCampaign != nil {
			m.beforeCampaign()
		}
		resp, err := m.txns.Commit(ctx, groupcommit.Txn{
			Name:    q,
			Creates: true,
			If:      []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			Then:    []clientv3.Op{clientv3.OpPut(key, value, clientv3.WithLease(clientv3.LeaseID(req.Session))), queue.HeadsOp(q, 1)},
			Else:    []clientv3.Op{clientv3.OpGet(key), queue.HeadsOp(q, 1)},
		})
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return Leadership{}, fmt.Errorf("%w: %016x", ErrSessionNotFound, uint64(req.Session))
			}
			// The put may have committed although the answer was lost, or may
			// still commit later: remove it if it is, or becomes, exactly ours.
			queue.RemoveLate(m.cli, m.dels, &m.bg, key, value)
			return Leadership{}, fmt.Errorf("election: campaign %q: %w", req.Name, err)
		}
		head, readAt = resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision
		l = Leadership{Name: req.Name, Key: key, Value: req.Value, Session: req.Session, RequestID: req.RequestID}
		if resp.Succeeded {
			l.Term = fencing.Token(resp.Header.Revision)
			break
		}
		if reused {
			// An id the server picked again, which another call of the
			// session named meanwhile: never join that candidacy; start
			// anew under an id nobody has (see queue.IDs).
			req.RequestID, reused = m.ids.Take(int64(req.Session), req.Name, false, true, keyOf)
			continue
		}
		// An idempotent retry: take the candidacy over.
		var ok bool
		if value, ok, err = m.takeOverCandidacy(ctx, req, began, resp.Responses[0].GetResponseRange().Kvs[0], &c, &l); err != nil {
			return Leadership{}, err
		}
		if ok {
			break
		}
		// The candidacy vanished before the take-over (a clean-up of a
		// failed earlier attempt removed it): create it anew.
		if attempt >= 3 {
			return Leadership{}, fmt.Errorf("%w: the candidacy %s ended while it was retried", ErrSessionNotFound, req.RequestID)
		}
	}
	if len(head) > 0 && string(head[0].Key) == key {
		l.Revision = readAt
		return l, nil
	}
	return m.awaitTurn(ctx, req, l, c, value, head)
}

// awaitTurn waits until the candidacy l (written as value, its record c)
// leads, behind head, the candidates ahead of it when it was written.
// A candidacy behind its own session's leadership would wait forever: it
// is refused with ErrAlreadyLeader. One that fails is removed.
func (m *Manager) awaitTurn(ctx context.Context, req Request, l Leadership, c candidate, value string, head []*mvccpb.KeyValue) (Leadership, error) {
	q := m.queue(req.Name)
	fail := func(err error) (Leadership, error) {
		queue.Remove(ctx, m.cli, &m.bg, l.Key, value)
		return Leadership{}, err
	}
	own := fmt.Sprintf("%s%016x/", q, uint64(req.Session))
	if len(head) > 0 && strings.HasPrefix(string(head[0].Key), own) {
		return fail(fmt.Errorf("%w: %q (request %s); waiting would never end, resign first",
			ErrAlreadyLeader, req.Name, strings.TrimPrefix(string(head[0].Key), own)))
	}
	rev, err := m.waits.Wait(ctx, queue.NewTurn(q, l.Key, int64(l.Term), 1, head))
	if errors.Is(err, queue.ErrEntryGone) {
		err = fmt.Errorf("%w: the candidate's session ended while it waited", ErrSessionNotFound)
	}
	if err != nil {
		return fail(err)
	}
	l.Revision = rev
	c.Elected = m.now().UTC()
	if val, err := json.Marshal(c); err == nil {
		queue.Restamp(&m.bg, m.cli, l.Key, value, string(val))
	}
	return l, nil
}

// takeOverCandidacy takes over kv, the candidacy an earlier attempt of
// the same request wrote, for this attempt (c, l): it keeps its value,
// proclamations and times, and writes c over it. It refuses one written
// after the call began (an attempt still in flight, or a later campaign
// under the same id). ok is false when the candidacy vanished first.
func (m *Manager) takeOverCandidacy(ctx context.Context, req Request, began int64, kv *mvccpb.KeyValue, c *candidate, l *Leadership) (value string, ok bool, err error) {
	if kv.CreateRevision > began {
		return "", false, fmt.Errorf("%w (election %q, request %s: by an earlier attempt still in flight, or a later campaign under the same id); retry", errCandidacyNewer, req.Name, req.RequestID)
	}
	l.Term = fencing.Token(kv.CreateRevision)
	var prev candidate
	if json.Unmarshal(kv.Value, &prev) == nil {
		c.Value, c.Proclaims, c.Enqueued, c.Elected = prev.Value, prev.Proclaims, prev.Enqueued, prev.Elected
		l.Value = prev.Value
	}
	val, err := json.Marshal(c)
	if err != nil {
		return "", false, err
	}
	if ok, err = queue.TakeOver(ctx, m.cli, l.Key, int64(l.Term), string(val)); err != nil {
		return "", false, fmt.Errorf("election: campaign %q: %w", req.Name, err)
	}
	return string(val), ok, nil
}

// TermSession returns the session of the candidate whose term (or
// campaign) term names, read linearizably. It returns ErrNotLeader when
// there is none.
func (m *Manager) TermSession(ctx context.Context, name string, term fencing.Token) (session.ID, error) {
	kv, _, err := m.leading(ctx, name, term)
	if err != nil {
		return 0, err
	}
	if kv == nil {
		return 0, fmt.Errorf("%w: term %d of %q is no candidate's", ErrNotLeader, term, name)
	}
	return session.ID(kv.Lease), nil
}

// leading reads the candidate whose term is term and reports whether it
// leads now (nil if it does not exist).
func (m *Manager) leading(ctx context.Context, name string, term fencing.Token) (*mvccpb.KeyValue, bool, error) {
	kv, place, _, err := queue.Position(ctx, m.cli, m.queue(name), int64(term))
	if err != nil {
		return nil, false, fmt.Errorf("election: read %q: %w", name, err)
	}
	return kv, kv != nil && place == 1, nil
}

// Proclaim replaces the leader's value. It fails with ErrNotLeader unless
// term leads the election. It returns the write's revision.
func (m *Manager) Proclaim(ctx context.Context, name string, term fencing.Token, value string) (int64, error) {
	if err := validateTerm(name, term); err != nil {
		return 0, err
	}
	if err := validateValue(value); err != nil {
		return 0, err
	}
	for {
		kv, leads, err := m.leading(ctx, name, term)
		if err != nil {
			return 0, err
		}
		if !leads {
			return 0, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
		}
		var c candidate
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			return 0, fmt.Errorf("election: decode %q: %w", kv.Key, err)
		}
		c.Value = value
		c.Proclaims++
		val, err := json.Marshal(c)
		if err != nil {
			return 0, err
		}
		// Read-modify-write: a concurrent restamp or proclamation makes the
		// compare fail, and the loop reads again.
		resp, err := m.txns.Commit(ctx, groupcommit.Txn{
			Name: m.queue(name),
			If:   []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)},
			Then: []clientv3.Op{clientv3.OpPut(string(kv.Key), string(val), clientv3.WithIgnoreLease())},
		})
		if err != nil {
			return 0, fmt.Errorf("election: proclaim %q: %w", name, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
	}
}

// Resign ends term's leadership; the next candidate leads at the same
// revision. It fails with ErrNotLeader unless term leads the election (so
// a retried Resign never removes a newer leader). With a hint naming a
// session and a request id (the SDK always gives one) it is one
// transaction: it compares that the hinted campaign's key has term as its
// create revision and that no candidate key is older; without one, the
// campaign is read first, and a hint naming only a session must name the
// term's session or the resignation fails with ErrNotLeader.
func (m *Manager) Resign(ctx context.Context, name string, term fencing.Token, hint session.Hint) error {
	if err := validateTerm(name, term); err != nil {
		return err
	}
	var cmps []clientv3.Cmp
	var key string
	var lease clientv3.LeaseID
	if hint.Session > 0 && hint.RequestID != "" {
		if err := names.CheckRequestID(hint.RequestID); err != nil {
			return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
		}
		key, lease = m.candidateKey(name, hint.Session, hint.RequestID), clientv3.LeaseID(hint.Session)
		// It leads: every candidate's key was created at term or later.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(m.queue(name)), ">", int64(term)-1).WithPrefix())
	} else {
		kv, leads, err := m.leading(ctx, name, term)
		if err != nil {
			return err
		}
		if !leads {
			return fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
		}
		if hint.Session > 0 && session.ID(kv.Lease) != hint.Session {
			return fmt.Errorf("%w: term %d of %q is not a term of session %s", ErrNotLeader, term, name, hint.Session)
		}
		key, lease = string(kv.Key), clientv3.LeaseID(kv.Lease)
	}
	// The marker, written with the delete, tells observers this was a
	// resignation; it goes away with the resigner's session. When etcd's
	// database is full (NOSPACE refuses any transaction with a put), the
	// leader resigns without it, and observers see the term expire.
	ops := []clientv3.Op{clientv3.OpDelete(key),
		clientv3.OpPut(m.resignedKey(name), strconv.FormatInt(int64(term), 10), clientv3.WithLease(lease))}
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", int64(term)))
	resp, err := m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), If: cmps, Then: ops})
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		resp, err = m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), If: cmps, Then: ops[:1]})
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: term %d of %q ended with its session", ErrNotLeader, term, name)
	}
	if err != nil {
		return fmt.Errorf("election: resign %q: %w", name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
	}
	m.ids.Released(key)
	return nil
}

// Leader returns who leads the election, and the revision of the read
// (linearizable). It fails with ErrNoLeader when nobody does.
func (m *Manager) Leader(ctx context.Context, name string) (Leader, int64, error) {
	if err := validateName(name); err != nil {
		return Leader{}, 0, err
	}
	resp, err := m.cli.Txn(ctx).Then(queue.HeadsOp(m.queue(name), 1)).Commit()
	if err != nil {
		return Leader{}, 0, fmt.Errorf("election: leader of %q: %w", name, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Leader{}, resp.Header.Revision, fmt.Errorf("%w: nobody leads %q", ErrNoLeader, name)
	}
	ld, err := leaderOf(kvs[0])
	return ld, resp.Header.Revision, err
}

func leaderOf(kv *mvccpb.KeyValue) (Leader, error) {
	var c candidate
	if err := json.Unmarshal(kv.Value, &c); err != nil {
		return Leader{}, fmt.Errorf("election: decode %q: %w", kv.Key, err)
	}
	ld := Leader{Term: fencing.Token(kv.CreateRevision), Value: c.Value, Session: session.ID(kv.Lease), RequestID: c.RequestID, Since: c.Enqueued, Proclaims: c.Proclaims}
	if !c.Elected.IsZero() {
		ld.Since = c.Elected
	}
	return ld, nil
}

// List returns the names of elections that have a leader or candidates and
// start with prefix, at most limit of them, starting after the name after
// ("" for the first page). The order is stable, so pages do not overlap.
func (m *Manager) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if prefix != "" {
		// A prefix is any start of a name ("batch/", "bat").
		if err := names.CheckKey("election name prefix", prefix); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
		}
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", ErrInvalid, limit)
	}
	list, err := queue.Names(ctx, m.cli, m.root, prefix, after, limit)
	if err != nil {
		return nil, fmt.Errorf("election: list: %w", err)
	}
	return list, nil
}

// Candidates returns the campaigns waiting behind the leader, in the order
// they will lead, and the revision of the read (linearizable).
func (m *Manager) Candidates(ctx context.Context, name string) ([]Candidate, int64, error) {
	if err := validateName(name); err != nil {
		return nil, 0, err
	}
	resp, err := m.cli.Get(ctx, m.queue(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, 0, fmt.Errorf("election: candidates of %q: %w", name, err)
	}
	var out []Candidate
	for i, kv := range resp.Kvs {
		if i == 0 {
			continue // the leader
		}
		var c candidate
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			return nil, 0, fmt.Errorf("election: decode %q: %w", kv.Key, err)
		}
		out = append(out, Candidate{Term: fencing.Token(kv.CreateRevision), Value: c.Value, Session: session.ID(kv.Lease), RequestID: c.RequestID, Enqueued: c.Enqueued})
	}
	return out, resp.Header.Revision, nil
}

// ValidateFence returns nil if term leads the election now, and
// ErrStaleTerm if not. The check is linearizable.
func (m *Manager) ValidateFence(ctx context.Context, name string, term fencing.Token) error {
	_, err := m.Holding(ctx, name, term)
	return err
}

// Holding implements lock.Fence for elections: it checks that term leads
// now and returns a comparison that stays true while it keeps leading.
func (m *Manager) Holding(ctx context.Context, name string, term fencing.Token) (clientv3.Cmp, error) {
	if err := validateTerm(name, term); err != nil {
		return clientv3.Cmp{}, err
	}
	kv, leads, err := m.leading(ctx, name, term)
	if err != nil {
		return clientv3.Cmp{}, err
	}
	if !leads {
		return clientv3.Cmp{}, fmt.Errorf("%w: term %d does not lead %q", ErrStaleTerm, term, name)
	}
	return clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", int64(term)), nil
}

// Counts are how many elections have a leader and how many candidates
// wait behind the leaders, cluster-wide.
type Counts struct {
	WithLeader int
	Waiting    int // candidates that do not lead
}

// Count counts the elections that have a leader, from the local member (a
// serializable read: it may trail the cluster by a moment). It reads every
// candidate: for metrics, not for a request path.
func (m *Manager) Count(ctx context.Context) (Counts, error) {
	st, err := queue.Count(ctx, m.cli, m.root, func([]*mvccpb.KeyValue) int { return 1 })
	if err != nil {
		return Counts{}, fmt.Errorf("election: count: %w", err)
	}
	return Counts{WithLeader: st.Queues, Waiting: st.Waiting}, nil
}

// NamesIn returns the names of the elections that the entries among keys belong
// to (a session's attached keys, session.Info.Keys: the elections it
// leads or campaigns in), sorted and without repeats. Other keys are ignored.
func (m *Manager) NamesIn(keys []string) []string { return queue.NamesIn(m.root, keys) }
