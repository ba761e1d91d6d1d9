// Package barrier keeps barriers and double barriers in etcd: a barrier
// opens once a number of participants are in it at one revision (or an
// Open opens it), and a double barrier's participants leave together
// (Leave returns once none is left). A participant is a key bound to its
// session's lease: a dead participant leaves with its session.
//
// Keys, under root+"barrier/"+escaped name+"/": "p/<session>/<id>" per
// participant (its value the count it entered with and when), and "open" while the
// barrier is open. The open key is written when the count is reached (or
// by Open) and removed when the last participant leaves; one left behind
// by participants whose sessions all ended is removed by the next
// arrival, which starts a new round (one Open wrote stays until the
// participants after it have left).
//
// Guarantees: Enter returns only once the open key exists (so never before
// count participants were in at one revision, or an Open), and every
// participant waiting then sees it, since each watches from its own entry.
// Not guaranteed: that the participants counted are still alive when the
// others pass (one may end right after), nor agreement on count (each
// participant waits for its own).
package barrier

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/queue"
	"github.com/coordd/coordd/internal/session"
)

// Errors.
var (
	// ErrInvalid: a malformed or out-of-bounds argument; nothing changed.
	ErrInvalid = errkind.Invalid.New("barrier: invalid argument")
	// ErrSessionNotFound: the participant's session does not exist (or
	// ended while it waited).
	ErrSessionNotFound = errkind.SessionNotFound.New("barrier: session not found")
)

// MaxCount bounds a barrier's count.
const MaxCount = 100000

// DefaultParticipant names a session's participant when none is given.
const DefaultParticipant = "default"

// Manager enters, leaves, opens and describes barriers.
type Manager struct {
	cli  *clientv3.Client
	root string // "<root>barrier/"

	bg     queue.Background // the barriers' watches (see watch.go)
	rounds roundWatches
}

// NewManager keeps barriers under root+"barrier/".
func NewManager(cli *clientv3.Client, root string) *Manager {
	return &Manager{cli: cli, root: root + "barrier/"}
}

// Close ends every wait with an unavailable error and stops the barriers'
// watches. Call it before closing the etcd client.
func (m *Manager) Close() { m.bg.Close() }

func (m *Manager) prefix(name string) string { return m.root + names.Escape(name) + "/" }
func (m *Manager) parts(name string) string  { return m.prefix(name) + "p/" }
func (m *Manager) openKey(name string) string {
	return m.prefix(name) + "open"
}

func (m *Manager) partKey(name string, s session.ID, id string) string {
	return fmt.Sprintf("%s%016x/%s", m.parts(name), uint64(s), id)
}

func check(name string, s session.ID, id *string) error {
	if err := names.Check("barrier name", name); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if s <= 0 {
		return fmt.Errorf("%w: a session is required", ErrInvalid)
	}
	if *id == "" {
		*id = DefaultParticipant
	}
	if err := names.CheckRequestID(*id); err != nil {
		return fmt.Errorf("%w: participant: %s", ErrInvalid, err.Error())
	}
	return nil
}

// Entered says the barrier was seen open.
type Entered struct {
	Participants int
	Revision     int64
}

// Enter adds session s's participant id to the barrier and waits until it
// is open: count participants in it at one revision, or opened. When ctx
// ends first, the participant is taken out again, unless another Enter of
// the same session and id (a retry) entered it since: that call owns it.
// The member's waits on one barrier share one etcd watch (see watch.go).
func (m *Manager) Enter(ctx context.Context, name string, s session.ID, id string, count int) (Entered, error) {
	done := make(chan struct{})
	var e Entered
	var err error
	early, parked, err0 := m.EnterLater(ctx, name, s, id, count, Later{Ctx: ctx, Done: func(got Entered, gerr error) {
		e, err = got, gerr
		close(done)
	}})
	if !parked {
		return early, err0
	}
	<-done
	return e, err
}

// Later is where EnterLater gives a parked Enter's outcome.
type Later struct {
	// Ctx governs the parked wait: Enter fails with its error when it
	// ends first (taking the participant out, as Enter does). It must end
	// once Done was called.
	Ctx context.Context
	// Done is called once with the outcome, on a goroutine of the
	// manager's (it must not block).
	Done func(Entered, error)
}

// EnterLater is Enter without holding the caller's goroutine while it
// waits: it adds the participant (on the caller's goroutine, bound by
// ctx), and when the barrier is not open at once, parks the wait with the
// barrier's watch, returns parked true, and calls l.Done once with the
// outcome.
func (m *Manager) EnterLater(ctx context.Context, name string, s session.ID, id string, count int, l Later) (e Entered, parked bool, err error) {
	if err := check(name, s, &id); err != nil {
		return Entered{}, false, err
	}
	if count < 1 || count > MaxCount {
		return Entered{}, false, fmt.Errorf("%w: count must be 1 to %d", ErrInvalid, MaxCount)
	}
	key, parts, open := m.partKey(name, s, id), m.parts(name), m.openKey(name)
	// The value: the count it entered with, when (Unix ns), and this
	// call's attempt id. An Enter that gives up removes the participant
	// only if it still has this value: a retry (the same session and id)
	// that entered again since owns it.
	value := fmt.Sprintf("%d %d %s", count, time.Now().UnixNano(), names.NewRequestID())
	put := clientv3.OpPut(key, value, clientv3.WithLease(clientv3.LeaseID(s)))
	// While the barrier is not open, an arrival is one put that reads
	// nothing: the barrier's watch counts who is in (see watch.go) and
	// opens it once enough are. (Each arrival used to count everyone in,
	// and compare the whole participant range, in its own transaction:
	// O(n) in etcd's apply loop per arrival, O(n²) per round, which at a
	// few hundred arrivals on a loaded member backed its applies up for
	// seconds and starved every linearizable read behind them.)
	resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(open), "=", 0)).Then(put).Commit()
	if err == nil && !resp.Succeeded {
		resp, err = m.enterOpen(ctx, parts, open, put)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return Entered{}, false, fmt.Errorf("%w: %s", ErrSessionNotFound, s)
	}
	if err != nil {
		return Entered{}, false, fmt.Errorf("barrier: entering %q: %w", name, err)
	}
	rev := resp.Header.Revision
	if ops := resp.Responses; len(ops) >= 3 { // enterOpen's
		gotOpen, gotCount := ops[len(ops)-2].GetResponseRange(), ops[len(ops)-1].GetResponseRange()
		if len(gotOpen.Kvs) > 0 {
			return Entered{Participants: int(gotCount.Count), Revision: rev}, false, nil
		}
	}
	if count == 1 {
		e, err := m.markOpen(ctx, name, 1)
		return e, false, err
	}
	wctx := l.Ctx
	m.wait(wctx, name, &roundWait{key: key, count: count, rev: rev, then: func(e Entered, err error) {
		// A wait that failed takes its participant out, on a goroutine of
		// the manager's (Close waits for it); once the manager closes,
		// the participant goes with its session.
		if err != nil && !errors.Is(err, ErrSessionNotFound) && m.bg.TryGo(func(stop context.Context) {
			l.Done(m.giveUp(stop, name, key, value, count, e, err))
		}) {
			return
		}
		l.Done(e, err)
	}})
	return Entered{}, true, nil
}

// enterOpen is an arrival at a barrier that was open when it came. An
// open key that the count wrote with nobody in is a past round's (its
// participants' sessions ended without leaving): this arrival removes it
// and starts a new round. One that Open wrote stays: it lets arrivals in.
// Deciding that compares every participant, so it is only done here, for
// the few arrivals that find the barrier open. The answer holds the put,
// the open key and the number of participants (its last two responses)
// whichever branch ran.
func (m *Manager) enterOpen(ctx context.Context, parts, open string, put clientv3.Op) (*clientv3.TxnResponse, error) {
	return m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(parts).WithPrefix(), "=", 0), clientv3.Compare(clientv3.Value(open), "!=", openedByHand)).
		Then(clientv3.OpDelete(open), put, clientv3.OpGet(open), clientv3.OpGet(parts, clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Else(put, clientv3.OpGet(open), clientv3.OpGet(parts, clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Commit()
}

// giveUp takes out a participant whose wait failed with err, unless the
// barrier opened meanwhile (then it entered after all); it gives up
// itself after 5 s or when stop ends.
func (m *Manager) giveUp(stop context.Context, name, key, value string, count int, e Entered, err error) (Entered, error) {
	dctx, cancel := context.WithTimeout(stop, 5*time.Second)
	defer cancel()
	if r, gerr := m.cli.Get(dctx, m.openKey(name), clientv3.WithCountOnly()); gerr == nil && r.Count > 0 {
		return Entered{Participants: count, Revision: r.Header.Revision}, nil
	}
	// Best effort: it goes with the session anyway.
	_, _ = m.cli.Txn(dctx).If(clientv3.Compare(clientv3.Value(key), "=", value)).Then(clientv3.OpDelete(key)).Commit()
	return e, err
}

// openedByHand is the open key's value when Open wrote it; the count
// writes the number of participants in.
const openedByHand = "open"

// markOpen writes the open key (if no one did yet) with value.
func (m *Manager) markOpen(ctx context.Context, name string, participants int) (Entered, error) {
	return m.writeOpen(ctx, name, participants, strconv.Itoa(participants))
}

func (m *Manager) writeOpen(ctx context.Context, name string, participants int, value string) (Entered, error) {
	open := m.openKey(name)
	resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(open), "=", 0)).Then(clientv3.OpPut(open, value)).Commit()
	if err != nil {
		return Entered{}, fmt.Errorf("barrier: opening %q: %w", name, err)
	}
	return Entered{Participants: participants, Revision: resp.Header.Revision}, nil
}

// Leave takes session s's participant id out of the barrier and waits
// until no participant is left; the last one out closes the barrier for
// the next round. The participant is out even when ctx ends first.
func (m *Manager) Leave(ctx context.Context, name string, s session.ID, id string) (int64, error) {
	done := make(chan struct{})
	var rev int64
	var err error
	early, parked, err0 := m.LeaveLater(ctx, name, s, id, Leaving{Ctx: ctx, Done: func(r int64, e error) {
		rev, err = r, e
		close(done)
	}})
	if !parked {
		return early, err0
	}
	<-done
	return rev, err
}

// Leaving is where a parked Leave gives its outcome: the revision at
// which nobody was in, or the error.
type Leaving struct {
	Ctx  context.Context // governs the parked wait; must end once Done was called
	Done func(int64, error)
}

// LeaveLater is Leave without holding the caller's goroutine while it
// waits: it takes the participant out (on the caller's goroutine) and
// parks the wait with the barrier's watch, which closes the barrier once
// nobody is in (one write for all the leavers), returns parked true and
// calls l.Done once. It returns parked false only with an error.
func (m *Manager) LeaveLater(ctx context.Context, name string, s session.ID, id string, l Leaving) (rev int64, parked bool, err error) {
	if err := check(name, s, &id); err != nil {
		return 0, false, err
	}
	// A delete that counts nothing: the barrier's watch sees when nobody
	// is left (for the last leaver too) and closes the round. (Counting
	// the rest in the same transaction walked etcd's index of every
	// participant per leave: O(n²) per round.)
	resp, err := m.cli.Delete(ctx, m.partKey(name, s, id))
	if err != nil {
		return 0, false, fmt.Errorf("barrier: leaving %q: %w", name, err)
	}
	m.wait(l.Ctx, name, &roundWait{leave: true, rev: resp.Header.Revision, then: func(e Entered, err error) { l.Done(e.Revision, err) }})
	return 0, true, nil
}

// closeRound closes the barrier once everyone is out, unless a new round
// began.
func (m *Manager) closeRound(ctx context.Context, name string) error {
	if _, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(m.parts(name)).WithPrefix(), "=", 0)).Then(clientv3.OpDelete(m.openKey(name))).Commit(); err != nil {
		return fmt.Errorf("barrier: closing %q: %w", name, err)
	}
	return nil
}

// Open opens the barrier now, however many participants are in it. It
// stays open until its participants have left (Leave): opened with nobody
// in, it lets the next arrivals through.
func (m *Manager) Open(ctx context.Context, name string) (int64, error) {
	if err := names.Check("barrier name", name); err != nil {
		return 0, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	r, err := m.cli.Get(ctx, m.parts(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("barrier: opening %q: %w", name, err)
	}
	e, err := m.writeOpen(ctx, name, int(r.Count), openedByHand)
	return e.Revision, err
}

// Participant is one participant of a barrier.
type Participant struct {
	Session session.ID
	ID      string
	Count   int
	Entered time.Time // when it entered (the entering member's clock)
}

// State is a barrier's state at one revision.
type State struct {
	Open         bool
	Participants []Participant // one page of them, in the order they entered
	Count        int           // participants in, on every page
	Revision     int64
	// Next, when not 0, is where the next page starts (Page.After).
	Next int64
}

// Page selects a page of a barrier's participants.
type Page struct {
	// After is the previous page's State.Next (0: the first page).
	After int64
	// Size is the most participants to return: 1 to MaxPage,
	// DefaultPage when 0.
	Size int
}

// Page sizes.
const (
	DefaultPage = 100
	MaxPage     = 1000
)

// Describe reads a barrier's state with its first MaxPage participants
// (linearizable).
func (m *Manager) Describe(ctx context.Context, name string) (State, error) {
	return m.DescribePage(ctx, name, Page{Size: MaxPage})
}

// DescribePage reads whether a barrier is open, how many participants are
// in, and one page of them in the order they entered, in one linearizable
// read. It costs etcd a walk of the participants' index (to count and to
// order them), but returns and decodes one page, however many are in.
func (m *Manager) DescribePage(ctx context.Context, name string, p Page) (State, error) {
	if err := names.Check("barrier name", name); err != nil {
		return State{}, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if p.Size == 0 {
		p.Size = DefaultPage
	}
	if p.Size < 1 || p.Size > MaxPage || p.After < 0 {
		return State{}, fmt.Errorf("%w: a page holds 1 to %d participants", ErrInvalid, MaxPage)
	}
	parts := m.parts(name)
	page := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(p.Size) + 1)}
	if p.After > 0 {
		page = append(page, clientv3.WithMinCreateRev(p.After+1))
	}
	resp, err := m.cli.Txn(ctx).Then(
		clientv3.OpGet(m.openKey(name), clientv3.WithCountOnly()),
		clientv3.OpGet(parts, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(parts, page...),
	).Commit()
	if err != nil {
		return State{}, fmt.Errorf("barrier: reading %q: %w", name, err)
	}
	st := State{
		Revision: resp.Header.Revision,
		Open:     resp.Responses[0].GetResponseRange().Count > 0,
		Count:    int(resp.Responses[1].GetResponseRange().Count),
	}
	kvs := resp.Responses[2].GetResponseRange().Kvs
	if len(kvs) > p.Size {
		kvs = kvs[:p.Size]
		st.Next = kvs[len(kvs)-1].CreateRevision
	}
	for _, kv := range kvs {
		sid, id, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), parts), "/")
		n, _ := strconv.ParseUint(sid, 16, 64)
		// "<count> <unix ns> <attempt>" (older coordd: no attempt).
		fields := append(strings.Fields(string(kv.Value)), "", "")
		c, _ := strconv.Atoi(fields[0])
		ns, _ := strconv.ParseInt(fields[1], 10, 64)
		st.Participants = append(st.Participants, Participant{Session: session.ID(n), ID: id, Count: c, Entered: time.Unix(0, ns).UTC()})
	}
	return st, nil
}
