package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/syncbuf"
)

// Leader priority, preemption and hand-over through the Go SDK: the
// highest priority waiting leads next; a higher-priority candidate's
// request reaches the leader's callback; Transfer hands the seat to a
// named successor with a new term, the old term fenced out at once, and
// an observer sees one change, no vacancy.
func TestPriorityPreemptionAndTransferThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	sess := func(owner string) *clientlib.Session {
		s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner(owner))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, low, high := sess("a"), sess("low"), sess("high")

	var asked atomic.Pointer[clientlib.Candidate]
	la, err := a.Campaign(ctx, "svc", "a", clientlib.WithPriority(1), clientlib.OnPreempt(func(by clientlib.Candidate) { asked.Store(&by) }))
	if err != nil || la.Priority() != 1 {
		t.Fatalf("Campaign a = %v, %v", la, err)
	}
	type won struct {
		l   *clientlib.Leadership
		err error
	}
	campaign := func(s *clientlib.Session, value string, opts ...clientlib.CampaignOption) <-chan won {
		ch := make(chan won, 1)
		go func() {
			l, err := s.Campaign(ctx, "svc", value, opts...)
			ch <- won{l, err}
		}()
		return ch
	}
	lowC := campaign(low, "low", clientlib.WithPriority(0))
	wait.For(t, "low to wait", func() bool { cs, _ := c.Candidates(ctx, "svc"); return len(cs) == 1 })
	highC := campaign(high, "high", clientlib.WithPriority(5), clientlib.WithPreempt())
	wait.For(t, "the leader's callback to hear high's request", func() bool { return asked.Load() != nil })
	if by := asked.Load(); by.SessionID != high.ID() || by.Priority != 5 {
		t.Fatalf("preempted by %+v, want high's session at priority 5", by)
	}
	cands, err := c.Candidates(ctx, "svc")
	if err != nil || len(cands) != 2 || cands[0].Value != "high" || cands[0].Priority != 5 || cands[1].Value != "low" {
		t.Fatalf("candidates = %+v, %v; want high, then low", cands, err)
	}
	if ld, err := c.Leader(ctx, "svc"); err != nil || ld.Term != la.Term() || ld.Priority != 1 {
		t.Fatalf("Leader = %+v, %v; a must still lead: a request forces nothing", ld, err)
	}

	// a hands over to low, not to high: the leader names its successor.
	obs := c.Observe(ctx, "svc")
	if ev := <-obs.Events(); ev.Type != clientlib.ElectionElected || ev.Leader.Term != la.Term() {
		t.Fatalf("first event = %+v", ev)
	}
	if ev := <-obs.Events(); ev.Type != clientlib.ElectionPreemptRequested || ev.By.SessionID != high.ID() {
		t.Fatalf("second event = %+v, want the request in force", ev)
	}
	if _, err := la.Transfer(ctx, "00000000000000ff"); !errors.Is(err, clientlib.ErrCandidateNotFound) {
		t.Fatalf("Transfer to no candidate = %v, want ErrCandidateNotFound", err)
	}
	if la.Context().Err() != nil {
		t.Fatal("a failed hand-over ended the leadership")
	}
	term, err := la.Transfer(ctx, low.ID())
	if err != nil || term <= la.Term() {
		t.Fatalf("Transfer = %d, %v", term, err)
	}
	w := <-lowC
	if w.err != nil || w.l.Term() != term {
		t.Fatalf("low's campaign = %v, %v; want term %d", w.l, w.err, term)
	}
	if cause := context.Cause(la.Context()); !errors.Is(cause, clientlib.ErrTransferred) {
		t.Fatalf("a's leadership ended with %v, want ErrTransferred", cause)
	}
	select {
	case <-la.Lost():
		t.Fatal("a hand-over closed Lost: it is no loss")
	default:
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Election: "svc", Token: la.Term()}); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("the old term's fence = %v, want ErrStaleToken", err)
	}
	evs := []clientlib.ElectionEvent{<-obs.Events(), <-obs.Events()}
	if evs[0].Type != clientlib.ElectionResigned || evs[1].Type != clientlib.ElectionElected || evs[0].Revision != evs[1].Revision ||
		evs[1].Leader.Term != term || evs[1].Leader.Value != "low" {
		t.Fatalf("observed %+v, want RESIGNED a and ELECTED low at one revision", evs)
	}
	// high, first in line, takes the seat when low resigns.
	if err := w.l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if w := <-highC; w.err != nil || w.l.Term() <= term {
		t.Fatalf("high's campaign = %v, %v", w.l, w.err)
	}
}

// RunAsLeader with StepDownWhenPreempted yields to a candidate that
// outranks it and asks, and campaigns again behind it.
func TestRunAsLeaderStepsDownWhenPreempted(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var terms atomic.Int64
	causes := make(chan error, 4)
	done := make(chan error, 1)
	go func() {
		done <- c.RunAsLeader(ctx, "yield", "old", func(ctx context.Context, _ *clientlib.Leadership) error {
			terms.Add(1)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, clientlib.StepDownWhenPreempted(), clientlib.WithElectionCampaign(clientlib.WithPriority(1)))
	}()
	wait.For(t, "the first term", func() bool { return terms.Load() == 1 })
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Campaign(ctx, "yield", "new", clientlib.WithPriority(9), clientlib.WithPreempt())
	if err != nil {
		t.Fatalf("the preempting campaign = %v", err)
	}
	if cause := <-causes; !errors.Is(cause, clientlib.ErrPreempted) {
		t.Fatalf("the old leader's work ended with %v, want ErrPreempted", cause)
	}
	wait.For(t, "the old leader to wait again", func() bool {
		cs, _ := c.Candidates(ctx, "yield")
		return len(cs) == 1 && cs[0].Value == "old"
	})
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the old leader's second term", func() bool { return terms.Load() == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunAsLeader = %v, want context.Canceled", err)
	}
}

// Priority, preemption and Transfer over REST.
func TestTransferOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	sid := func() string {
		r := call(t, "POST", base+"/v1/sessions", `{"ttl":"30s","owner":"curl"}`)
		return r.body["session"].(map[string]any)["id"].(string)
	}
	s1, s2, s3 := sid(), sid(), sid()
	r := call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"jobs","sessionId":%q,"value":"one","priority":2}`, s1))
	term := r.body["leadership"].(map[string]any)["term"].(string)
	if r.status != 200 || r.body["leadership"].(map[string]any)["priority"] != float64(2) {
		t.Fatalf("campaign = %d %v", r.status, r.body)
	}
	// Waiting campaigns over REST: they answer once elected.
	answers := make(chan httpResult, 2)
	for _, body := range []string{
		fmt.Sprintf(`{"name":"jobs","sessionId":%q,"value":"two"}`, s2),
		fmt.Sprintf(`{"name":"jobs","sessionId":%q,"value":"three","priority":7,"preempt":true}`, s3),
	} {
		go func() { answers <- call(t, "POST", base+"/v1/elections:campaign", body) }()
	}
	wait.For(t, "two candidates", func() bool {
		r := call(t, "GET", base+"/v1/elections:candidates?name=jobs", "")
		c, _ := r.body["candidates"].([]any)
		return len(c) == 2
	})
	r = call(t, "GET", base+"/v1/elections:candidates?name=jobs", "")
	first := r.body["candidates"].([]any)[0].(map[string]any)
	if first["value"] != "three" || first["priority"] != float64(7) || first["joinedRevision"] == nil {
		t.Fatalf("candidates = %v, want three first with its priority and joined revision", r.body)
	}
	// The preemption request is in force: a new observer sees it (the
	// candidate joins before it asks: the request may come a moment later).
	observed := func() (string, bool) {
		octx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req, _ := http.NewRequestWithContext(octx, "GET", base+"/v1/elections:observe?name=jobs", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		lines := bufio.NewScanner(resp.Body)
		if !lines.Scan() {
			t.Fatal(lines.Err())
		}
		var line struct {
			Result struct {
				Events []struct {
					Type string         `json:"type"`
					By   map[string]any `json:"by"`
				} `json:"events"`
			} `json:"result"`
		}
		if err := json.Unmarshal(lines.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		evs := line.Result.Events
		return lines.Text(), len(evs) == 2 && evs[1].Type == "ELECTION_EVENT_TYPE_PREEMPT_REQUESTED" && evs[1].By["sessionId"] == s3
	}
	wait.For(t, "an observer to see the preemption request in force", func() bool {
		text, ok := observed()
		if !ok && !strings.Contains(text, "ELECTION_EVENT_TYPE_ELECTED") {
			t.Fatalf("observed %s, want ELECTED and the request by %s", text, s3)
		}
		return ok
	})

	for _, tc := range []struct {
		body   string
		status int
		reason string
	}{
		{fmt.Sprintf(`{"name":"jobs","term":%q,"successorSessionId":"00000000000000ff"}`, term), 404, "CANDIDATE_NOT_FOUND"},
		{fmt.Sprintf(`{"name":"jobs","term":"1","successorSessionId":%q}`, s2), 400, "NOT_LEADER"},
		{fmt.Sprintf(`{"name":"jobs","term":%q}`, term), 400, "INVALID_ARGUMENT"},
	} {
		r := call(t, "POST", base+"/v1/elections:transfer", tc.body)
		if r.status != tc.status || reason(r) != tc.reason {
			t.Errorf("transfer %s = %d %s, want %d %s (%v)", tc.body, r.status, reason(r), tc.status, tc.reason, r.body)
		}
	}
	r = call(t, "POST", base+"/v1/elections:transfer", fmt.Sprintf(`{"name":"jobs","term":%q,"successorSessionId":%q}`, term, s2))
	if r.status != 200 {
		t.Fatalf("transfer = %d %v", r.status, r.body)
	}
	next := r.body["term"].(string)
	got := <-answers
	if got.status != 200 || got.body["leadership"].(map[string]any)["term"] != next || got.body["leadership"].(map[string]any)["value"] != "two" {
		t.Fatalf("the successor's campaign answered %d %v, want term %s", got.status, got.body, next)
	}
	r = call(t, "GET", base+"/v1/elections:leader?name=jobs", "")
	if r.body["leader"].(map[string]any)["term"] != next {
		t.Fatalf("leader = %v, want term %s", r.body, next)
	}
	var old int64
	_, _ = fmt.Sscan(term, &old)
	r = call(t, "POST", base+"/v1/locks:validateFence", fmt.Sprintf(`{"election":"jobs","token":"%d"}`, fencing.Token(old)))
	if r.status != 409 {
		t.Fatalf("the old term's fence = %d %v, want 409 STALE_TOKEN", r.status, r.body)
	}
	r = call(t, "POST", base+"/v1/elections:resign", fmt.Sprintf(`{"name":"jobs","term":%q,"sessionId":%q}`, next, s2))
	if got := <-answers; r.status != 200 || got.status != 200 || got.body["leadership"].(map[string]any)["value"] != "three" {
		t.Fatalf("after the resignation: %d, three's campaign %d %v", r.status, got.status, got.body)
	}
}

// A leader whose principal may campaign but not observe cannot hear
// preemption requests: OnPreempt says so once in the client's log and
// stops, instead of retrying the refused observation for the whole term.
func TestOnPreemptWithoutObserveSaysSo(t *testing.T) {
	t.Parallel()
	d := start(t, authConfig(t, `
rules:
  - principals: [carol]
    actions: [session, election.campaign]
    elections: ["p/*"]
`))
	var logs syncbuf.Buffer
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr()}, BearerToken: testTokens["carol"],
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Campaign(t.Context(), "p/x", "v", clientlib.OnPreempt(func(clientlib.Candidate) {}))
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the warning", func() bool { return strings.Contains(logs.String(), "OnPreempt cannot follow the election") })
	if l.Context().Err() != nil {
		t.Fatal("the refused observation ended the leadership")
	}
	if err := l.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
}
