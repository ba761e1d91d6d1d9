package election_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// observeAll follows name from now and returns what it saw so far.
func (e env) observeAll(t *testing.T, name string) func() []election.Event {
	t.Helper()
	var mu sync.Mutex
	var got []election.Event
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.m.Observe(ctx, name, 0, func(evs []election.Event) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, evs...)
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	wait.For(t, "the observer's first state", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	return func() []election.Event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func TestPriorityOrdersTheLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	a, err := e.m.Campaign(ctx, election.Request{Name: "p", Session: e.session(t, 30), Value: "a", Priority: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A higher priority waits its turn: it never unseats the leader.
	var chans []<-chan result
	for i, p := range []int32{0, 5, 5, -1, 9} {
		chans = append(chans, e.campaign(ctx, election.Request{Name: "p", Session: e.session(t, 30), Value: fmt.Sprint("c", i), Priority: p}))
		e.waitCandidates(t, "p", i+1)
	}
	cands, _, err := e.m.Candidates(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, c := range cands {
		order = append(order, fmt.Sprintf("%s/%d", c.Value, c.Priority))
	}
	if want := []string{"c4/9", "c1/5", "c2/5", "c0/0", "c3/-1"}; !slices.Equal(order, want) {
		t.Fatalf("line = %q, want %q (priority, then arrival)", order, want)
	}
	if ld, _, _ := e.m.Leader(ctx, "p"); ld.Term != a.Term || ld.Priority != 1 {
		t.Fatalf("Leader = %+v, want a (priority 1) still", ld)
	}
	if err := e.m.Resign(ctx, "p", a.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	term := a.Term
	for _, want := range []int{4, 1, 2, 0, 3} {
		r := <-chans[want]
		if r.err != nil || r.l.Term <= term || r.l.Value != fmt.Sprint("c", want) {
			t.Fatalf("next leader = %+v, %v; want c%d with a term above %d", r.l, r.err, want, term)
		}
		term = r.l.Term
		if err := e.m.Resign(ctx, "p", term, session.Hint{Session: r.l.Session, RequestID: r.l.RequestID}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPreemptionAsksTheLeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a, err := e.m.Campaign(ctx, election.Request{Name: "pre", Session: e.session(t, 30), Value: "a", Priority: 2})
	if err != nil {
		t.Fatal(err)
	}
	seen := e.observeAll(t, "pre")
	// Not above the leader: no request, even when asked for.
	low := e.campaign(ctx, election.Request{Name: "pre", Session: e.session(t, 30), Value: "low", Priority: 2, Preempt: true})
	e.waitCandidates(t, "pre", 1)
	bs := e.session(t, 30)
	b := e.campaign(ctx, election.Request{Name: "pre", Session: bs, Value: "b", Priority: 7, Preempt: true})
	var req election.Event
	wait.For(t, "the leader to be asked to step down", func() bool {
		for _, ev := range seen() {
			if ev.Type == election.PreemptRequested {
				req = ev
				return true
			}
		}
		return false
	})
	if req.Leader.Term != a.Term || req.By.Session != bs || req.By.Priority != 7 {
		t.Fatalf("PREEMPT_REQUESTED = %+v, want leader term %d asked by session %s at priority 7", req, a.Term, bs)
	}
	// A late observer (the leader's SDK after a reconnect) learns of it
	// too, with the current state.
	late := e.observeAll(t, "pre")()
	if len(late) != 2 || late[1].Type != election.PreemptRequested || !late[1].Current {
		t.Fatalf("a new observer saw %+v, want ELECTED then PREEMPT_REQUESTED (current)", late)
	}
	// Nothing forces the leader: it steps down when it chooses.
	if ld, _, _ := e.m.Leader(ctx, "pre"); ld.Term != a.Term {
		t.Fatalf("the leader changed on its own: %+v", ld)
	}
	if err := e.m.Resign(ctx, "pre", a.Term, session.Hint{}); err != nil {
		t.Fatal(err)
	}
	if r := <-b; r.err != nil || r.l.Value != "b" {
		t.Fatalf("the preempting candidate = %+v, %v; want it elected next", r.l, r.err)
	}
	select {
	case r := <-low:
		t.Fatalf("the lower candidate ended its wait: %+v, %v", r.l, r.err)
	default:
	}
	cancel()
	<-low
}

func TestTransferHandsOverInOneCommit(t *testing.T) {
	t.Parallel()
	if got, want := transferScenario(t, false); !slices.Equal(got, want) {
		t.Fatalf("observer saw %q, want %q: one change, no vacancy", got, want)
	}
}

// With the hand-over split in two commits, the same check sees the
// vacancy between them.
func TestTransferCheckCatchesAVacancy(t *testing.T) {
	t.Parallel()
	if got, want := transferScenario(t, true); slices.Equal(got, want) {
		t.Fatalf("observer saw %q with the hand-over split in two commits: the check cannot catch a vacancy", got)
	}
}

// transferScenario hands a leadership over (in two commits if split) and
// returns what an observer saw, and what it must see.
func transferScenario(t *testing.T, split bool) (got, want []string) {
	e := newEnv(t)
	election.SetSplitTransfer(e.m, split)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a, err := e.m.Campaign(ctx, election.Request{Name: "t", Session: e.session(t, 30), Value: "a"})
	if err != nil {
		t.Fatal(err)
	}
	bs := e.session(t, 30)
	b := e.campaign(ctx, election.Request{Name: "t", Session: bs, Value: "b"})
	e.waitCandidates(t, "t", 1)
	c := e.campaign(ctx, election.Request{Name: "t", Session: e.session(t, 30), Value: "c", Priority: 9})
	e.waitCandidates(t, "t", 2)
	seen := e.observeAll(t, "t")

	if _, _, err := e.m.Transfer(ctx, "t", a.Term, e.session(t, 30), ""); !errors.Is(err, election.ErrNotCandidate) {
		t.Fatalf("Transfer to a session with no campaign = %v, want ErrNotCandidate", err)
	}
	if _, _, err := e.m.Transfer(ctx, "t", a.Term, a.Session, ""); !errors.Is(err, election.ErrNotCandidate) {
		t.Fatalf("Transfer to the leader itself = %v, want ErrNotCandidate", err)
	}
	if _, _, err := e.m.Transfer(ctx, "t", a.Term+1000, bs, ""); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Transfer by a term that does not lead = %v, want ErrNotLeader", err)
	}
	// b, not c: the leader names its successor, whatever the line says.
	term, rev, err := e.m.Transfer(ctx, "t", a.Term, bs, "")
	if err != nil || term <= a.Term || int64(term) != rev {
		t.Fatalf("Transfer = %d at %d, %v; want a new term at its revision", term, rev, err)
	}
	r := <-b
	if r.err != nil || r.l.Term != term || r.l.Value != "b" {
		t.Fatalf("the successor's campaign = %+v, %v; want term %d", r.l, r.err, term)
	}
	if err := e.m.ValidateFence(ctx, "t", a.Term); !errors.Is(err, election.ErrStaleTerm) {
		t.Fatalf("the old term's fence = %v, want ErrStaleTerm", err)
	}
	if _, _, err := e.m.Transfer(ctx, "t", a.Term, bs, ""); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("a retried Transfer = %v, want ErrNotLeader", err)
	}
	wait.For(t, "the observer to see the hand-over", func() bool {
		evs := seen()
		return evs[len(evs)-1].Revision >= rev
	})
	for _, ev := range seen() {
		got = append(got, fmt.Sprintf("%v %s %d", ev.Type, ev.Leader.Value, ev.Revision))
	}
	want = []string{fmt.Sprintf("ELECTED a %d", seen()[0].Revision), fmt.Sprintf("RESIGNED a %d", rev), fmt.Sprintf("ELECTED b %d", rev)}
	select {
	case r := <-c:
		t.Fatalf("c was elected too: %+v, %v", r.l, r.err)
	default:
	}
	cancel()
	<-c
	return got, want
}

// seatsAtEveryRevision replays the history of name's seats from revision
// from and returns every revision at which more than one seat existed,
// and every term that was not above the one before.
func seatsAtEveryRevision(t *testing.T, cli *clientv3.Client, name string, from, to int64) (overlaps []int64, regressions []int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	live := map[string]int64{}
	last := int64(0)
	for wr := range cli.Watch(ctx, "/coordd/election/"+name+"/lead/", clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for i, ev := range wr.Events {
			k := string(ev.Kv.Key)
			if ev.Type == mvccpb.DELETE {
				delete(live, k)
			} else if ev.IsCreate() {
				live[k] = ev.Kv.CreateRevision
				if ev.Kv.CreateRevision <= last {
					regressions = append(regressions, ev.Kv.CreateRevision)
				}
				last = ev.Kv.CreateRevision
			}
			endOfRev := i == len(wr.Events)-1 || wr.Events[i+1].Kv.ModRevision != ev.Kv.ModRevision
			if endOfRev && len(live) > 1 {
				overlaps = append(overlaps, ev.Kv.ModRevision)
			}
		}
		if wr.Header.Revision >= to {
			break
		}
	}
	return overlaps, regressions
}

// churn runs candidates on two managers (two members) of one etcd:
// campaigns with random priorities, resignations, hand-overs and session
// ends, until n terms were won (or a minute passed: the caller checks what
// it saw). It returns the revisions before and after.
func churn(t *testing.T, cli *clientv3.Client, ms [2]*election.Manager, name string, n int64) (int64, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Minute))
	defer cancel()
	var won atomic.Int64
	start, err := cli.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := ms[w%2]
			for ctx.Err() == nil {
				lease, err := cli.Grant(ctx, 30)
				if err != nil {
					return
				}
				s := session.ID(lease.ID)
				l, err := m.Campaign(ctx, election.Request{Name: name, Session: s, Priority: rand.Int32N(3)})
				if err != nil {
					continue
				}
				if won.Add(1) >= n {
					cancel()
				}
				switch rand.IntN(3) {
				case 0:
					_ = m.Resign(ctx, name, l.Term, session.Hint{Session: s, RequestID: l.RequestID})
				case 1:
					if cands, _, err := m.Candidates(ctx, name); err == nil && len(cands) > 0 {
						_, _, _ = m.Transfer(ctx, name, l.Term, cands[rand.IntN(len(cands))].Session, "")
					}
				default:
					_, _ = cli.Revoke(context.WithoutCancel(ctx), lease.ID) // the session ends
				}
			}
		}()
	}
	wg.Wait()
	end, err := cli.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	return start.Header.Revision + 1, end.Header.Revision
}

// Under churn on two members, one seat at most at every revision, terms
// strictly increasing, and the seat never stays free while candidates
// wait. With the seat's "nobody leads" compares switched off, the same
// check finds two leaders.
func TestOneSeatUnderChurn(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Start(t).Client(t)
	var ms [2]*election.Manager
	for i := range ms {
		w := etcdtest.Watcher(t, cli, "/coordd/election/")
		txns := groupcommit.New(cli)
		ms[i] = election.NewManager(cli, "/coordd/", w, txns)
		t.Cleanup(func() { ms[i].Close(); txns.Close() })
	}
	from, to := churn(t, cli, ms, "churn", 100)
	overlaps, regressions := seatsAtEveryRevision(t, cli, "churn", from, to)
	if len(overlaps) > 0 || len(regressions) > 0 {
		t.Fatalf("two seats at revisions %v; terms not increasing at %v", overlaps, regressions)
	}
	if to-from < 100 {
		t.Fatalf("only %d revisions of churn: the check saw too little", to-from)
	}
	// Whatever is left waiting gets the seat.
	wait.For(t, "the seat to be taken or nobody to wait", func() bool {
		_, _, err := ms[0].Leader(t.Context(), "churn")
		c, _, _ := ms[0].Candidates(t.Context(), "churn")
		return err == nil || len(c) == 0
	})

	// A promotion races every resignation, hand-over and campaign: here
	// one runs while a leader holds the seat and a candidate waits. With
	// its guard, it changes nothing; without, the check sees two leaders.
	for _, guarded := range []bool{true, false} {
		name := fmt.Sprint("race-", guarded)
		election.SetUnguardedSeat(ms[0], !guarded)
		start, _ := cli.Get(t.Context(), "x")
		s1, _ := cli.Grant(t.Context(), 30)
		s2, _ := cli.Grant(t.Context(), 30)
		if _, err := ms[0].Campaign(t.Context(), election.Request{Name: name, Session: session.ID(s1.ID)}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		waiting := make(chan error, 1)
		go func() {
			_, err := ms[1].Campaign(ctx, election.Request{Name: name, Session: session.ID(s2.ID)})
			waiting <- err
		}()
		wait.For(t, "a candidate to wait", func() bool {
			c, _, _ := ms[0].Candidates(t.Context(), name)
			return len(c) == 1
		})
		if err := election.Promote(t.Context(), ms[0], name); err != nil {
			t.Fatal(err)
		}
		end, _ := cli.Get(t.Context(), "x")
		overlaps, _ := seatsAtEveryRevision(t, cli, name, start.Header.Revision+1, end.Header.Revision)
		if guarded && len(overlaps) > 0 {
			t.Fatalf("a promotion gave a second seat at %v", overlaps)
		}
		if !guarded && len(overlaps) == 0 {
			t.Fatal("with the seat's guard off, the check found no second leader: it cannot catch one")
		}
		cancel()
		// Guarded, the candidate still waits; unguarded, it was "elected".
		if err := <-waiting; guarded && !errors.Is(err, context.Canceled) {
			t.Fatalf("the waiting campaign = %v, want it cancelled", err)
		}
	}
}

// A preemption request ends with the campaign that made it, and a waiting
// candidate asks each new leader it outranks.
func TestPreemptionRequestFollowsItsCampaign(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	a, err := e.m.Campaign(ctx, election.Request{Name: "pw", Session: e.session(t, 30), Value: "a"})
	if err != nil {
		t.Fatal(err)
	}
	requests := func() []election.Event {
		var out []election.Event
		for _, ev := range e.observeAll(t, "pw")() {
			if ev.Type == election.PreemptRequested {
				out = append(out, ev)
			}
		}
		return out
	}
	bctx, cancelB := context.WithCancel(ctx)
	b := e.campaign(bctx, election.Request{Name: "pw", Session: e.session(t, 30), Value: "b", Priority: 3, Preempt: true})
	wait.For(t, "b's request", func() bool { return len(requests()) == 1 })
	cancelB()
	<-b
	wait.For(t, "b's request to go with its campaign", func() bool { return len(requests()) == 0 })

	ds := e.session(t, 30)
	dctx, cancelD := context.WithCancel(ctx)
	defer cancelD()
	d := e.campaign(dctx, election.Request{Name: "pw", Session: ds, Value: "d", Priority: 1})
	e.waitCandidates(t, "pw", 1)
	cctx, cancelC := context.WithCancel(ctx)
	defer cancelC()
	c := e.campaign(cctx, election.Request{Name: "pw", Session: e.session(t, 30), Value: "c", Priority: 9, Preempt: true})
	e.waitCandidates(t, "pw", 2)
	term, _, err := e.m.Transfer(ctx, "pw", a.Term, ds, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := <-d; r.err != nil || r.l.Term != term {
		t.Fatalf("d = %+v, %v", r.l, r.err)
	}
	wait.For(t, "c to ask the new leader", func() bool {
		r := requests()
		return len(r) == 1 && r[0].Leader.Term == term
	})
	cancelC()
	<-c
}
