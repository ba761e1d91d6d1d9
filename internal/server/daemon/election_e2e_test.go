package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

func TestElectionsThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	a, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("worker-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("worker-b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leader(ctx, "batch"); !errors.Is(err, clientlib.ErrNoLeader) {
		t.Fatalf("Leader of an empty election = %v, want ErrNoLeader", err)
	}
	obs := c.Observe(ctx, "batch")
	next := func() clientlib.ElectionEvent {
		t.Helper()
		select {
		case ev, ok := <-obs.Events():
			if !ok {
				t.Fatalf("observer ended: %v", obs.Err())
			}
			return ev
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatal("no election event within 10s")
		}
		panic("unreachable")
	}
	if ev := next(); ev.Type != clientlib.ElectionVacant || !ev.Current {
		t.Fatalf("first event = %+v, want a current VACANT", ev)
	}

	la, err := a.Campaign(ctx, "batch", "10.0.0.1:80")
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if ev := next(); ev.Type != clientlib.ElectionElected || ev.Leader.Term != la.Term() || ev.Leader.Value != "10.0.0.1:80" || ev.Leader.Owner != "worker-a" {
		t.Fatalf("event = %+v, want ELECTED of term %d", ev, la.Term())
	}
	if _, err := a.Campaign(ctx, "batch", "again"); !errors.Is(err, clientlib.ErrAlreadyLeader) {
		t.Fatalf("second Campaign by the leading session = %v, want ErrAlreadyLeader", err)
	}
	lbc := make(chan *clientlib.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "batch", "10.0.0.2:80")
		if err != nil {
			t.Errorf("Campaign b: %v", err)
		}
		lbc <- lb
	}()
	wait.Within(t, 10*time.Second, "b to queue", func() bool {
		cands, err := c.Candidates(ctx, "batch")
		return err == nil && len(cands) == 1 && cands[0].Owner == "worker-b" && cands[0].Value == "10.0.0.2:80"
	})
	if err := la.Proclaim(ctx, "10.0.0.1:81"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	if ev := next(); ev.Type != clientlib.ElectionProclaimed || ev.Leader.Value != "10.0.0.1:81" || ev.Leader.Owner != "worker-a" {
		t.Fatalf("event = %+v, want PROCLAIMED by worker-a", ev)
	}
	ld, err := c.Leader(ctx, "batch")
	if err != nil || ld.Term != la.Term() || ld.Value != "10.0.0.1:81" || ld.Owner != "worker-a" || ld.SessionID != a.ID() || ld.Proclaims != 1 {
		t.Fatalf("Leader = %+v, %v", ld, err)
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Election: "batch", Token: la.Term()}); err != nil {
		t.Fatalf("ValidateLeadership: %v", err)
	}
	if _, err := c.Admin().FencedPut(ctx, clientlib.Fence{Election: "batch", Token: la.Term()}, "batch/owner", []byte("a")); err != nil {
		t.Fatalf("FencedPutAsLeader: %v", err)
	}

	if err := la.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if !errors.Is(context.Cause(la.Context()), clientlib.ErrResigned) {
		t.Fatalf("leadership context cause after Resign = %v", context.Cause(la.Context()))
	}
	lb := <-lbc
	if lb == nil || lb.Term() <= la.Term() {
		t.Fatalf("b's leadership %v after a's term %d", lb, la.Term())
	}
	if ev := next(); ev.Type != clientlib.ElectionResigned || ev.Leader.Term != la.Term() || ev.Leader.Owner != "worker-a" {
		t.Fatalf("event = %+v, want RESIGNED of term %d by worker-a", ev, la.Term())
	}
	if ev := next(); ev.Type != clientlib.ElectionElected || ev.Leader.Term != lb.Term() {
		t.Fatalf("event = %+v, want ELECTED of term %d", ev, lb.Term())
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Election: "batch", Token: la.Term()}); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("ValidateLeadership of a resigned term = %v, want ErrStaleToken", err)
	}
	if _, err := c.Admin().FencedPut(ctx, clientlib.Fence{Election: "batch", Token: la.Term()}, "batch/owner", []byte("late")); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("late FencedPutAsLeader = %v, want ErrStaleToken", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Lost():
	case <-time.After(wait.Bound(5 * time.Second)):
		t.Fatal("Lost not closed after the session closed")
	}
	// Its session is gone, but the stream still names the owner.
	if ev := next(); ev.Type != clientlib.ElectionExpired || ev.Leader.Term != lb.Term() || ev.Leader.Owner != "worker-b" {
		t.Fatalf("event = %+v, want EXPIRED of term %d, owned by worker-b", ev, lb.Term())
	}
	if ev := next(); ev.Type != clientlib.ElectionVacant {
		t.Fatalf("event = %+v, want VACANT", ev)
	}
}

func TestElectionsOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	r := call(t, "POST", base+"/v1/sessions", `{"ttl":"30s","owner":"curl"}`)
	sid := r.body["session"].(map[string]any)["id"].(string)

	// Observe as newline-delimited JSON.
	octx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(octx, "GET", base+"/v1/elections:observe?name=reports/nightly", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewScanner(resp.Body)
	nextLine := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("observe stream ended: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", lines.Text(), err)
		}
		return m["result"].(map[string]any)
	}
	first := nextLine()
	if ev := first["events"].([]any)[0].(map[string]any); ev["type"] != "ELECTION_EVENT_TYPE_VACANT" || ev["current"] != true {
		t.Fatalf("first observed line = %v", first)
	}

	r = call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"reports/nightly","sessionId":%q,"value":"host-1"}`, sid))
	if r.status != 200 {
		t.Fatalf("campaign = %d %v", r.status, r.body)
	}
	term, ok := r.body["leadership"].(map[string]any)["term"].(string)
	if !ok || term == "" {
		t.Fatalf("term is not a JSON string: %v", r.body)
	}
	line := nextLine()
	if ev := line["events"].([]any)[0].(map[string]any); ev["type"] != "ELECTION_EVENT_TYPE_ELECTED" || ev["leader"].(map[string]any)["term"] != term {
		t.Fatalf("observed = %v", line)
	}
	r = call(t, "GET", base+"/v1/elections:leader?name=reports/nightly", "")
	if r.status != 200 || r.body["leader"].(map[string]any)["value"] != "host-1" || r.body["leader"].(map[string]any)["owner"] != "curl" {
		t.Fatalf("leader = %d %v", r.status, r.body)
	}
	// Sent twice with one proclaim id (a retry after a lost answer): one
	// proclamation, whose revision both answers report.
	proclaim := fmt.Sprintf(`{"name":"reports/nightly","term":%q,"value":"host-1b","proclaimId":"deploy-7"}`, term)
	r = call(t, "POST", base+"/v1/elections:proclaim", proclaim)
	if r.status != 200 {
		t.Fatalf("proclaim = %d %v", r.status, r.body)
	}
	if again := call(t, "POST", base+"/v1/elections:proclaim", proclaim); again.status != 200 || again.body["revision"] != r.body["revision"] {
		t.Fatalf("repeated proclaim = %d %v, want 200 and revision %v", again.status, again.body, r.body["revision"])
	}
	if ev := nextLine()["events"].([]any)[0].(map[string]any); ev["type"] != "ELECTION_EVENT_TYPE_PROCLAIMED" {
		t.Fatalf("observed = %v", ev)
	}
	r = call(t, "GET", base+"/v1/elections:leader?name=reports/nightly", "")
	if ld := r.body["leader"].(map[string]any); ld["value"] != "host-1b" || ld["proclaims"] != "1" {
		t.Fatalf("leader after a repeated proclaim = %v, want host-1b proclaimed once", ld)
	}
	r = call(t, "POST", base+"/v1/locks:validateFence", fmt.Sprintf(`{"election":"reports/nightly","token":%q}`, term))
	if r.status != 200 {
		t.Fatalf("validateFence by term = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/elections:candidates?name=reports/nightly", "")
	if r.status != 200 {
		t.Fatalf("candidates = %d %v", r.status, r.body)
	}
	// The leader's own resignation names its session: it ends the term at
	// once (by term alone it would be one from outside, which asks the
	// leader first and, with nobody to answer over REST, waits its bound).
	r = call(t, "POST", base+"/v1/elections:resign", fmt.Sprintf(`{"name":"reports/nightly","term":%q,"sessionId":%q}`, term, sid))
	if r.status != 200 {
		t.Fatalf("resign = %d %v", r.status, r.body)
	}
	evs := nextLine()["events"].([]any)
	if len(evs) != 2 || evs[0].(map[string]any)["type"] != "ELECTION_EVENT_TYPE_RESIGNED" || evs[1].(map[string]any)["type"] != "ELECTION_EVENT_TYPE_VACANT" {
		t.Fatalf("observed after resign = %v", evs)
	}

	for _, tc := range []struct {
		method, path, body string
		status             int
		reason             string
	}{
		{"POST", "/v1/elections:campaign", `{"name":"a b","sessionId":"` + sid + `"}`, 400, "INVALID_ARGUMENT"},
		{"POST", "/v1/elections:campaign", `{"name":"x","sessionId":"00000000000000ff"}`, 404, "SESSION_NOT_FOUND"},
		{"POST", "/v1/elections:campaign", `{"name":"x","sessionId":"` + sid + `","value":"` + strings.Repeat("v", 64<<10+1) + `"}`, 400, "VALUE_TOO_LARGE"},
		{"POST", "/v1/elections:campaign", `{"name":"x","sessionId":"` + sid + `","wait":"-1s"}`, 400, "INVALID_ARGUMENT"},
		{"POST", "/v1/elections:resign", fmt.Sprintf(`{"name":"reports/nightly","term":%q}`, term), 400, "NOT_LEADER"},
		{"POST", "/v1/elections:proclaim", fmt.Sprintf(`{"name":"reports/nightly","term":%q,"value":"x"}`, term), 400, "NOT_LEADER"},
		{"GET", "/v1/elections:leader?name=reports/nightly", "", 404, "NO_LEADER"},
		{"POST", "/v1/locks:validateFence", fmt.Sprintf(`{"election":"reports/nightly","token":%q}`, term), 409, "STALE_TOKEN"},
		{"POST", "/v1/kv:fencedPut", fmt.Sprintf(`{"election":"reports/nightly","lock":"l","token":%q,"key":"k"}`, term), 400, "INVALID_ARGUMENT"},
		{"GET", "/v1/elections:observe?name=", "", 400, "INVALID_ARGUMENT"},
	} {
		r := call(t, tc.method, base+tc.path, tc.body)
		if r.status != tc.status || reason(r) != tc.reason {
			t.Errorf("%s %s = %d %s, want %d %s (%v)", tc.method, tc.path, r.status, reason(r), tc.status, tc.reason, r.body)
		}
	}
	// Nothing of the bad calls was left behind.
	r = call(t, "GET", base+"/v1/elections:candidates?name=x", "")
	if c, ok := r.body["candidates"].([]any); r.status != 200 || !ok || len(c) != 0 {
		t.Fatalf("candidates of x after bad calls = %d %v, want an empty list", r.status, r.body)
	}
}

// appendLog is a resource that only a leader may append to, guarded by
// its term: what a careful service would do with the term.
type appendLog struct {
	guard fencing.Guard
	mu    sync.Mutex
	terms []fencing.Token // terms of accepted appends, in order
	late  int             // appends the guard rejected
}

func (l *appendLog) append(term fencing.Token) error {
	err := l.guard.Do("log", term, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.terms = append(l.terms, term)
		return nil
	})
	if errors.Is(err, fencing.ErrStale) {
		l.mu.Lock()
		l.late++
		l.mu.Unlock()
	}
	return err
}

// outOfOrder counts accepted appends whose term is below an earlier one.
func (l *appendLog) outOfOrder() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i := 1; i < len(l.terms); i++ {
		if l.terms[i] < l.terms[i-1] {
			n++
		}
	}
	return n
}

// TestNeverTwoLeaders runs three candidates through RunAsLeader, each
// behind its own TCP proxy, and repeatedly cuts the leader off (its
// keep-alives stop, as if its process were killed or paused). A "paused"
// leader ignores its context and tries one more append after the next
// leader has appended, as a process waking from a long pause would; the
// term guard must reject it. And every leader's context must end before
// the next leader is elected.
func TestNeverTwoLeaders(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	const candidates = 3
	var (
		log       appendLog
		mu        sync.Mutex
		leaderOf  = map[fencing.Token]int{}       // term -> candidate
		elected   = map[fencing.Token]time.Time{} // when Campaign returned
		cancelled = map[fencing.Token]time.Time{} // when the leader's context ended
		pausing   = map[int]bool{}                // candidates told to act paused
	)
	proxies := make([]*tcpproxy.Proxy, candidates)
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range candidates {
		proxies[i] = tcpproxy.Start(t, d.GRPCAddr())
		c := newClient(t, proxies[i].Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.RunAsLeader(ctx, "singleton", fmt.Sprint(i), func(lctx context.Context, lead *clientlib.Leadership) error {
				term := lead.Term()
				stopAt := context.AfterFunc(lctx, func() {
					mu.Lock()
					cancelled[term] = time.Now()
					mu.Unlock()
				})
				defer stopAt()
				for lctx.Err() == nil {
					if err := log.append(term); err != nil {
						return err
					}
					time.Sleep(2 * time.Millisecond)
				}
				mu.Lock()
				paused := pausing[i]
				mu.Unlock()
				if paused && ctx.Err() == nil {
					// Wake up late: once a newer term has appended, try again.
					for log.guard.Highest("log") <= term && ctx.Err() == nil {
						time.Sleep(2 * time.Millisecond)
					}
					_ = log.append(term)
				}
				return nil
			}, clientlib.WithElectionSession(clientlib.WithTTL(2*time.Second)),
				clientlib.OnElected(func(term fencing.Token) {
					mu.Lock()
					leaderOf[term], elected[term] = i, time.Now()
					mu.Unlock()
				}))
			if !errors.Is(err, context.Canceled) {
				t.Errorf("RunAsLeader %d = %v", i, err)
			}
		}()
	}
	current := func() (fencing.Token, int) {
		mu.Lock()
		defer mu.Unlock()
		var top fencing.Token
		for term := range leaderOf {
			top = max(top, term)
		}
		return top, leaderOf[top]
	}
	const rounds = 4
	for round := range rounds {
		wait.Within(t, 15*time.Second, "a leader", func() bool { term, _ := current(); return term > 0 && log.guard.Highest("log") == term })
		term, who := current()
		mu.Lock()
		pausing[who] = round%2 == 1
		mu.Unlock()
		proxies[who].Freeze()
		wait.Within(t, 15*time.Second, "the next leader", func() bool { next, _ := current(); return next > term })
		proxies[who].Thaw()
	}
	wait.Within(t, 15*time.Second, "the last leader to append", func() bool { term, _ := current(); return log.guard.Highest("log") == term })
	stop()
	wg.Wait()

	if n := log.outOfOrder(); n != 0 {
		t.Fatalf("%d appends accepted out of term order", n)
	}
	if log.late < rounds/2 {
		t.Fatalf("the guard rejected %d late appends; %d paused leaders each tried one", log.late, rounds/2)
	}
	mu.Lock()
	defer mu.Unlock()
	var terms []fencing.Token
	for term := range elected {
		terms = append(terms, term)
	}
	sortTokens(terms)
	if len(terms) < rounds+1 {
		t.Fatalf("%d terms, want at least %d", len(terms), rounds+1)
	}
	for i := 1; i < len(terms); i++ {
		prev, next := terms[i-1], terms[i]
		end, ok := cancelled[prev]
		if !ok || !end.Before(elected[next]) {
			t.Errorf("term %d's context ended at %v, term %d was elected at %v: not before", prev, end, next, elected[next])
			continue
		}
		t.Logf("term %d ended %s before term %d was elected", prev, elected[next].Sub(end).Round(time.Millisecond), next)
	}
}

func sortTokens(ts []fencing.Token) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j] < ts[j-1]; j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// leaderLoop runs RunAsLeader for one candidate that appends to log while it
// leads, and counts appends per term.
type leaderLoop struct {
	log     *appendLog
	mu      sync.Mutex
	appends map[fencing.Token]int
	demoted int
}

func (l *leaderLoop) run(ctx context.Context, t *testing.T, c *clientlib.Client, name string, ttl time.Duration, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := c.RunAsLeader(ctx, name, "", func(lctx context.Context, lead *clientlib.Leadership) error {
			term := lead.Term()
			for lctx.Err() == nil {
				if err := l.log.append(term); err != nil {
					return err
				}
				l.mu.Lock()
				l.appends[term]++
				l.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		}, clientlib.WithElectionSession(clientlib.WithTTL(ttl)), clientlib.WithElectionBackoff(50*time.Millisecond, 500*time.Millisecond),
			clientlib.OnDemoted(func(fencing.Token, error) { l.mu.Lock(); l.demoted++; l.mu.Unlock() }))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("RunAsLeader = %v", err)
		}
	}()
}

// leading returns the highest term that appended and its append count.
func leading(loops ...*leaderLoop) (fencing.Token, int) {
	var top fencing.Token
	n := 0
	for _, l := range loops {
		l.mu.Lock()
		for term, c := range l.appends {
			if term > top {
				top, n = term, c
			}
		}
		l.mu.Unlock()
	}
	return top, n
}

// TestRunAsLeaderSurvivesRestart restarts the daemon under two RunAsLeader
// loops: quickly (the sessions outlive the outage, so leadership may
// continue), and for longer than the session TTL (the leader's context
// ends during the outage; a new session is elected after). Either way a
// leader works again afterwards, and no append is accepted out of order.
func TestRunAsLeaderSurvivesRestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.GRPCAddr = freeport.Addr(t)
	// Stopped at the test's end even after a failure (start); the restart
	// below stops it earlier, which Stop allows (it is idempotent).
	d := start(t, cfg)
	log := &appendLog{}
	a := &leaderLoop{log: log, appends: map[fencing.Token]int{}}
	b := &leaderLoop{log: log, appends: map[fencing.Token]int{}}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	a.run(ctx, t, newClient(t, cfg.GRPCAddr), "restart", 3*time.Second, &wg)
	b.run(ctx, t, newClient(t, cfg.GRPCAddr), "restart", 3*time.Second, &wg)
	working := func(after fencing.Token, n int) func() bool {
		return func() bool { term, c := leading(a, b); return term > after || (term == after && c > n+10) }
	}
	wait.Within(t, 10*time.Second, "a leader to work", working(0, 0))

	// A quick restart.
	term, n := leading(a, b)
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	d = start(t, cfg)
	wait.Within(t, 20*time.Second, "a leader to work after a quick restart", working(term, n))
	t.Logf("quick restart: term %d before, %d after", term, func() fencing.Token { t, _ := leading(a, b); return t }())

	// An outage longer than the TTL: the leader must stop working during it.
	term, _ = leading(a, b)
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 10*time.Second, "the leader to stop during the outage", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		b.mu.Lock()
		defer b.mu.Unlock()
		return a.demoted+b.demoted > 0
	})
	_, n = leading(a, b)
	d = start(t, cfg)
	wait.Within(t, 20*time.Second, "a new leader to work after a long outage", working(term, n))
	stop()
	wg.Wait()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := log.outOfOrder(); n != 0 {
		t.Fatalf("%d appends accepted out of term order", n)
	}
}

// TestRunAsLeaderSurvivesEtcdLeaderLoss stops the member that is etcd's
// leader under two RunAsLeader loops connected to all three members: a
// leader works again afterwards, and no append is accepted out of order.
func TestRunAsLeaderSurvivesEtcdLeaderLoss(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	var endpoints []string
	leader := 0
	for i, d := range ds {
		endpoints = append(endpoints, d.GRPCAddr())
		if d.Etcd().Server.Leader() == d.Etcd().Server.MemberID() {
			leader = i
		}
	}
	log := &appendLog{}
	a := &leaderLoop{log: log, appends: map[fencing.Token]int{}}
	b := &leaderLoop{log: log, appends: map[fencing.Token]int{}}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	a.run(ctx, t, newClient(t, endpoints...), "ha", 5*time.Second, &wg)
	b.run(ctx, t, newClient(t, endpoints...), "ha", 5*time.Second, &wg)
	wait.Within(t, 10*time.Second, "a leader to work", func() bool { term, n := leading(a, b); return term > 0 && n > 10 })
	term, n := leading(a, b)
	if err := ds[leader].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 20*time.Second, "a leader to work after etcd's leader stopped", func() bool {
		after, c := leading(a, b)
		return after > term || c > n+20
	})
	after, _ := leading(a, b)
	stop()
	wg.Wait()
	if n := log.outOfOrder(); n != 0 {
		t.Fatalf("%d appends accepted out of term order", n)
	}
	t.Logf("term %d before etcd's leader stopped, %d after", term, after)
}

// TestObserveResumesAcrossRestart: an SDK observer whose daemon restarts
// reconnects and resumes after the last revision it delivered: the
// changes made while it was away arrive once each, in order.
func TestObserveResumesAcrossRestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.GRPCAddr = freeport.Addr(t)
	// Stopped at the test's end even after a failure (start); the restart
	// below stops it earlier, which Stop allows (it is idempotent).
	d := start(t, cfg)
	ctx := t.Context()
	c := newClient(t, cfg.GRPCAddr)
	sess, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := sess.Campaign(ctx, "resume", "v0")
	if err != nil {
		t.Fatal(err)
	}
	obs := newClient(t, cfg.GRPCAddr).Observe(ctx, "resume")
	var seen []string
	next := func() clientlib.ElectionEvent {
		t.Helper()
		select {
		case ev := <-obs.Events():
			seen = append(seen, fmt.Sprintf("%s:%s", ev.Type, ev.Leader.Value))
			return ev
		case <-time.After(wait.Bound(20 * time.Second)):
			t.Fatalf("no event; seen %v", seen)
		}
		panic("unreachable")
	}
	if ev := next(); ev.Type != clientlib.ElectionElected || !ev.Current {
		t.Fatalf("first event %+v", ev)
	}
	if err := l.Proclaim(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	next()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
	// Changes made while the observer reconnects.
	for _, v := range []string{"v2", "v3"} {
		if err := l.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	next()
	next()
	want := []string{"ELECTED:v0", "PROCLAIMED:v1", "PROCLAIMED:v2", "PROCLAIMED:v3"}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", seen, want)
	}
}

// OnDemoted tells a finished term from a failed one: nil when the callback
// returned nil (its work done, leadership resigned), the callback's error
// when it failed.
func TestRunAsLeaderDemotedCause(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	boom := errors.New("boom")
	var causes []error
	calls := 0
	err := c.RunAsLeader(t.Context(), "demoted-cause", "v", func(context.Context, *clientlib.Leadership) error {
		calls++
		if calls == 1 {
			return boom // campaign again after a backoff
		}
		return nil // done
	}, clientlib.WithElectionBackoff(10*time.Millisecond, 10*time.Millisecond),
		clientlib.OnDemoted(func(_ fencing.Token, cause error) { causes = append(causes, cause) }))
	if err != nil {
		t.Fatalf("RunAsLeader = %v, want nil after a callback that returned nil", err)
	}
	if len(causes) != 2 || !errors.Is(causes[0], boom) || causes[1] != nil {
		t.Fatalf("OnDemoted causes = %v, want [boom <nil>]", causes)
	}
}

// Elections with a leader or candidates are listed by prefix, over REST
// and the SDK, in pages that do not overlap; a resigned election is gone.
func TestListElections(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var leads []*clientlib.Leadership
	for _, name := range []string{"batch/a", "batch/b", "batch/c", "batchx", "other"} {
		l, err := s.Campaign(t.Context(), name, "v")
		if err != nil {
			t.Fatal(err)
		}
		leads = append(leads, l)
	}
	got, err := c.Admin().ListElections(t.Context(), "batch/")
	if err != nil || !slices.Equal(got, []string{"batch/a", "batch/b", "batch/c"}) {
		t.Fatalf("ListElections(batch/) = %q, %v", got, err)
	}
	base := "http://" + d.HTTPAddr()
	var pages []any
	token := ""
	for {
		r := call(t, "GET", base+"/v1/elections?prefix=batch&pageSize=2&pageToken="+token, "")
		if r.status != 200 {
			t.Fatalf("GET /v1/elections = %d %v", r.status, r.body)
		}
		pages = append(pages, r.body["names"].([]any)...)
		if token, _ = r.body["nextPageToken"].(string); token == "" {
			break
		}
	}
	if fmt.Sprint(pages) != "[batch/a batch/b batch/c batchx]" {
		t.Fatalf("paged REST list = %v", pages)
	}
	if err := leads[0].Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Admin().ListElections(t.Context(), "batch/"); !slices.Equal(got, []string{"batch/b", "batch/c"}) {
		t.Fatalf("after resigning batch/a: %q", got)
	}
	if r := call(t, "GET", base+"/v1/elections?prefix=a%20b", ""); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
		t.Fatalf("bad prefix = %d %v", r.status, r.body)
	}
}

// A session that campaigns and resigns again and again uses one campaign
// id, so one candidate key, in an election (see the same for locks); a
// campaign after a resignation that failed gets an id of its own.
func TestResignedCampaignIDsAreUsedAgain(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leaderID := func() string {
		t.Helper()
		l, err := c.Leader(ctx, "ids/e")
		if err != nil {
			t.Fatal(err)
		}
		return l.RequestID
	}
	l, err := s.Campaign(ctx, "ids/e", "a")
	if err != nil {
		t.Fatal(err)
	}
	first, firstTerm := leaderID(), l.Term()
	for range 3 {
		if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if l, err = s.Campaign(ctx, "ids/e", "a"); err != nil {
			t.Fatal(err)
		}
		if id := leaderID(); id != first {
			t.Fatalf("campaign after a resignation: id %q, want the resigned one %q", id, first)
		}
	}
	if l.Term() <= firstTerm {
		t.Fatalf("term %d after %d, want a new, larger one", l.Term(), firstTerm)
	}
	// Forced: the leader is not asked (asked, it would resign itself,
	// and its id would be free again), so its own resignation fails.
	if err := c.Admin().Resign(ctx, "ids/e", l.Term(), clientlib.Force()); err != nil {
		t.Fatal(err)
	}
	if err := l.Resign(ctx); err != nil && !errors.Is(err, clientlib.ErrNotLeader) {
		t.Fatalf("Resign of a term resigned from outside: %v, want ErrNotLeader or nil", err)
	}
	if _, err = s.Campaign(ctx, "ids/e", "a"); err != nil {
		t.Fatal(err)
	}
	if id := leaderID(); id == first {
		t.Fatalf("campaign after a failed resignation used its id %q again", id)
	}
}

// A REST candidate that names no request id gets one the server picks and,
// after resigning (by term, as curl would), the same one for its next
// campaign in the election, with a new term.
func TestServerPickedCampaignIDsAreUsedAgainOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	sid := restSession(t, base)
	campaign := func() (requestID, term string) {
		t.Helper()
		r := call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"rest/ids","sessionId":%q,"value":"v"}`, sid))
		if r.status != 200 {
			t.Fatalf("campaign = %d %v", r.status, r.body)
		}
		l := r.body["leadership"].(map[string]any)
		return l["requestId"].(string), l["term"].(string)
	}
	first, t1 := campaign()
	if r := call(t, "POST", base+"/v1/elections:resign", fmt.Sprintf(`{"name":"rest/ids","term":%q,"sessionId":%q}`, t1, sid)); r.status != 200 {
		t.Fatalf("resign = %d %v", r.status, r.body)
	}
	again, t2 := campaign()
	if again != first || t2 == t1 {
		t.Fatalf("after resigning: request id %q term %s, want the picked id %q again with a new term (was %s)", again, t2, first, t1)
	}
	if r := call(t, "POST", base+"/v1/elections:resign", fmt.Sprintf(`{"name":"rest/ids","term":%q,"sessionId":%q}`, t2, sid)); r.status != 200 {
		t.Fatalf("resign = %d %v", r.status, r.body)
	}
	// The caller names the picked id itself: a campaign naming none must
	// not join that candidacy (it is the session's own: ALREADY_LEADER).
	r := call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"rest/ids","sessionId":%q,"value":"v","requestId":%q}`, sid, first))
	if r.status != 200 {
		t.Fatalf("campaign naming the id = %d %v", r.status, r.body)
	}
	r = call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"rest/ids","sessionId":%q,"value":"w"}`, sid))
	if r.status == 200 || reason(r) != "ALREADY_LEADER" {
		t.Fatalf("campaign naming no id while the session leads under the picked id: %d %v, want ALREADY_LEADER", r.status, r.body)
	}
}
