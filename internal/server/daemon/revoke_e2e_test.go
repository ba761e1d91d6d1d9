package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A release from outside asks the holder first. An SDK holder lets go at
// once (ACKNOWLEDGED); a REST holder, which has no stream to hear on,
// keeps the grant until the bound (BOUND), and DescribeLock shows the
// revocation meanwhile; force ends it at once (FORCED). The history
// records each hand-over's outcome and wait, and the metrics count them.
func TestReleasesFromOutsideAskTheHolderFirst(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	c := newClient(t, d.GRPCAddr())
	op := newClient(t, d.GRPCAddr())
	ctx := t.Context()

	// An SDK holder: acknowledged.
	s, err := c.NewSession(ctx, clientlib.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "revoke/sdk")
	if err != nil {
		t.Fatal(err)
	}
	r, err := op.Admin().Revoke(ctx, "revoke/sdk", l.Token())
	if err != nil || r.Outcome != clientlib.RevokeAcknowledged {
		t.Fatalf("revoke an SDK holder = %+v, %v; want acknowledged", r, err)
	}
	if l.Context().Err() == nil {
		t.Fatal("the holder's context still lives after the revocation returned")
	}

	// A REST holder: nobody answers; the bound ends it.
	sid := restSession(t, base)
	g := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"revoke/rest","sessionId":%q}`, sid))
	token := g.body["grant"].(map[string]any)["token"].(string)
	done := make(chan httpResult, 1)
	go func() {
		done <- call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":"revoke/rest","token":%q,"revokeWait":"0.5s"}`, token))
	}()
	wait.For(t, "DescribeLock to show the revocation", func() bool {
		st, err := op.Admin().DescribeLock(ctx, "revoke/rest")
		return err == nil && len(st.Holders) == 1 && !st.Holders[0].RevokingSince.IsZero() &&
			st.Holders[0].RevokingUntil.Sub(st.Holders[0].RevokingSince) == 500*time.Millisecond
	})
	res := <-done
	rev, _ := res.body["revocation"].(map[string]any)
	if res.status != 200 || rev["outcome"] != "OUTCOME_BOUND" {
		t.Fatalf("release of a REST holder = %d %v, want 200 and OUTCOME_BOUND", res.status, res.body)
	}
	if w, err := time.ParseDuration(rev["waited"].(string)); err != nil || w < 500*time.Millisecond {
		t.Fatalf("a revocation that ended at its bound of 0.5s waited %v (%v)", rev["waited"], err)
	}

	// Force: at once, without asking.
	g = call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"revoke/force","sessionId":%q}`, sid))
	token = g.body["grant"].(map[string]any)["token"].(string)
	res = call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":"revoke/force","token":%q,"force":true}`, token))
	if rev, _ := res.body["revocation"].(map[string]any); res.status != 200 || rev["outcome"] != "OUTCOME_FORCED" {
		t.Fatalf("forced release = %d %v, want OUTCOME_FORCED", res.status, res.body)
	}

	// The history says how each ended.
	for name, want := range map[string]string{"revoke/sdk": "acknowledged", "revoke/rest": "bound", "revoke/force": "forced"} {
		wait.For(t, "the history of "+name, func() bool {
			for ev, err := range op.Admin().LockHistory(ctx, name, clientlib.HistoryQuery{}) {
				if err != nil {
					return false
				}
				if ev.Type == "RELEASED" && ev.Revocation == want && strings.Contains(ev.Reason, "from outside") {
					return true
				}
			}
			return false
		})
	}

	// And the metrics count them.
	fams := scrape(t, base)
	for _, outcome := range []string{"acknowledged", "bound", "forced"} {
		if got := value(fams, "coordd_revocations_total", "kind", "lock", "outcome", outcome); got != 1 {
			t.Errorf("coordd_revocations_total{kind=lock,outcome=%s} = %v, want 1", outcome, got)
		}
	}
}

// A resignation from outside asks the leader first: Observe reports
// REVOKING, Leader shows it, and a leader that does not step down (a
// REST leader) loses its term at the bound.
func TestResignationsFromOutsideAskTheLeaderFirst(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	op := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	sid := restSession(t, base)
	r := call(t, "POST", base+"/v1/elections:campaign", fmt.Sprintf(`{"name":"revoke/e","sessionId":%q,"value":"a"}`, sid))
	term := r.body["leadership"].(map[string]any)["term"].(string)
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := op.Observe(octx, "revoke/e").Events()
	done := make(chan httpResult, 1)
	go func() {
		done <- call(t, "POST", base+"/v1/elections:resign", fmt.Sprintf(`{"name":"revoke/e","term":%q,"revokeWait":"0.3s"}`, term))
	}()
	for ev := range events {
		if ev.Type == clientlib.ElectionRevoking {
			if fmt.Sprint(int64(ev.Leader.Term)) != term || ev.Leader.RevokingSince.IsZero() {
				t.Fatalf("REVOKING event %+v, want term %s with its start", ev, term)
			}
			break
		}
	}
	ld, err := op.Leader(ctx, "revoke/e")
	if err != nil || ld.RevokingSince.IsZero() {
		// The bound may have passed already on a slow machine: then
		// nobody leads.
		if err == nil || !strings.Contains(err.Error(), "no leader") {
			t.Fatalf("Leader during the revocation = %+v, %v; want it marked revoking", ld, err)
		}
	}
	res := <-done
	if rev, _ := res.body["revocation"].(map[string]any); res.status != 200 || rev["outcome"] != "OUTCOME_BOUND" {
		t.Fatalf("resign from outside of a REST leader = %d %v, want OUTCOME_BOUND", res.status, res.body)
	}
}

// A session closed from outside puts each of its holdings to its holder
// first (a lock and a leadership here: both acknowledged), removes what it
// waits for without asking, and then ends.
func TestSessionsClosedFromOutsideAskEachHolderFirst(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	op := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.NewSession(ctx, clientlib.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "close/held")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := s.Campaign(ctx, "close/led", "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "close/busy"); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := s.Lock(ctx, "close/busy"); waiting <- err }()
	queued(t, op, "close/busy", 1)

	conn := dialRaw(t, d.GRPCAddr())
	resp, err := coorddv1.NewSessionServiceClient(conn).CloseSession(ctx, &coorddv1.CloseSessionRequest{SessionId: s.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetRevocations()); n != 2 {
		t.Fatalf("close from outside revoked %d holdings (%v), want 2: the lock and the leadership, not the wait", n, resp.GetRevocations())
	}
	for _, r := range resp.GetRevocations() {
		if r.GetOutcome() != coorddv1.Revocation_OUTCOME_ACKNOWLEDGED {
			t.Errorf("revocation %v, want acknowledged", r)
		}
	}
	if l.Context().Err() == nil || lead.Context().Err() == nil {
		t.Fatal("a holding's context lives on after its session was closed from outside")
	}
	if err := <-waiting; err == nil {
		t.Fatal("the session's waiting acquire was granted after its session was closed")
	}
	if st, err := op.Admin().DescribeLock(ctx, "close/busy"); err != nil || len(st.Waiters) != 0 {
		t.Fatalf("the closed session's wait is still queued: %+v, %v", st, err)
	}
}
