package history_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/history"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const root = "/coordd/"

type env struct {
	cli       *clientv3.Client
	local     history.LocalStore // the member's store: recorders read it, unless overGRPC
	overGRPC  bool               // recorders read a gRPC watch (as with an etcd of its own)
	locks     *lock.Manager
	elections *election.Manager
	sessions  *session.Manager
	store     *history.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	m := etcdtest.Start(t)
	cli := m.Client(t)
	locks := lock.NewManager(cli, root, etcdtest.Watcher(t, cli, root+"lock/"), nil)
	elections := election.NewManager(cli, root, etcdtest.Watcher(t, cli, root+"election/"), nil)
	t.Cleanup(func() { locks.Close(); elections.Close() })
	return &env{cli: cli, local: m.Etcd.Server.KV(), locks: locks, elections: elections, sessions: session.NewManager(cli, root), store: history.NewStore(cli, root)}
}

// record runs a recorder until it is stopped (or the test ends).
func (e *env) record(t *testing.T, opts history.Options, tweak ...func(*history.Recorder)) (stop func()) {
	t.Helper()
	if opts.Local == nil && !e.overGRPC {
		opts.Local = e.local
	}
	r := history.NewRecorder(e.cli, root, opts, zaptest.NewLogger(t))
	var before int64
	if resp, err := e.cli.Get(t.Context(), root+"timeline/cursor"); err == nil && len(resp.Kvs) == 1 {
		before = resp.Kvs[0].ModRevision
	}
	for _, f := range tweak {
		f(r)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	// A first recorder starts at the revision it finds: wait for it, so
	// that what the test does next is recorded.
	wait.For(t, "the recorder's first cursor", func() bool {
		resp, err := e.cli.Get(t.Context(), root+"timeline/cursor")
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision != before
	})
	return stop
}

func (e *env) session(t *testing.T, owner string) session.ID {
	t.Helper()
	info, err := e.sessions.Create(t.Context(), session.Spec{TTL: 30 * time.Second, Owner: owner, Hostname: "host-" + owner})
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// list returns every event q selects, page after page.
func (e *env) list(t *testing.T, q history.Query) []history.Event {
	t.Helper()
	var out []history.Event
	for {
		evs, next, err := e.store.List(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
		if next == "" {
			return out
		}
		q.PageToken = next
	}
}

// brief is an event in a line: type, token, owner and hand-off.
func brief(evs []history.Event) []string {
	var out []string
	for _, e := range evs {
		s := fmt.Sprintf("%s %s %d %s", e.Type, e.Name, e.Token, e.Owner)
		if e.HandedFrom != 0 {
			s += fmt.Sprintf(" from %d", e.HandedFrom)
		}
		out = append(out, s)
	}
	return out
}

// waitFor waits until the history of kind and name is want (in brief).
func (e *env) waitFor(t *testing.T, k history.Kind, name string, want []string) {
	t.Helper()
	var got []string
	wait.Within(t, 15*time.Second, "the history of "+name, func() bool {
		got = brief(e.list(t, history.Query{Kind: k, Name: name}))
		return slices.Equal(got, want) || len(got) > len(want)
	})
	if !slices.Equal(got, want) {
		t.Fatalf("history of %s:\n got %q\nwant %q", name, got, want)
	}
}

// The recorder reads etcd's events from the member's own store when it
// runs beside it (the daemon's embedded member), else through a gRPC
// watch: both record the same.
func TestRecordsGrantsHandOffsAndEnds(t *testing.T) {
	t.Parallel()
	for _, overGRPC := range []bool{false, true} {
		t.Run(map[bool]string{false: "from the member's store", true: "through a gRPC watch"}[overGRPC], func(t *testing.T) {
			t.Parallel()
			recordsGrantsHandOffsAndEnds(t, overGRPC)
		})
	}
}

func recordsGrantsHandOffsAndEnds(t *testing.T, overGRPC bool) {
	e := newEnv(t)
	e.overGRPC = overGRPC
	e.record(t, history.Options{Member: "m1"})
	ctx := t.Context()
	alice, bob := e.session(t, "alice"), e.session(t, "bob")

	g1, err := e.locks.Acquire(ctx, lock.Request{Name: "jobs/a", Session: alice})
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan lock.Grant, 1)
	go func() {
		g, err := e.locks.Acquire(ctx, lock.Request{Name: "jobs/a", Session: bob})
		if err != nil {
			t.Error(err)
		}
		granted <- g
	}()
	wait.For(t, "bob to queue", func() bool {
		d, err := e.locks.Describe(ctx, "jobs/a")
		return err == nil && len(d.Waiters) == 1
	})
	if err := e.locks.Release(ctx, "jobs/a", g1.Token, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	g2 := <-granted
	if err := e.sessions.Close(ctx, bob); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, history.Lock, "jobs/a", []string{
		fmt.Sprintf("GRANTED jobs/a %d alice", g1.Token),
		fmt.Sprintf("RELEASED jobs/a %d alice", g1.Token),
		fmt.Sprintf("GRANTED jobs/a %d bob from %d", g2.Token, g1.Token),
		fmt.Sprintf("SESSION_CLOSED jobs/a %d bob", g2.Token),
	})

	l, err := e.elections.Campaign(ctx, election.Request{Name: "jobs/leader", Session: alice, Value: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.elections.Resign(ctx, "jobs/leader", l.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, history.Election, "jobs/leader", []string{
		fmt.Sprintf("ELECTED jobs/leader %d alice", l.Term),
		fmt.Sprintf("RESIGNED jobs/leader %d alice", l.Term),
	})

	t.Run("details", func(t *testing.T) {
		evs := e.list(t, history.Query{Kind: history.Lock, Name: "jobs/a"})
		if evs[2].Waited <= 0 || evs[1].Held <= 0 || evs[2].Hostname != "host-bob" || evs[2].Session != bob.String() || evs[2].RequestID == "" {
			t.Fatalf("bob's grant lacks details: %+v (alice's release: %+v)", evs[2], evs[1])
		}
		if !strings.Contains(evs[3].Reason, "closed") {
			t.Fatalf("reason %q does not say the session was closed", evs[3].Reason)
		}
	})
	t.Run("by owner, paged, newest first, by time", func(t *testing.T) {
		got := brief(e.list(t, history.Query{Kind: history.Lock, Owner: "bob", Limit: 1}))
		want := []string{fmt.Sprintf("GRANTED jobs/a %d bob from %d", g2.Token, g1.Token), fmt.Sprintf("SESSION_CLOSED jobs/a %d bob", g2.Token)}
		if !slices.Equal(got, want) {
			t.Fatalf("bob's lock events: got %q, want %q", got, want)
		}
		all := e.list(t, history.Query{Kind: history.Lock, Name: "jobs/a", Limit: 3})
		rev := e.list(t, history.Query{Kind: history.Lock, Name: "jobs/a", NewestFirst: true, Limit: 1})
		slices.Reverse(rev)
		if !slices.Equal(brief(all), brief(rev)) {
			t.Fatalf("newest first, reversed: %q; oldest first: %q", brief(rev), brief(all))
		}
		since := e.list(t, history.Query{Kind: history.Lock, Name: "jobs/a", Since: all[3].Time})
		until := e.list(t, history.Query{Kind: history.Lock, Name: "jobs/a", Until: all[3].Time})
		if !slices.Equal(brief(since), brief(all[3:])) || !slices.Equal(brief(until), brief(all[:3])) {
			t.Fatalf("since %s: %q; until: %q", all[3].Time, brief(since), brief(until))
		}
	})
	t.Run("bad queries", func(t *testing.T) {
		for _, q := range []history.Query{
			{Kind: "queue"},
			{Kind: history.Lock, Name: "a//b"},
			{Kind: history.Lock, Limit: 1001},
			{Kind: history.Lock, PageToken: "not-a-token"},
			{Kind: history.Lock, Since: time.Now(), Until: time.Now().Add(-time.Hour)},
		} {
			if _, _, err := e.store.List(ctx, q); err == nil || !strings.Contains(err.Error(), "invalid") {
				t.Errorf("%+v: got %v, want an invalid-argument error", q, err)
			}
		}
	})
}

// churn takes and releases lock name n times.
func (e *env) churn(t *testing.T, s session.ID, name string, n int) {
	t.Helper()
	for range n {
		g, err := e.locks.Acquire(t.Context(), lock.Request{Name: name, Session: s})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.locks.Release(t.Context(), name, g.Token, session.Hint{}); err != nil {
			t.Fatal(err)
		}
	}
}

// missedWhileStopped runs the scenario of a recorder that stops, misses
// three grants, and starts again (on "another member"); it returns how
// many of the lock's 10 events the history lacks, and fails the test on
// an event recorded twice.
func missedWhileStopped(t *testing.T, tweak ...func(*history.Recorder)) int {
	e := newEnv(t)
	s := e.session(t, "worker")
	stop := e.record(t, history.Options{Member: "m1"}, tweak...)
	e.churn(t, s, "resume", 2)
	wait.For(t, "the first four events", func() bool { return len(e.list(t, history.Query{Kind: history.Lock, Name: "resume"})) == 4 })
	stop()
	e.churn(t, s, "resume", 3) // nobody records
	e.record(t, history.Options{Member: "m2"}, tweak...)
	e.churn(t, s, "mark", 1)
	wait.For(t, "the marker's events", func() bool { return len(e.list(t, history.Query{Kind: history.Lock, Name: "mark"})) == 2 })
	evs := e.list(t, history.Query{Kind: history.Lock, Name: "resume"})
	seen := map[string]bool{}
	for _, s := range brief(evs) {
		if seen[s] {
			t.Fatalf("%q recorded twice: %q", s, brief(evs))
		}
		seen[s] = true
	}
	return 10 - len(evs)
}

// The core rule: a recorder resumes from the cursor, so a restart or a
// move to another member loses nothing. Switched off (starting from the
// current revision), the same check finds the events it missed.
func TestAnotherRecorderResumesWhereTheLastStopped(t *testing.T) {
	t.Parallel()
	if n := missedWhileStopped(t); n != 0 {
		t.Fatalf("the history lost %d events while no recorder ran", n)
	}
	t.Run("switched off", func(t *testing.T) {
		if n := missedWhileStopped(t, history.StartFromNow); n != 6 {
			t.Fatalf("without resuming, the history lost %d events, want 6: the check cannot fail", n)
		}
	})
}

// A revision with more events than one batch holds is written in parts,
// each with a cursor inside the revision; a recorder that starts between
// parts derives the revision again and writes only the rest.
func TestALargeRevisionIsRecordedOnceAcrossARestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.session(t, "fleet")
	const batch, n = 60, 70
	for i := range n {
		if _, err := e.locks.Acquire(t.Context(), lock.Request{Name: fmt.Sprintf("part/%03d", i), Session: s}); err != nil {
			t.Fatal(err)
		}
	}
	small := func(r *history.Recorder) { history.SetBatchEvents(r, batch) }
	stop := e.record(t, history.Options{Member: "m1"}, small)
	if err := e.sessions.Close(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	closed := func() []history.Event {
		var out []history.Event
		for _, ev := range e.list(t, history.Query{Kind: history.Lock}) {
			if ev.Type == history.SessionClosed {
				out = append(out, ev)
			}
		}
		return out
	}
	wait.For(t, "every lock's end", func() bool { return len(closed()) == n })
	stop()
	// As if the recorder had stopped after the first batch: the cursor
	// inside the revision, the second batch not written.
	evs := closed()
	cur := fmt.Sprintf(`{"rev":%d,"seq":%d,"time":%q,"count":%d}`, evs[0].Revision, batch, evs[batch-1].Time.Format(time.RFC3339Nano), batch)
	resp, err := e.cli.Get(t.Context(), root+"timeline/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	ops := []clientv3.Op{clientv3.OpPut(root+"timeline/cursor", cur)}
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), fmt.Sprintf("-%04x", batch)) { // the second batch starts at seq 60
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
	}
	if len(ops) != 1+1+n-batch { // the cursor, t/, and one n/ key per lock
		t.Fatalf("found %d keys of the second batch, want %d: the test's set-up is wrong", len(ops)-1, 1+n-batch)
	}
	if _, err := e.cli.Txn(t.Context()).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	if got := len(closed()); got != batch {
		t.Fatalf("%d ends left, want %d: the test's set-up is wrong", got, batch)
	}
	e.record(t, history.Options{Member: "m2"}, small)
	e.churn(t, e.session(t, "m"), "mark", 1)
	wait.For(t, "the marker's events", func() bool { return len(e.list(t, history.Query{Kind: history.Lock, Name: "mark"})) == 2 })
	if got := len(closed()); got != n {
		t.Fatalf("%d ends recorded, want %d", got, n)
	}
	for i := range n {
		if got := len(e.list(t, history.Query{Kind: history.Lock, Name: fmt.Sprintf("part/%03d", i)})); got != 1 {
			t.Fatalf("part/%03d has %d events by name, want its end alone", i, got)
		}
	}
}

func TestOldEventsAreRemoved(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.session(t, "w")
	e.record(t, history.Options{Member: "m1", MaxRecords: 6, Floor: -1, PruneEvery: 20 * time.Millisecond})
	var last lock.Grant
	for range 10 {
		g, err := e.locks.Acquire(t.Context(), lock.Request{Name: "bounded", Session: s})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.locks.Release(t.Context(), "bounded", g.Token, session.Hint{}); err != nil {
			t.Fatal(err)
		}
		last = g
	}
	// Whole batches go: at most 6 events are kept, the newest among them,
	// alike in time order and by name.
	var byName, all []history.Event
	wait.For(t, "the history to shrink to the newest 6 or fewer", func() bool {
		byName = e.list(t, history.Query{Kind: history.Lock, Name: "bounded"})
		all = e.list(t, history.Query{Kind: history.Lock})
		n := len(byName)
		return n > 0 && n <= 6 && byName[n-1].Type == history.Released && byName[n-1].Token == int64(last.Token)
	})
	if !slices.Equal(brief(byName), brief(all)) {
		t.Fatalf("by name %q, in time order %q: pruning left one without the other", brief(byName), brief(all))
	}
}

// A recorder that cannot resume (etcd compacted its cursor's revision)
// says so with a GAP event instead of pretending nothing happened.
func TestAGapIsRecordedWhenEtcdCompactedWhatNobodyRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.session(t, "w")
	stop := e.record(t, history.Options{Member: "m1"})
	e.churn(t, s, "gap", 1)
	wait.For(t, "the first events", func() bool { return len(e.list(t, history.Query{Kind: history.Lock, Name: "gap"})) == 2 })
	stop()
	e.churn(t, s, "gap", 2)
	resp, err := e.cli.Get(t.Context(), "nothing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Compact(t.Context(), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	e.record(t, history.Options{Member: "m2"})
	var gaps []history.Event
	wait.For(t, "a gap", func() bool {
		gaps = slices.DeleteFunc(e.list(t, history.Query{Kind: history.Election}), func(ev history.Event) bool { return ev.Type != history.Gap })
		return len(gaps) == 1
	})
	if g := gaps[0]; g.FromRevision <= 0 || g.Revision < resp.Header.Revision || g.FromRevision > g.Revision {
		t.Fatalf("gap %+v, want one that covers %d", g, resp.Header.Revision)
	}
}

// Events with the longest names, owners and hosts, recorded after a
// pause (so that a thousand of them wait to be written at once), all
// reach the history: every batch stays under etcd's request limit.
// Without the byte bound, the first batch is over it, and the recorder
// fails on it for ever.
func TestLongEventsStayUnderTheRequestLimit(t *testing.T) {
	t.Parallel()
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprint("bounded=", bounded), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			info, err := e.sessions.Create(t.Context(), session.Spec{TTL: 60 * time.Second,
				Owner: strings.Repeat("o", session.MaxOwnerBytes), Hostname: strings.Repeat("h", session.MaxHostnameBytes)})
			if err != nil {
				t.Fatal(err)
			}
			name := strings.Repeat("n", 250)
			tweak := func(r *history.Recorder) {
				// These events compress to almost nothing; written as
				// they are, they stand for events that do not compress
				// (distinct long owners, hosts and names).
				history.WriteUncompressed(r)
				if !bounded {
					history.SetBatchBytes(r, 0)
				}
			}
			stop := e.record(t, history.Options{Member: "m1"}, tweak)
			stop()
			e.churn(t, info.ID, name, 600) // 1,200 events wait for the next recorder: about 2.2 MB in one batch
			e.record(t, history.Options{Member: "m2"}, tweak)
			all := func() int {
				n, token := 0, ""
				for {
					evs, next, err := e.store.List(t.Context(), history.Query{Kind: history.Lock, Name: name, Limit: 1000, PageToken: token})
					if err != nil {
						t.Fatal(err)
					}
					n += len(evs)
					if token = next; token == "" {
						return n
					}
				}
			}
			if bounded {
				wait.Within(t, 10*time.Second, "all 1,200 events", func() bool { return all() == 1200 })
				return
			}
			// Unbounded, the events must not all arrive: the recorder
			// fails on its first batch, again and again. A bounded
			// recorder records them in well under these 5 s.
			deadline := time.Now().Add(5 * time.Second)
			for all() != 1200 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if got := all(); got == 1200 {
				t.Fatal("without the byte bound every event was recorded too: the test cannot catch an oversized batch")
			}
		})
	}
}

// Batches are stored compressed; those written before (plain JSON) are
// read beside them, by time and by name, and pruned like them.
func TestBatchesWrittenBeforeCompressionAreRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.session(t, "w")
	stop := e.record(t, history.Options{Member: "old"}, history.WriteUncompressed)
	e.churn(t, s, "mixed", 2)
	wait.For(t, "the plain batches", func() bool { return len(e.list(t, history.Query{Kind: history.Lock, Name: "mixed"})) == 4 })
	stop()
	e.record(t, history.Options{Member: "new", MaxRecords: 8, Floor: -1, PruneEvery: 20 * time.Millisecond})
	e.churn(t, s, "mixed", 2)
	var want []string
	for range 4 {
		want = append(want, "GRANTED mixed", "RELEASED mixed")
	}
	short := func(evs []history.Event) []string {
		var out []string
		for _, ev := range evs {
			out = append(out, fmt.Sprintf("%s %s", ev.Type, ev.Name))
		}
		return out
	}
	wait.For(t, "eight events by name and in time order", func() bool {
		return slices.Equal(short(e.list(t, history.Query{Kind: history.Lock, Name: "mixed"})), want) &&
			slices.Equal(short(e.list(t, history.Query{Kind: history.Lock})), want)
	})
	batches := func() (plain, packed int) {
		resp, err := e.cli.Get(t.Context(), root+"timeline/t/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if kv.Value[0] == '[' {
				plain++
			} else {
				packed++
			}
		}
		return plain, packed
	}
	if plain, packed := batches(); plain == 0 || packed == 0 {
		t.Fatalf("%d plain and %d compressed batches: the test needs both", plain, packed)
	}
	// Over MaxRecords, the oldest (plain) batches go first.
	e.churn(t, s, "mixed", 2)
	wait.For(t, "the plain batches pruned", func() bool {
		plain, packed := batches()
		n := len(e.list(t, history.Query{Kind: history.Lock, Name: "mixed"}))
		return plain == 0 && packed > 0 && n > 0 && n <= 8
	})
}

// principalSession is a session of principal p.
func (e *env) principalSession(t *testing.T, p string) session.ID {
	t.Helper()
	info, err := e.sessions.Create(t.Context(), session.Spec{TTL: 30 * time.Second, Owner: p, Principal: p})
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// cycles takes and releases lock name n times in session s, and returns
// the last grant's token.
func (e *env) cycles(t *testing.T, s session.ID, name string, n int) int64 {
	t.Helper()
	var last lock.Grant
	for range n {
		g, err := e.locks.Acquire(t.Context(), lock.Request{Name: name, Session: s})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.locks.Release(t.Context(), name, g.Token, session.Hint{}); err != nil {
			t.Fatal(err)
		}
		last = g
	}
	return int64(last.Token)
}

// One tenant's flood of grants pushes every older event out of the
// timeline of all names, but another tenant's lock keeps its newest
// events (its floor) until the retention ends them.
func TestAFloodLeavesEveryNameItsNewestEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var skew atomic.Int64 // how far the recorder's clock runs ahead
	e.record(t, history.Options{Member: "m1", MaxRecords: 8, Floor: 4, Retention: time.Hour, PruneEvery: 20 * time.Millisecond},
		func(r *history.Recorder) {
			history.SetNow(r, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
		})
	quietLast := e.cycles(t, e.principalSession(t, "quiet"), "quiet/job", 3)
	wait.For(t, "the quiet lock's six events", func() bool {
		return len(e.list(t, history.Query{Kind: history.Lock, Name: "quiet/job"})) == 6
	})
	floodLast := e.cycles(t, e.principalSession(t, "flood"), "flood/job", 20)
	var quiet []history.Event
	wait.For(t, "the flood to push the quiet lock out of the timeline", func() bool {
		all := e.list(t, history.Query{Kind: history.Lock})
		quiet = e.list(t, history.Query{Kind: history.Lock, Name: "quiet/job"})
		n := len(all)
		return n > 0 && n <= 8 && all[n-1].Token == floodLast && all[n-1].Type == history.Released &&
			!slices.ContainsFunc(all, func(ev history.Event) bool { return ev.Name == "quiet/job" })
	})
	if n := len(quiet); n < 4 || quiet[n-1].Type != history.Released || quiet[n-1].Token != quietLast {
		t.Fatalf("the quiet lock's history after the flood: %q; want at least its newest 4 events, ending with the release of %d", brief(quiet), quietLast)
	}

	// Past the retention, the floor goes too.
	skew.Store(int64(2 * time.Hour))
	wait.For(t, "the floor to go with the retention", func() bool {
		quiet = e.list(t, history.Query{Kind: history.Lock, Name: "quiet/job"})
		resp, err := e.cli.Get(t.Context(), root+"timeline/f/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return len(quiet) == 0 && err == nil && resp.Count == 0
	})
}

// A principal holds at most FloorNames floors: one that makes many names
// keeps floors for that many, and another principal's floor stays.
func TestEachPrincipalHoldsItsShareOfFloors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.record(t, history.Options{Member: "m1", MaxRecords: 8, Floor: 2, FloorNames: 2, PruneEvery: 20 * time.Millisecond})
	many := e.principalSession(t, "many")
	for _, name := range []string{"many/1", "many/2", "many/3"} {
		e.cycles(t, many, name, 1)
	}
	e.cycles(t, e.principalSession(t, "other"), "other/1", 1)
	wait.For(t, "every lock's grant and release", func() bool {
		return len(e.list(t, history.Query{Kind: history.Lock})) == 8
	})
	floodLast := e.cycles(t, e.principalSession(t, "flood"), "flood/job", 20)
	wait.For(t, "the flood to push the others out of the timeline", func() bool {
		all := e.list(t, history.Query{Kind: history.Lock})
		n := len(all)
		return n > 0 && n <= 8 && all[n-1].Token == floodLast &&
			!slices.ContainsFunc(all, func(ev history.Event) bool { return ev.Name != "flood/job" })
	})
	kept := 0
	for _, name := range []string{"many/1", "many/2", "many/3"} {
		if len(e.list(t, history.Query{Kind: history.Lock, Name: name})) > 0 {
			kept++
		}
	}
	if kept != 2 {
		t.Errorf("principal many keeps the history of %d of its 3 locks; want its share, 2", kept)
	}
	if got := brief(e.list(t, history.Query{Kind: history.Lock, Name: "other/1"})); len(got) != 2 {
		t.Errorf("another principal's lock kept %q; want its grant and release", got)
	}
}
