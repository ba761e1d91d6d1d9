package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/base/revoke"
	"github.com/coordd/coordd/internal/session"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed or out-of-bounds argument; nothing changed.
	ErrInvalid = errkind.Invalid.New("election: invalid argument")
	// ErrTooLarge: a value over MaxValueBytes; nothing changed.
	ErrTooLarge = errkind.TooLarge.New("election: value too large")
	// ErrSessionNotFound: the session does not exist, or ended while its
	// campaign waited.
	ErrSessionNotFound = errkind.SessionNotFound.New("election: session not found")
	// ErrNotLeader: Proclaim, Resign or Transfer by a term that does not
	// lead.
	ErrNotLeader = errkind.NotLeader.New("election: not the leader")
	// ErrNoLeader: nobody leads the election.
	ErrNoLeader = errkind.NoLeader.New("election: no leader")
	// ErrStaleTerm: a fenced check's term no longer leads.
	ErrStaleTerm = errkind.StaleToken.New("election: stale term")
	// ErrAlreadyLeader: Campaign by a session that already leads the
	// election under another request id; waiting would never end.
	ErrAlreadyLeader = errkind.AlreadyLeader.New("election: this session already leads")
	// ErrNotCandidate: Transfer to a session with no campaign waiting in
	// the election.
	ErrNotCandidate = errkind.CandidateNotFound.New("election: not a candidate")
)

// errCandidacyNewer: the candidacy of the call's session and request id was
// written after the call began, so it may not be the call's to take over;
// nothing was written, and a retry takes it over if it is (Unavailable).
var errCandidacyNewer = errkind.Unavailable.New("election: the campaign's candidacy was written after this call began")

// MaxValueBytes bounds a candidate's value.
const MaxValueBytes = 64 << 10

// Manager runs elections. It is safe for concurrent use.
type Manager struct {
	cli  *clientv3.Client
	root string // "<root>election/"
	now  func() time.Time
	dels *grantwatch.Watcher // tells waiting candidates of their election
	txns *groupcommit.Committer

	bg          queue.Background // background writes (promotions, clean-ups)
	ids         queue.IDs        // request ids made up for callers that named none
	promoting   promoter         // promotions in flight, per election
	seatWatches seatWatches      // elections with parked campaigns (CampaignLater)

	beforeCampaign func()      // tests: runs before each campaign transaction
	beforeWait     func()      // tests: runs before a campaign waits for the seat
	splitTransfer  bool        // tests: Transfer frees the seat, then gives it
	unguarded      atomic.Bool // tests: promotions do not check the seat is free
}

// NewManager returns a Manager that keeps elections under root+"election/".
// Waiting candidates learn of changes to their election from w, which
// must watch root+"election/" and run (grantwatch.Run) while the Manager
// is used. Campaigns, proclamations, resignations and promotions go
// through c, which batches them with other changes (see groupcommit; nil:
// each commits alone).
func NewManager(cli *clientv3.Client, root string, w *grantwatch.Watcher, c *groupcommit.Committer) *Manager {
	if c == nil {
		c = groupcommit.Direct(cli)
	}
	return &Manager{cli: cli, root: root + "election/", now: time.Now, dels: w, txns: c}
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
	// value and priority). Empty means a fresh id.
	RequestID string
	// Priority orders the waiting candidates: when the seat is free, the
	// highest priority leads next, ties in arrival order. It never unseats
	// a leader by itself (see Preempt). Default 0; may be negative.
	Priority int32
	// Preempt, for a candidate that outranks the leader, records a request
	// that the leader step down (Observe: PREEMPT_REQUESTED), which the
	// leader honours at a point of its choosing.
	Preempt bool
}

// Leadership is a won election.
type Leadership struct {
	Name      string
	Term      fencing.Token // the seat's create revision
	Key       string        // the seat in etcd
	Value     string
	Priority  int32
	Session   session.ID
	RequestID string
	Revision  int64 // the etcd revision at which leadership was observed
}

// Leader is who leads an election.
type Leader struct {
	Term      fencing.Token
	Value     string
	Priority  int32
	Session   session.ID
	RequestID string
	// Since is when the leader took the seat (by the clock of the member
	// that gave it).
	Since time.Time
	// Proclaims counts the leader's proclamations.
	Proclaims int64
	// RevokingSince and RevokingUntil say that a resignation from outside
	// asked the leader to step down, when, and when the term ends if it
	// has not by then (see Revoke). Zero otherwise.
	RevokingSince, RevokingUntil time.Time
}

// Candidate is a campaign waiting for its turn.
type Candidate struct {
	// Joined is the revision at which it joined: among candidates of equal
	// priority, the earlier leads first. Its term is given when it is
	// elected.
	Joined    int64
	Value     string
	Priority  int32
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
	Enqueued  time.Time `json:"enqueued"`
}

func (m *Manager) prefix(name string) string      { return m.root + names.Escape(name) + "/" }
func (m *Manager) queue(name string) string       { return m.prefix(name) + "q/" }
func (m *Manager) seats(name string) string       { return m.prefix(name) + "lead/" }
func (m *Manager) resignedKey(name string) string { return m.prefix(name) + "resigned" }
func (m *Manager) preemptKey(name string) string  { return m.prefix(name) + "preempt" }

// campaignPrefix is where the candidacy of sess under requestID lives
// (its key ends with its priority).
func (m *Manager) campaignPrefix(name string, sess session.ID, requestID string) string {
	return fmt.Sprintf("%s%016x/%s/", m.queue(name), uint64(sess), requestID)
}

func (m *Manager) seatKey(name string, sess session.ID, requestID string) string {
	return fmt.Sprintf("%s%016x/%s", m.seats(name), uint64(sess), requestID)
}

// SeatKey is the etcd key of the seat that session sess holds while its
// campaign requestID leads the named election; the seat's create revision
// is the term. It is what a leader's server-side watch (package
// grantwatch) watches. It fails with ErrInvalid for a bad name or request
// id.
func (m *Manager) SeatKey(name string, sess session.ID, requestID string) (string, error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	if err := checkRequestID(requestID); err != nil {
		return "", err
	}
	return m.seatKey(name, sess, requestID), nil
}

func checkRequestID(id string) error {
	if err := names.CheckRequestID(id); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
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
	if err := checkRequestID(req.RequestID); err != nil {
		return err
	}
	return validateValue(req.Value)
}

// Campaign joins the election and blocks until the candidate leads, its
// session ends (ErrSessionNotFound) or ctx ends (ctx's error). A candidate
// takes the seat at once if nobody leads or waits; otherwise it waits
// until the seat is given to it: by a resignation or hand-over, or, when
// the seat was freed by a session's end, by the first member to see it.
// An unsuccessful Campaign removes its candidacy (and a seat given to it
// meanwhile), retrying in the background if etcd is unavailable; the
// session's end removes it at the latest. A session that already leads
// under another request id is refused with ErrAlreadyLeader instead of
// waiting for itself.
func (m *Manager) Campaign(ctx context.Context, req Request) (Leadership, error) {
	l, _, err := m.campaignOr(ctx, req, nil)
	return l, err
}

// Later is where CampaignLater gives a parked campaign's outcome.
type Later struct {
	// Ctx governs the parked wait: the campaign fails with its error when
	// it ends first. It must end once Done was called.
	Ctx context.Context
	// Done is called once, with the leadership or the campaign's error,
	// on a goroutine of the manager's (it must not block).
	Done func(Leadership, error)
}

// CampaignLater is Campaign without holding the caller's goroutine while
// the candidacy waits: it writes the candidacy (on the caller's
// goroutine, bound by ctx), and when the seat is not given at once, parks
// the wait with the election's watch (one per election for all its parked
// candidates), returns parked true, and calls l.Done once with the
// outcome. A parked wait costs its record and l's context.
func (m *Manager) CampaignLater(ctx context.Context, req Request, l Later) (ld Leadership, parked bool, err error) {
	return m.campaignOr(ctx, req, &l)
}

// campaignOr campaigns (see Campaign), parking the wait when later is set
// (see CampaignLater).
func (m *Manager) campaignOr(ctx context.Context, req Request, later *Later) (Leadership, bool, error) {
	picked := req.RequestID == "" && req.Session > 0 && validateName(req.Name) == nil
	var reused bool
	keyOf := func(id string) string { return m.campaignPrefix(req.Name, req.Session, id) }
	if picked {
		req.RequestID, reused = m.ids.Take(int64(req.Session), req.Name, false, false, keyOf)
	}
	if err := validateRequest(&req); err != nil {
		return Leadership{}, false, err
	}
	// A candidacy is taken over only if it was written before the call
	// began (see lock.Manager's enqueue): one written later may be an
	// earlier attempt's, still in flight, or a later campaign's under the
	// same id, which an attempt stuck in etcd must never take over and
	// then remove.
	began := m.txns.Began(ctx)
	var (
		mine    entry            // the candidacy
		value   string           // its value as this call wrote it
		l       Leadership       // the leadership it will be
		seatKV  *mvccpb.KeyValue // the seat as the campaign read it (nil: free)
		readAt  int64            // the revision of that read
		retried bool             // an earlier attempt's candidacy, taken over
	)
	for attempt := 1; ; attempt++ {
		l = Leadership{Name: req.Name, Key: m.seatKey(req.Name, req.Session, req.RequestID), Value: req.Value, Priority: req.Priority, Session: req.Session, RequestID: req.RequestID}
		mine = entry{key: keyOf(req.RequestID) + strconv.Itoa(int(req.Priority)), session: req.Session, requestID: req.RequestID, priority: req.Priority, lease: int64(req.Session)}
		resp, c, err := m.join(ctx, req, mine.key, l.Key)
		if err != nil {
			return Leadership{}, false, err
		}
		value, readAt = c, resp.Header.Revision
		if resp.Succeeded {
			inner := resp.Responses[1].GetResponseTxn()
			if inner.Succeeded {
				l.Term, l.Revision = fencing.Token(readAt), readAt
				return l, false, nil
			}
			seatKV = first(inner.Responses[0].GetResponseRange().Kvs)
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
		kv := first(resp.Responses[0].GetResponseRange().Kvs)
		seatKV = first(resp.Responses[1].GetResponseRange().Kvs)
		var ok bool
		if kv != nil {
			if value, ok, err = m.takeOverCandidacy(ctx, req, began, kv, &l); err != nil {
				return Leadership{}, false, err
			}
		}
		if ok {
			mine, _ = parseEntry(m.queue(req.Name), kv)
			retried = true
			break
		}
		// The candidacy vanished before the take-over (a clean-up of a
		// failed earlier attempt removed it): create it anew.
		if attempt >= 3 {
			return Leadership{}, false, fmt.Errorf("%w: the candidacy %s ended while it was retried", ErrSessionNotFound, req.RequestID)
		}
	}
	if seatKV != nil && string(seatKV.Key) == l.Key {
		// A retry of a campaign that leads already.
		ld, err := leaderFromSeat(m.seats(req.Name), seatKV)
		if err != nil {
			return Leadership{}, false, err
		}
		l.Term, l.Value, l.Priority, l.Revision = ld.Term, ld.Value, ld.Priority, readAt
		return l, false, nil
	}
	if retried {
		// The candidacy was admitted by an earlier attempt: it waits as
		// that attempt did, also behind a leadership its own session
		// gained meanwhile (which awaitSeat refuses for a new campaign).
		seatKV = nil
	}
	return m.awaitSeat(ctx, req, l, mine, value, seatKV, readAt, !picked, later)
}

// join writes the candidacy key (with value c, returned) unless the
// campaign's candidacy exists, and takes the seat with it when nobody
// leads or waits. Succeeded: written (Responses[1], a transaction, says
// whether it took the seat, else read the seat); otherwise Responses read
// the existing candidacy and the seat.
func (m *Manager) join(ctx context.Context, req Request, key, seatKey string) (*clientv3.TxnResponse, string, error) {
	q := m.queue(req.Name)
	now := m.now().UTC()
	c, err := json.Marshal(candidate{Attempt: names.NewRequestID(), RequestID: req.RequestID, Value: req.Value, Enqueued: now})
	if err != nil {
		return nil, "", err
	}
	st, err := json.Marshal(seat{RequestID: req.RequestID, Value: req.Value, Priority: req.Priority, Since: now})
	if err != nil {
		return nil, "", err
	}
	lease := clientv3.WithLease(clientv3.LeaseID(req.Session))
	if m.beforeCampaign != nil {
		m.beforeCampaign()
	}
	resp, err := m.txns.Commit(ctx, groupcommit.Txn{
		Name:    q,
		Creates: true,
		If:      []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(m.campaignPrefix(req.Name, req.Session, req.RequestID)), "=", 0).WithPrefix()},
		Then: []clientv3.Op{
			clientv3.OpPut(key, string(c), lease),
			// Compares see the state before the transaction: nobody
			// leads, and nobody else waits.
			clientv3.OpTxn([]clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(m.seats(req.Name)), "=", 0).WithPrefix(),
				clientv3.Compare(clientv3.CreateRevision(q), "=", 0).WithPrefix(),
			}, []clientv3.Op{clientv3.OpPut(seatKey, string(st), lease)}, []clientv3.Op{m.seatsOp(req.Name)}),
		},
		Else: []clientv3.Op{clientv3.OpGet(m.campaignPrefix(req.Name, req.Session, req.RequestID), clientv3.WithPrefix()), m.seatsOp(req.Name)},
	})
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, "", fmt.Errorf("%w: %016x", ErrSessionNotFound, uint64(req.Session))
		}
		// The put may have committed although the answer was lost, or may
		// still commit later: remove it (and a seat given to it) if it is,
		// or becomes, exactly ours.
		queue.RemoveLate(m.cli, m.dels, &m.bg, key, string(c), clientv3.OpDelete(seatKey))
		return nil, "", fmt.Errorf("election: campaign %q: %w", req.Name, err)
	}
	return resp, string(c), nil
}

func first(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// awaitSeat waits until the candidacy mine (written as value) is given
// the seat (named: the client chose the campaign's request id); seatKV is the seat as the campaign read it, at revision readAt. A candidacy behind
// its own session's leadership would wait forever: it is refused with
// ErrAlreadyLeader. One that fails is removed, with a seat given to it
// meanwhile. With later, the wait parks (see CampaignLater): parked is
// true and later.Done gets the outcome; later.Ctx governs the wait.
func (m *Manager) awaitSeat(ctx context.Context, req Request, l Leadership, mine entry, value string, seatKV *mvccpb.KeyValue, readAt int64, named bool, later *Later) (ld Leadership, parked bool, err error) {
	if later != nil {
		ctx = later.Ctx
	}
	var mu sync.Mutex // guards asked: a parked wait asks on its election's watch
	var asked string  // the preemption request in force, if this campaign made it
	fail := func(err error) (Leadership, error) {
		// Kept for the client's retry if it named the campaign
		// (queue.Abandoned); one without an id would campaign anew.
		if !named || !queue.Abandoned(ctx) {
			mu.Lock()
			withdraw := m.withdraw(req.Name, asked)
			mu.Unlock()
			queue.Remove(ctx, m.cli, &m.bg, mine.key, value, append([]clientv3.Op{clientv3.OpDelete(l.Key)}, withdraw...)...)
		}
		return Leadership{}, err
	}
	// With Preempt, each leader this campaign outranks is asked (waitSeat
	// calls ask for the seat it first reads and for every new one). Best
	// effort: the campaign waits its turn either way.
	ask := func(kv *mvccpb.KeyValue) {
		if v, err := m.askToStepDown(ctx, req.Name, mine, kv); err == nil && v != "" {
			mu.Lock()
			asked = v
			mu.Unlock()
		}
	}
	if !req.Preempt {
		ask = nil
	}
	if seatKV != nil {
		if sess, id, ok := seatOf(m.seats(req.Name), seatKV.Key); ok && sess == req.Session {
			ld, err := fail(fmt.Errorf("%w: %q (request %s); waiting would never end, resign first", ErrAlreadyLeader, req.Name, id))
			return ld, false, err
		}
	}
	if m.beforeWait != nil {
		m.beforeWait()
	}
	seated := func(term, rev int64, err error) (Leadership, error) {
		if errors.Is(err, queue.ErrEntryGone) {
			err = fmt.Errorf("%w: the candidate's session ended while it waited", ErrSessionNotFound)
		}
		if err != nil {
			return fail(err)
		}
		l.Term, l.Revision, l.Priority = fencing.Token(term), rev, mine.priority
		return l, nil
	}
	if later != nil {
		m.parkSeat(ctx, req.Name, mine.key, l.Key, readAt, ask, func(term, rev int64, err error) {
			later.Done(seated(term, rev, err))
		})
		return Leadership{}, true, nil
	}
	ld, err = seated(m.waitSeat(ctx, req.Name, mine.key, l.Key, ask))
	return ld, false, err
}

// takeOverCandidacy takes over kv, the candidacy an earlier attempt of
// the same request wrote, for this attempt: it keeps its value, priority
// and times, and writes a new attempt over it. It refuses one written
// after the call began (an attempt still in flight, or a later campaign
// under the same id). ok is false when the candidacy vanished first.
func (m *Manager) takeOverCandidacy(ctx context.Context, req Request, began int64, kv *mvccpb.KeyValue, l *Leadership) (value string, ok bool, err error) {
	if kv.CreateRevision > began {
		return "", false, fmt.Errorf("%w (election %q, request %s: by an earlier attempt still in flight, or a later campaign under the same id); retry", errCandidacyNewer, req.Name, req.RequestID)
	}
	var c candidate
	_ = json.Unmarshal(kv.Value, &c)
	c.Attempt, c.RequestID = names.NewRequestID(), req.RequestID
	l.Value = c.Value
	if e, ok := parseEntry(m.queue(req.Name), kv); ok {
		l.Priority = e.priority
	}
	val, err := json.Marshal(c)
	if err != nil {
		return "", false, err
	}
	rev, err := queue.TakeOver(ctx, m.cli, string(kv.Key), kv.CreateRevision, string(val))
	if err != nil {
		return "", false, fmt.Errorf("election: campaign %q: %w", req.Name, err)
	}
	return string(val), rev != 0, nil
}

// leading reads the election's seat and reports whether term holds it.
func (m *Manager) leading(ctx context.Context, name string, term fencing.Token) (*mvccpb.KeyValue, bool, error) {
	resp, err := m.cli.Txn(ctx).Then(m.seatsOp(name)).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("election: read %q: %w", name, err)
	}
	kv := first(resp.Responses[0].GetResponseRange().Kvs)
	return kv, kv != nil && kv.CreateRevision == int64(term), nil
}

// TermSession returns the session of the leader whose term is term, read
// linearizably. It returns ErrNotLeader when term does not lead.
func (m *Manager) TermSession(ctx context.Context, name string, term fencing.Token) (session.ID, error) {
	kv, leads, err := m.leading(ctx, name, term)
	if err != nil {
		return 0, err
	}
	if !leads {
		return 0, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
	}
	return session.ID(kv.Lease), nil
}

// Proclaim replaces the leader's value. It fails with ErrNotLeader unless
// term leads the election. It returns the write's revision.
//
// id, when not empty, names the proclamation (as a request id): if the
// seat's last proclamation was made with the same id, Proclaim writes
// nothing and returns that proclamation's revision, so a caller that
// retries after a lost answer proclaims once. Only the last id is kept:
// a retry that comes after another proclamation of the same term
// proclaims again.
func (m *Manager) Proclaim(ctx context.Context, name string, term fencing.Token, value, id string) (int64, error) {
	if err := validateTerm(name, term); err != nil {
		return 0, err
	}
	if err := validateValue(value); err != nil {
		return 0, err
	}
	if id != "" {
		if err := names.CheckRequestID(id); err != nil {
			return 0, fmt.Errorf("%w: %s", ErrInvalid, strings.Replace(err.Error(), "request id", "proclaim id", 1))
		}
	}
	for {
		kv, leads, err := m.leading(ctx, name, term)
		if err != nil {
			return 0, err
		}
		if !leads {
			return 0, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
		}
		var st seat
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			return 0, fmt.Errorf("election: decode %q: %w", kv.Key, err)
		}
		if id != "" && st.ProclaimID == id {
			return kv.ModRevision, nil // made already; its answer was lost
		}
		st.Value, st.ProclaimID = value, id
		st.Proclaims++
		val, err := json.Marshal(st)
		if err != nil {
			return 0, err
		}
		// Read-modify-write: a concurrent proclamation makes the compare
		// fail, and the loop reads again.
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

// Resign ends term's leadership and its campaign; the first candidate in
// line (by priority, then arrival) leads at the same revision, with a new
// term. It fails with ErrNotLeader unless term leads the election (so a
// retried Resign never removes a newer leader), or if hint names a
// session (and request id) other than the term's. It costs a read of the
// seat and the line (from the member, checked by the commit's compares)
// and one commit.
func (m *Manager) Resign(ctx context.Context, name string, term fencing.Token, hint session.Hint) error {
	_, err := m.resignAt(ctx, name, term, hint, nil)
	return err
}

// ResignAt is Resign (ResignRevoked when revoked) that also returns the
// etcd revision of the resignation's commit, from which a history read
// (MinRevision) shows the end of the term and its successor's election.
func (m *Manager) ResignAt(ctx context.Context, name string, term fencing.Token, hint session.Hint, revoked bool) (int64, error) {
	if !revoked {
		return m.resignAt(ctx, name, term, hint, nil)
	}
	if hint.Session == 0 {
		return 0, fmt.Errorf("%w: a resignation that answers a revocation names the leader's session", ErrInvalid)
	}
	rec := revoke.Ended{Token: int64(term), Outcome: revoke.Acknowledged}
	return m.resignAt(ctx, name, term, hint, m.revokedOps(name, rec, int64(hint.Session)))
}

// resign is Resign that also commits extra with the resignation.
func (m *Manager) resign(ctx context.Context, name string, term fencing.Token, hint session.Hint, extra []clientv3.Op) error {
	_, err := m.resignAt(ctx, name, term, hint, extra)
	return err
}

// resignAt is resign that returns the commit's revision.
func (m *Manager) resignAt(ctx context.Context, name string, term fencing.Token, hint session.Hint, extra []clientv3.Op) (int64, error) {
	if err := validateTerm(name, term); err != nil {
		return 0, err
	}
	if hint.Session > 0 && hint.RequestID != "" {
		if err := checkRequestID(hint.RequestID); err != nil {
			return 0, err
		}
	}
	for attempt := 0; ; attempt++ {
		// The first read is the member's own (serializable): the commit's
		// compares catch anything it missed, and a "not leader" it shows
		// is read again from the cluster before it is believed.
		line, err := m.readLine(ctx, name, attempt == 0)
		if err != nil {
			return 0, fmt.Errorf("election: resign %q: %w", name, err)
		}
		kv := first(line.Responses[0].GetResponseRange().Kvs)
		sess, rid, _ := seatOf(m.seats(name), keyOf(kv))
		if kv == nil || kv.CreateRevision != int64(term) || (hint.Session > 0 && sess != hint.Session) ||
			(hint.Session > 0 && hint.RequestID != "" && rid != hint.RequestID) {
			if attempt == 0 {
				continue
			}
			if kv != nil && kv.CreateRevision == int64(term) {
				return 0, fmt.Errorf("%w: term %d of %q is not a term of session %s (request %q)", ErrNotLeader, term, name, hint.Session, hint.RequestID)
			}
			return 0, fmt.Errorf("%w: term %d does not lead %q", ErrNotLeader, term, name)
		}
		own := m.campaignPrefix(name, sess, rid)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", int64(term))}
		ops := m.endOps(name, string(kv.Key), own, term, kv.Lease)
		e, ok := m.next(name, line.Responses[1].GetResponseRange().Kvs, own)
		ok = ok && attempt < promoteAttempts
		switch {
		case ok:
			c, o, err := m.seatFor(ctx, name, e, line.Header.Revision, line.Responses[2].GetResponseRange().Kvs)
			if err != nil {
				return 0, err
			}
			cmps, ops = append(cmps, c...), append(ops, o...)
		case attempt < promoteAttempts:
			// Nobody waits: the seat is freed, if still nobody waits.
			q := m.queue(name)
			cmps = append(cmps,
				clientv3.Compare(clientv3.CreateRevision(q), "=", 0).WithRange(own),
				clientv3.Compare(clientv3.CreateRevision(clientv3.GetPrefixRangeEnd(own)), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(q)))
			ops = append(ops, clientv3.OpDelete(m.preemptKey(name)))
		default:
			// The line kept changing: free the seat, and the waiters'
			// members give it.
			ops = append(ops, clientv3.OpDelete(m.preemptKey(name)))
		}
		tr, err := m.commitEnd(ctx, name, ok, cmps, append(ops, extra...))
		if err != nil || tr.Succeeded {
			var rev int64
			if err == nil {
				rev = tr.Header.Revision
			}
			return rev, m.resigned(name, session.Hint{Session: sess, RequestID: rid}, err)
		}
		// The term ended meanwhile (the next read says so), or a candidate
		// joined or left: read again.
	}
}

// readLine reads an election's seat, its candidates' keys and the first
// two candidates with their values (the successor's, without another
// read, when nobody states a priority), locally if serializable.
func (m *Manager) readLine(ctx context.Context, name string, serializable bool) (*clientv3.TxnResponse, error) {
	var opts []clientv3.OpOption
	if serializable {
		opts = []clientv3.OpOption{clientv3.WithSerializable()}
	}
	q := m.queue(name)
	return m.cli.Txn(ctx).Then(
		clientv3.OpGet(m.seats(name), append(opts, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))...),
		clientv3.OpGet(q, append(opts, clientv3.WithPrefix(), clientv3.WithKeysOnly())...),
		clientv3.OpGet(q, append(opts, clientv3.WithPrefix(), clientv3.WithLimit(2), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))...),
	).Commit()
}

func keyOf(kv *mvccpb.KeyValue) []byte {
	if kv == nil {
		return nil
	}
	return kv.Key
}

// commitEnd commits a resignation (creates: with a successor's seat).
// When etcd's database is full (NOSPACE refuses any transaction with a
// put) the leader resigns without the marker and without a successor:
// observers see the term expire, and the seat stays free until there is
// room.
func (m *Manager) commitEnd(ctx context.Context, name string, creates bool, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	tr, err := m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), Creates: creates, If: cmps, Then: ops})
	if isNoSpace(err) {
		tr, err = m.txns.Commit(ctx, groupcommit.Txn{Name: m.queue(name), If: cmps[:1], Then: withoutMarker(ops[:endOpsLen])})
	}
	return tr, err
}

func isNoSpace(err error) bool {
	return errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace)
}

// withoutMarker drops the puts from a resignation's operations.
func withoutMarker(ops []clientv3.Op) []clientv3.Op {
	var out []clientv3.Op
	for _, op := range ops {
		if !op.IsPut() {
			out = append(out, op)
		}
	}
	return out
}

// resigned turns a resignation's outcome into Resign's answer.
func (m *Manager) resigned(name string, hint session.Hint, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: the term of %q ended with its session", ErrNotLeader, name)
	}
	if err != nil {
		return fmt.Errorf("election: resign %q: %w", name, err)
	}
	m.ids.Released(m.campaignPrefix(name, hint.Session, hint.RequestID))
	return nil
}

// Leader returns who leads the election, and the revision of the read
// (linearizable). It fails with ErrNoLeader when nobody does (and, if
// candidates wait for a seat that a session's end freed a moment ago,
// gives it).
func (m *Manager) Leader(ctx context.Context, name string) (Leader, int64, error) {
	if err := validateName(name); err != nil {
		return Leader{}, 0, err
	}
	resp, err := m.cli.Txn(ctx).Then(m.seatsOp(name), clientv3.OpGet(m.queue(name), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		clientv3.OpGet(m.prefix(name)+"revoke/", clientv3.WithPrefix(), clientv3.WithLimit(8))).Commit()
	if err != nil {
		return Leader{}, 0, fmt.Errorf("election: leader of %q: %w", name, err)
	}
	kv := first(resp.Responses[0].GetResponseRange().Kvs)
	if kv == nil {
		if len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
			m.kick(name)
		}
		return Leader{}, resp.Header.Revision, fmt.Errorf("%w: nobody leads %q", ErrNoLeader, name)
	}
	ld, err := leaderFromSeat(m.seats(name), kv)
	for _, mk := range resp.Responses[2].GetResponseRange().Kvs {
		if string(mk.Key) == m.markKey(name, ld.Term) {
			if v, ok := revoke.DecodeMark(mk.Value); ok {
				ld.RevokingSince, ld.RevokingUntil = v.Since, v.Until
			}
		}
	}
	return ld, resp.Header.Revision, err
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

// Candidates returns the campaigns waiting for the seat, in the order
// they would take it (priority, then arrival), and the revision of the
// read (linearizable).
func (m *Manager) Candidates(ctx context.Context, name string) ([]Candidate, int64, error) {
	if err := validateName(name); err != nil {
		return nil, 0, err
	}
	resp, err := m.cli.Txn(ctx).Then(m.seatsOp(name), clientv3.OpGet(m.queue(name), clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("election: candidates of %q: %w", name, err)
	}
	skip := ""
	if kv := first(resp.Responses[0].GetResponseRange().Kvs); kv != nil {
		sess, rid, _ := seatOf(m.seats(name), kv.Key)
		skip = m.campaignPrefix(name, sess, rid)
	}
	type line struct {
		e entry
		c candidate
	}
	var all []line
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		e, ok := parseEntry(m.queue(name), kv)
		if !ok || (skip != "" && strings.HasPrefix(e.key, skip)) {
			continue
		}
		var c candidate
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			return nil, 0, fmt.Errorf("election: decode %q: %w", kv.Key, err)
		}
		all = append(all, line{e, c})
	}
	slices.SortFunc(all, func(a, b line) int { return before(a.e, b.e) })
	out := make([]Candidate, 0, len(all))
	for _, x := range all {
		out = append(out, Candidate{Joined: x.e.created, Value: x.c.Value, Priority: x.e.priority, Session: x.e.session, RequestID: x.e.requestID, Enqueued: x.c.Enqueued})
	}
	return out, resp.Header.Revision, nil
}

// ValidateFence returns nil if term leads the election now, and
// ErrStaleTerm if not. The check is linearizable.
func (m *Manager) ValidateFence(ctx context.Context, name string, term fencing.Token) error {
	_, err := m.Holding(ctx, name, term)
	return err
}

// Holding implements lock.Grantor for elections: it checks that term leads
// now and returns a comparison that stays true while it keeps leading
// (its seat, created at term, exists).
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

// Count counts the elections that have a leader (a seat) and the
// candidates waiting for one, from the local member (a serializable read:
// it may trail the cluster by a moment). It reads every key of every
// election (keys only): for metrics, not for a request path.
func (m *Manager) Count(ctx context.Context) (Counts, error) {
	resp, err := m.cli.Get(ctx, m.root, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSerializable())
	if err != nil {
		return Counts{}, fmt.Errorf("election: count: %w", err)
	}
	var c Counts
	entries := 0
	for _, kv := range resp.Kvs {
		_, sub, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), m.root), "/")
		switch {
		case strings.HasPrefix(sub, "lead/"):
			c.WithLeader++
		case strings.HasPrefix(sub, "q/"):
			entries++
		}
	}
	c.Waiting = max(entries-c.WithLeader, 0) // each leader's campaign is an entry too
	return c, nil
}

// NamesIn returns the names of the elections that the entries among keys belong
// to (a session's attached keys, session.Info.Keys: the elections it
// leads or campaigns in), sorted and without repeats. Other keys are ignored.
func (m *Manager) NamesIn(keys []string) []string { return queue.NamesIn(m.root, keys) }
