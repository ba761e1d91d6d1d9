package election_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	m   *election.Manager
	cli *clientv3.Client
}

func newEnv(t *testing.T) env {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	w := etcdtest.Watcher(t, cli, "/coordd/election/")
	txns := groupcommit.New(cli)
	m := election.NewManager(cli, "/coordd/", w, txns)
	t.Cleanup(func() { m.Close(); txns.Close() })
	return env{m: m, cli: cli}
}

// session grants a lease of ttl seconds that nobody keeps alive.
func (e env) session(t *testing.T, ttl int64) session.ID {
	t.Helper()
	l, err := e.cli.Grant(t.Context(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return session.ID(l.ID)
}

type result struct {
	l   election.Leadership
	err error
}

// campaign starts a Campaign in the background.
func (e env) campaign(ctx context.Context, req election.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := e.m.Campaign(ctx, req)
		ch <- result{l, err}
	}()
	return ch
}

// waitCandidates waits until n candidates wait behind the leader.
func (e env) waitCandidates(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, _, err := e.m.Candidates(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if len(c) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d candidates wait, want %d", len(c), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCampaignProclaimResign(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if _, _, err := e.m.Leader(ctx, "jobs"); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader of an empty election = %v, want ErrNoLeader", err)
	}
	s1, s2, s3 := e.session(t, 30), e.session(t, 30), e.session(t, 30)
	a, err := e.m.Campaign(ctx, election.Request{Name: "jobs", Session: s1, Value: "a:1"})
	if err != nil || a.Term <= 0 {
		t.Fatalf("Campaign = %+v, %v", a, err)
	}
	bc := e.campaign(ctx, election.Request{Name: "jobs", Session: s2, Value: "b:1"})
	e.waitCandidates(t, "jobs", 1)
	cc := e.campaign(ctx, election.Request{Name: "jobs", Session: s3, Value: "c:1"})
	e.waitCandidates(t, "jobs", 2)
	cands, _, err := e.m.Candidates(ctx, "jobs")
	if err != nil || len(cands) != 2 || cands[0].Value != "b:1" || cands[1].Value != "c:1" || cands[0].Joined >= cands[1].Joined {
		t.Fatalf("Candidates = %+v, %v", cands, err)
	}

	ld, _, err := e.m.Leader(ctx, "jobs")
	if err != nil || ld.Term != a.Term || ld.Value != "a:1" || ld.Session != s1 || ld.Since.IsZero() {
		t.Fatalf("Leader = %+v, %v", ld, err)
	}
	if _, err := e.m.Proclaim(ctx, "jobs", a.Term, "a:2", ""); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	if ld, _, _ := e.m.Leader(ctx, "jobs"); ld.Value != "a:2" || ld.Proclaims != 1 {
		t.Fatalf("Leader after Proclaim = %+v", ld)
	}
	// A proclamation repeated with its id (a retry after a lost answer)
	// is made once; another id proclaims again.
	rev, err := e.m.Proclaim(ctx, "jobs", a.Term, "a:3", "p-1")
	if err != nil {
		t.Fatalf("Proclaim with an id: %v", err)
	}
	if again, err := e.m.Proclaim(ctx, "jobs", a.Term, "a:3", "p-1"); err != nil || again != rev {
		t.Fatalf("repeated Proclaim = %d, %v; want %d (the first one's revision)", again, err, rev)
	}
	if ld, _, _ := e.m.Leader(ctx, "jobs"); ld.Value != "a:3" || ld.Proclaims != 2 {
		t.Fatalf("Leader after a repeated Proclaim = %+v, want value a:3 proclaimed twice in all", ld)
	}
	if _, err := e.m.Proclaim(ctx, "jobs", a.Term, "a:3", "p-2"); err != nil {
		t.Fatal(err)
	}
	if ld, _, _ := e.m.Leader(ctx, "jobs"); ld.Proclaims != 3 {
		t.Fatalf("Leader after a Proclaim with a new id = %+v, want 3 proclamations", ld)
	}
	if _, err := e.m.Proclaim(ctx, "jobs", fencing.Token(cands[0].Joined), "b:2", ""); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Proclaim by a waiting candidate = %v, want ErrNotLeader", err)
	}
	// A waiting candidate cannot resign, with or without naming its
	// campaign (one transaction then compares that nobody is ahead), and
	// the leader's term with another campaign's name resigns nothing.
	waiting := session.Hint{Session: cands[0].Session, RequestID: cands[0].RequestID}
	for _, h := range []session.Hint{{}, waiting} {
		if err := e.m.Resign(ctx, "jobs", fencing.Token(cands[0].Joined), h); !errors.Is(err, election.ErrNotLeader) {
			t.Fatalf("Resign by a waiting candidate (hint %+v) = %v, want ErrNotLeader", h, err)
		}
	}
	if err := e.m.Resign(ctx, "jobs", a.Term, waiting); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Resign of the leader's term naming another campaign = %v, want ErrNotLeader", err)
	}
	if err := e.m.Resign(ctx, "jobs", a.Term, session.Hint{Session: cands[0].Session}); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Resign of the leader's term naming another session and no request id = %v, want ErrNotLeader", err)
	}
	if c, _, err := e.m.Candidates(ctx, "jobs"); err != nil || len(c) != 2 {
		t.Fatalf("candidates after refused resignations: %+v, %v", c, err)
	}
	if err := e.m.ValidateFence(ctx, "jobs", a.Term); err != nil {
		t.Fatalf("ValidateFence of the leader: %v", err)
	}

	if err := e.m.Resign(ctx, "jobs", a.Term, session.Hint{Session: a.Session, RequestID: a.RequestID}); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	b := <-bc
	if b.err != nil || b.l.Term <= a.Term || b.l.Value != "b:1" {
		t.Fatalf("next Campaign = %+v, %v", b.l, b.err)
	}
	// The old term can do nothing any more.
	if err := e.m.Resign(ctx, "jobs", a.Term, session.Hint{}); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("second Resign = %v, want ErrNotLeader", err)
	}
	if _, err := e.m.Proclaim(ctx, "jobs", a.Term, "late", ""); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Proclaim by a resigned term = %v, want ErrNotLeader", err)
	}
	if err := e.m.ValidateFence(ctx, "jobs", a.Term); !errors.Is(err, election.ErrStaleTerm) {
		t.Fatalf("ValidateFence of a resigned term = %v, want ErrStaleTerm", err)
	}
	// Expiry hands over too.
	if _, err := e.cli.Revoke(ctx, clientv3.LeaseID(s2)); err != nil {
		t.Fatal(err)
	}
	c := <-cc
	if c.err != nil || c.l.Term <= b.l.Term {
		t.Fatalf("Campaign after expiry = %+v, %v", c.l, c.err)
	}
	if ld, _, _ := e.m.Leader(ctx, "jobs"); ld.Term != c.l.Term || ld.Since.Before(ld.Since) {
		t.Fatalf("Leader = %+v, want term %d", ld, c.l.Term)
	}
}

func TestWaitingCandidateWhoseSessionDiesFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: e.session(t, 30)}); err != nil {
		t.Fatal(err)
	}
	s := e.session(t, 30)
	ch := e.campaign(ctx, election.Request{Name: "x", Session: s})
	e.waitCandidates(t, "x", 1)
	if _, err := e.cli.Revoke(ctx, clientv3.LeaseID(s)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if !errors.Is(r.err, election.ErrSessionNotFound) {
			t.Fatalf("Campaign = %+v, %v; want ErrSessionNotFound", r.l, r.err)
		}
	case <-time.After(wait.Bound(5 * time.Second)):
		t.Fatal("Campaign still waits after its session ended")
	}
	if _, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: s}); !errors.Is(err, election.ErrSessionNotFound) {
		t.Fatalf("Campaign with an ended session = %v", err)
	}
}

func TestCampaignIsIdempotentAndRefusesToWaitForItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	s := e.session(t, 30)
	a, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: s, RequestID: "r1", Value: "first"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: s, RequestID: "r1", Value: "second"})
	if err != nil || again.Term != a.Term || again.Value != "first" {
		t.Fatalf("retried Campaign = %+v, %v; want term %d with the first value", again, err, a.Term)
	}
	if _, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: s, RequestID: "r2"}); !errors.Is(err, election.ErrAlreadyLeader) {
		t.Fatalf("Campaign behind the same session's leadership = %v, want ErrAlreadyLeader", err)
	}
	if c, _, _ := e.m.Candidates(ctx, "x"); len(c) != 0 {
		t.Fatalf("refused Campaign left candidates %+v", c)
	}
	// A waiting campaign whose context ends leaves nothing behind. Under
	// load the deadline may end the call while its write is still on its
	// way to etcd: that write is then removed in the background once it
	// lands (queue.RemoveLate), so the candidacy goes, a moment later.
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := e.m.Campaign(wctx, election.Request{Name: "x", Session: e.session(t, 30)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign with a short wait = %v", err)
	}
	wait.Within(t, 5*time.Second, "the timed-out Campaign's candidacy to go", func() bool {
		c, _, _ := e.m.Candidates(ctx, "x")
		return len(c) == 0
	})
}

// A campaign attempt whose transaction reaches etcd only after a later
// campaign wrote the candidacy of the same session and request id (the
// attempt was stuck in etcd while its caller retried, led, resigned and
// used the id again) must not take that candidacy over, nor remove it when
// it fails for its long-gone caller: it fails with Unavailable, and the
// later campaign keeps its place, its value and its term.
func TestAStaleCampaignNeverTakesOverALaterCandidacy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	leader, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: e.session(t, 30), Value: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	req := election.Request{Name: "x", Session: e.session(t, 30), RequestID: "c-1", Value: "stale"}
	paused, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	election.SetBeforeCampaign(e.m, func() {
		if first.CompareAndSwap(false, true) { // the stale attempt only
			close(paused)
			<-resume
		}
	})
	staleCtx, cancelStale := context.WithCancel(ctx)
	defer cancelStale()
	stale := e.campaign(staleCtx, req)
	<-paused
	req.Value = "later"
	later := e.campaign(ctx, req)
	e.waitCandidates(t, "x", 1)
	c, _, err := e.m.Candidates(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	joined := c[0].Joined
	close(resume)
	select {
	case r := <-stale:
		if !errors.Is(r.err, errkind.Unavailable) {
			t.Fatalf("the stale attempt = %+v, %v; want Unavailable (retry)", r.l, r.err)
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the stale attempt still runs: it took the later campaign's candidacy over")
	}
	if err := e.m.Resign(ctx, "x", leader.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-later:
		if r.err != nil || int64(r.l.Term) <= joined || r.l.Value != "later" {
			t.Fatalf("the later campaign = %+v, %v; want to lead after joining at %d, with its own value", r.l, r.err, joined)
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the later campaign was not elected")
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	s := e.session(t, 30)
	big := string(make([]byte, election.MaxValueBytes+1))
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"empty name", func() error { _, err := e.m.Campaign(ctx, election.Request{Session: s}); return err }(), election.ErrInvalid},
		{"bad name", func() error { _, err := e.m.Campaign(ctx, election.Request{Name: "a b", Session: s}); return err }(), election.ErrInvalid},
		{"no session", func() error { _, err := e.m.Campaign(ctx, election.Request{Name: "a"}); return err }(), election.ErrInvalid},
		{"bad request id", func() error {
			_, err := e.m.Campaign(ctx, election.Request{Name: "a", Session: s, RequestID: "a/b"})
			return err
		}(), election.ErrInvalid},
		{"value too large", func() error {
			_, err := e.m.Campaign(ctx, election.Request{Name: "a", Session: s, Value: big})
			return err
		}(), election.ErrTooLarge},
		{"value not UTF-8", func() error {
			_, err := e.m.Campaign(ctx, election.Request{Name: "a", Session: s, Value: "\xff"})
			return err
		}(), election.ErrInvalid},
		{"unknown session", func() error {
			_, err := e.m.Campaign(ctx, election.Request{Name: "a", Session: 12345})
			return err
		}(), election.ErrSessionNotFound},
		{"zero term", func() error { _, err := e.m.Proclaim(ctx, "a", 0, "v", ""); return err }(), election.ErrInvalid},
		{"proclaim id with a slash", func() error { _, err := e.m.Proclaim(ctx, "a", 1, "v", "a/b"); return err }(), election.ErrInvalid},
		{"negative from", e.m.Observe(ctx, "a", -1, nil), election.ErrInvalid},
		{"future from", e.m.Observe(ctx, "a", 1<<40, nil), election.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.want)
		}
	}
	resp, err := e.cli.Get(ctx, "/coordd/election/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("bad input wrote %d keys (%v)", resp.Count, err)
	}
}

// state is who leads and with which proclamation: what an observer must
// follow exactly.
type state struct {
	term      fencing.Token // 0: vacant
	proclaims int64
	value     string
}

// truth reads the election's state at every revision in [from, to] and
// returns the sequence of distinct states, each with the revision it began.
func (e env) truth(t *testing.T, name string, from, to int64) ([]state, []int64) {
	t.Helper()
	var states []state
	var revs []int64
	for r := from; r <= to; r++ {
		resp, err := e.cli.Get(t.Context(), "/coordd/election/"+name+"/lead/", clientv3.WithPrefix(), clientv3.WithRev(r),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil {
			t.Fatal(err)
		}
		var s state
		if len(resp.Kvs) > 0 {
			ev := observeOne(t, resp.Kvs[0].Value)
			s = state{term: fencing.Token(resp.Kvs[0].CreateRevision), proclaims: ev.proclaims, value: ev.value}
		}
		if len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
			revs = append(revs, r)
		}
	}
	return states, revs
}

func observeOne(t *testing.T, v []byte) state {
	t.Helper()
	var c struct {
		Value     string `json:"value"`
		Proclaims int64  `json:"proclaims"`
	}
	if err := json.Unmarshal(v, &c); err != nil {
		t.Fatal(err)
	}
	return state{proclaims: c.Proclaims, value: c.Value}
}

// recorder folds an event stream into states and checks its shape.
type recorder struct {
	mu      sync.Mutex
	states  []state
	revs    []int64
	last    int64
	kinds   map[election.EventType]int
	current int // events marked Current
	ended   map[fencing.Token]election.EventType
	bad     []string
}

func newRecorder() *recorder {
	return &recorder{kinds: map[election.EventType]int{}, ended: map[fencing.Token]election.EventType{}}
}

func (r *recorder) send(evs []election.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range evs {
		if ev.Revision < r.last || (ev.Revision == r.last && evs[0].Revision != r.last) {
			r.bad = append(r.bad, fmt.Sprintf("event %v at revision %d after revision %d", ev.Type, ev.Revision, r.last))
		}
		r.last = ev.Revision
		r.kinds[ev.Type]++
		if ev.Current {
			r.current++
		}
		var s state
		switch ev.Type {
		case election.Elected, election.Proclaimed:
			s = state{term: ev.Leader.Term, proclaims: ev.Leader.Proclaims, value: ev.Leader.Value}
		case election.Resigned, election.Expired:
			if cur := r.top(); cur.term != ev.Leader.Term && !ev.Current {
				r.bad = append(r.bad, fmt.Sprintf("%v of term %d while term %d led", ev.Type, ev.Leader.Term, cur.term))
			}
			r.ended[ev.Leader.Term] = ev.Type
			continue // the next event of the revision says what follows
		case election.Vacant:
		}
		if len(r.states) == 0 || r.states[len(r.states)-1] != s || ev.Current {
			r.states = append(r.states, s)
			r.revs = append(r.revs, ev.Revision)
		}
	}
	return nil
}

func (r *recorder) top() state {
	if len(r.states) == 0 {
		return state{}
	}
	return r.states[len(r.states)-1]
}

// caughtUp reports whether the recorder's latest state is s.
func (r *recorder) caughtUp(s state) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.top() == s
}

func (r *recorder) lastRev() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// TestObserveStorm runs campaigns, proclamations, resignations and expiries
// while an observer follows, stops and resumes it, and compacts etcd while
// it is away. The observer must see exactly the sequence of states etcd
// went through, each change at its revision, with VACANT when nobody led,
// and RESIGNED/EXPIRED as they happened; after the compaction it must
// restart from the current state.
func TestObserveStorm(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	const name = "storm"
	start, err := e.cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	startRev := start.Header.Revision

	rec := newRecorder()
	observe := func(from int64) (stop func()) {
		octx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- e.m.Observe(octx, name, from, rec.send) }()
		return func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Observe = %v", err)
			}
		}
	}
	stop := observe(0)
	// The observer's first batch is the state it starts from: wait for it,
	// or the storm may begin before the observer has read anything and it
	// would start from a later state than startRev's.
	wait.For(t, "the observer's first state", func() bool { return rec.lastRev() >= startRev })

	resigned := map[fencing.Token]bool{}
	expired := map[fencing.Token]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	storm := func(rounds int) {
		for range rounds {
			// A few candidates queue; the leader proclaims, then resigns or
			// expires; sometimes the seat stays empty for a revision.
			// Campaigns return in queue order, whichever goroutine ran first.
			results := make(chan result, 3)
			n := 1 + rng.IntN(3)
			for i := range n {
				s := e.session(t, 60)
				go func() {
					l, err := e.m.Campaign(ctx, election.Request{Name: name, Session: s, Value: fmt.Sprintf("v%d", i)})
					results <- result{l, err}
				}()
			}
			for range n {
				r := <-results
				if r.err != nil {
					t.Fatalf("Campaign: %v", r.err)
				}
				for p := range rng.IntN(3) {
					if _, err := e.m.Proclaim(ctx, name, r.l.Term, fmt.Sprintf("p%d", p), ""); err != nil {
						t.Fatalf("Proclaim: %v", err)
					}
				}
				if rng.IntN(2) == 0 {
					resigned[r.l.Term] = true
					if err := e.m.Resign(ctx, name, r.l.Term, session.Hint{}); err != nil {
						t.Fatalf("Resign: %v", err)
					}
				} else {
					expired[r.l.Term] = true
					if _, err := e.cli.Revoke(ctx, clientv3.LeaseID(r.l.Session)); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}

	// settle elects a marker and waits until the observer shows it: then
	// it has delivered everything before. resign ends the marker's term.
	settle := func(tag string) (resign func()) {
		l, err := e.m.Campaign(ctx, election.Request{Name: name, Session: e.session(t, 60), Value: tag})
		if err != nil {
			t.Fatal(err)
		}
		wait.For(t, "the observer to show the marker "+tag, func() bool { return rec.caughtUp(state{term: l.Term, value: tag}) })
		return func() {
			resigned[l.Term] = true
			if err := e.m.Resign(ctx, name, l.Term, session.Hint{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	storm(10)
	resign := settle("settled-1")
	stop()
	// Away without compaction: the resume continues exactly.
	resumeFrom := rec.lastRev() + 1
	resign()
	storm(5)
	stop = observe(resumeFrom)
	storm(5)
	resign = settle("settled-2")
	stop()
	end := e.rev(t)

	rec.mu.Lock()
	if len(rec.bad) > 0 {
		t.Fatalf("bad events: %v", rec.bad)
	}
	want, wantRevs := e.truth(t, name, startRev, end)
	got, gotRevs := rec.states, rec.revs
	// The first state is the stream's starting point (Current, at startRev).
	if !slices.Equal(got, want) || !slices.Equal(gotRevs, wantRevs) {
		t.Fatalf("observed states differ from etcd's history:\n got %v at %v\nwant %v at %v", got, gotRevs, want, wantRevs)
	}
	if rec.current != 1 {
		t.Fatalf("%d events marked Current, want only the first", rec.current)
	}
	if rec.kinds[election.Vacant] == 0 || rec.kinds[election.Proclaimed] == 0 {
		t.Fatalf("event counts %v: the storm should have had vacancies and proclamations", rec.kinds)
	}
	for term, kind := range rec.ended {
		if (kind == election.Resigned) != resigned[term] || (kind == election.Expired) != expired[term] {
			t.Errorf("term %d ended with %v; resigned %v, expired %v", term, kind, resigned[term], expired[term])
		}
	}
	if len(rec.ended) != len(resigned)+len(expired) {
		t.Errorf("%d terms ended in the stream, %d in the storm", len(rec.ended), len(resigned)+len(expired))
	}
	resumeFrom = rec.last + 1
	rec.mu.Unlock()
	resign()

	// Away across a compaction: the resume starts from the current state.
	storm(3)
	holder, err := e.m.Campaign(ctx, election.Request{Name: name, Session: e.session(t, 60), Value: "now"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Compact(ctx, e.rev(t)); err != nil {
		t.Fatal(err)
	}
	rec2 := newRecorder()
	octx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.m.Observe(octx, name, resumeFrom, rec2.send) }()
	wait.For(t, "the resumed observer's first state", func() bool { return rec2.lastRev() > 0 })
	if _, err := e.m.Proclaim(ctx, name, holder.Term, "after", ""); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the resumed observer to catch up with the proclamation", func() bool { return rec2.lastRev() >= e.rev(t) })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("resumed Observe = %v, want context.Canceled", err)
	}
	rec2.mu.Lock()
	defer rec2.mu.Unlock()
	want2 := []state{{term: holder.Term, value: "now"}, {term: holder.Term, value: "after", proclaims: 1}}
	if !slices.Equal(rec2.states, want2) || rec2.current != 1 || len(rec2.bad) > 0 {
		t.Fatalf("after compaction: states %v (current %d, bad %v), want %v", rec2.states, rec2.current, rec2.bad, want2)
	}
}

func (e env) rev(t *testing.T) int64 {
	t.Helper()
	resp, err := e.cli.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// Observe from revision 1 replays the election's history from its start,
// not the current state (etcd reads "revision 0" as the current one).
func TestObserveFromOneReplaysHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	first, err := e.m.Campaign(ctx, election.Request{Name: "replay", Session: e.session(t, 60), Value: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Proclaim(ctx, "replay", first.Term, "a2", ""); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Resign(ctx, "replay", first.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	end := e.rev(t)

	var mu sync.Mutex
	var got []string
	last := int64(0)
	octx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.m.Observe(octx, "replay", 1, func(evs []election.Event) error {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range evs {
				got = append(got, fmt.Sprintf("%v %s current=%v", ev.Type, ev.Leader.Value, ev.Current))
				last = ev.Revision
			}
			return nil
		})
	}()
	wait.For(t, "the replay to reach the resignation", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return last >= end
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe = %v", err)
	}
	want := []string{"ELECTED a current=false", "PROCLAIMED a2 current=false", "RESIGNED a2 current=false", "VACANT  current=false"}
	if !slices.Equal(got, want) {
		t.Fatalf("replay from 1 = %q, want %q", got, want)
	}
}

// A retry of a campaign (the same session and campaign id) takes the
// candidacy over and is elected once the leader resigns, whichever of the
// two calls starts waiting first and although the first call gives up
// (cancelled) after the retry took over: the first call's clean-up removes
// only the candidacy as it wrote it.
func TestCampaignTakeOverByARetry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		firstRegistersLast bool
	}{
		{name: "the retry waits last"},
		{name: "the first call waits last", firstRegistersLast: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := t.Context()
			paused, resume := make(chan struct{}), make(chan struct{})
			firstWaits, retryWaits := make(chan struct{}), make(chan struct{})
			var waits atomic.Int32
			election.SetBeforeWait(e.m, func() {
				switch waits.Add(1) {
				case 1: // the first call
					close(firstWaits)
					if tc.firstRegistersLast {
						close(paused)
						<-resume
					}
				case 2: // the retry
					close(retryWaits)
				}
			})
			leader, err := e.m.Campaign(ctx, election.Request{Name: "x", Session: e.session(t, 30), Value: "leader"})
			if err != nil {
				t.Fatal(err)
			}
			req := election.Request{Name: "x", Session: e.session(t, 30), RequestID: "c-1", Value: "worker"}
			firstCtx, cancelFirst := context.WithCancel(ctx)
			defer cancelFirst()
			first := e.campaign(firstCtx, req)
			<-firstWaits
			retry := e.campaign(ctx, req)
			<-retryWaits
			cancelFirst()
			if tc.firstRegistersLast {
				close(resume)
			}
			if r := <-first; !errors.Is(r.err, context.Canceled) {
				t.Fatalf("first call = %+v, %v; want it cancelled", r.l, r.err)
			}
			e.waitCandidates(t, "x", 1)
			if err := e.m.Resign(ctx, "x", leader.Term, session.Hint{}); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-retry:
				if r.err != nil || r.l.Term <= leader.Term || r.l.Value != "worker" {
					t.Fatalf("retry = %+v, %v; want it elected after term %d", r.l, r.err, leader.Term)
				}
			case <-time.After(wait.Bound(30 * time.Second)):
				t.Fatal("the leader resigned and the retry was not elected")
			}
		})
	}
}

// Parked campaigns (CampaignLater) wait without a goroutine each and end
// as waiting ones do: with the seat, with their session's end, or with
// their context, which also withdraws the candidacy.
func TestParkedCampaignsEndAsWaitingOnesDo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	leader, err := e.m.Campaign(ctx, election.Request{Name: "p", Session: e.session(t, 30)})
	if err != nil {
		t.Fatal(err)
	}
	park := func(ctx context.Context, s session.ID) <-chan result {
		ch := make(chan result, 1)
		_, parked, err := e.m.CampaignLater(ctx, election.Request{Name: "p", Session: s}, election.Later{Ctx: ctx, Done: func(l election.Leadership, err error) {
			ch <- result{l, err}
		}})
		if err != nil || !parked {
			t.Fatalf("CampaignLater behind a leader: parked %v, %v; want parked", parked, err)
		}
		return ch
	}
	winner := park(ctx, e.session(t, 30))
	dying := e.session(t, 30)
	ended := park(ctx, dying)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	canceled := park(cctx, e.session(t, 30))
	e.waitCandidates(t, "p", 3)

	cancel()
	if r := <-canceled; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a parked campaign whose context ended: %+v, %v; want context.Canceled", r.l, r.err)
	}
	e.waitCandidates(t, "p", 2) // its candidacy withdrawn
	if _, err := e.cli.Revoke(ctx, clientv3.LeaseID(dying)); err != nil {
		t.Fatal(err)
	}
	if r := <-ended; !errors.Is(r.err, election.ErrSessionNotFound) {
		t.Fatalf("a parked campaign whose session ended: %+v, %v; want ErrSessionNotFound", r.l, r.err)
	}
	if err := e.m.Resign(ctx, "p", leader.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	r := <-winner
	if r.err != nil || r.l.Term <= leader.Term {
		t.Fatalf("the parked campaign left: %+v, %v; want it to lead with a later term than %d", r.l, r.err, leader.Term)
	}
	if ld, _, err := e.m.Leader(ctx, "p"); err != nil || ld.Term != r.l.Term {
		t.Fatalf("the election's leader: %+v, %v; want term %d", ld, err, r.l.Term)
	}
}

// A retry of a campaign that was admitted behind another leader waits as
// the first call did, even when another campaign of its own session has
// come to lead meanwhile: the retry is the same candidacy, not a new one
// waiting for itself. It was refused with "this session already leads"
// (seen in the candidates' crowd test beside stress-ng, after the SDK
// retried a campaign the member had answered UNAVAILABLE).
func TestARetryIsNotRefusedForItsSessionsOwnLeadership(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	x, s := e.session(t, 30), e.session(t, 30)
	leader, err := e.m.Campaign(ctx, election.Request{Name: "r", Session: x, Value: "x"})
	if err != nil {
		t.Fatal(err)
	}
	a := e.campaign(ctx, election.Request{Name: "r", Session: s, RequestID: "a", Value: "a"})
	e.waitCandidates(t, "r", 1)
	reqB := election.Request{Name: "r", Session: s, RequestID: "b", Value: "b"}
	firstCtx, lose := context.WithCancelCause(ctx)
	first := e.campaign(firstCtx, reqB)
	e.waitCandidates(t, "r", 2)
	lose(errkind.Unavailable.New("the client's connection broke")) // the candidacy stays for the retry
	if r := <-first; r.err == nil {
		t.Fatalf("the abandoned call = %+v; want its context's end", r.l)
	}
	if err := e.m.Resign(ctx, "r", leader.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	ra := <-a
	if ra.err != nil {
		t.Fatal(ra.err)
	}
	retry := e.campaign(ctx, reqB) // while a, of the same session, leads
	e.waitCandidates(t, "r", 1)
	select {
	case r := <-retry:
		t.Fatalf("the retry = %+v, %v; want it waiting behind its session's leader", r.l, r.err)
	default:
	}
	if err := e.m.Resign(ctx, "r", ra.l.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	if r := <-retry; r.err != nil || r.l.Value != "b" || r.l.Term <= ra.l.Term {
		t.Fatalf("the retry = %+v, %v; want it elected after term %d", r.l, r.err, ra.l.Term)
	}
}
