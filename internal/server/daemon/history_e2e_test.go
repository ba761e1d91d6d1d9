package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// historyOf lists the lock's (or election's) history through the SDK, in
// brief: type, token and owner.
func historyOf(t *testing.T, c *clientlib.Client, election bool, name string) []string {
	t.Helper()
	list := c.Admin().LockHistory
	if election {
		list = c.Admin().ElectionHistory
	}
	var out []string
	for e, err := range list(t.Context(), name, clientlib.HistoryQuery{PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %d %s", e.Type, e.Token, e.Owner))
	}
	return out
}

func waitHistory(t *testing.T, c *clientlib.Client, election bool, name string, want []string) {
	t.Helper()
	var got []string
	wait.Within(t, time.Minute, "the history of "+name, func() bool {
		got = historyOf(t, c, election, name)
		return len(got) >= len(want)
	})
	if !slices.Equal(got, want) {
		t.Fatalf("history of %s:\n got %q\nwant %q", name, got, want)
	}
}

// The history names every grant and end, with the reason, through the SDK
// and REST; a session nobody renews shows as EXPIRED by the member that
// ended it; the history outlives a restart, and the restarted daemon
// records on.
func TestHistoryRecordsGrantsAndEndsAndSurvivesARestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.GRPCAddr = freeport.Addr(t)
	d := start(t, cfg)
	c := newClient(t, cfg.GRPCAddr)
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("billing"))
	if err != nil {
		t.Fatal(err)
	}
	l1, err := s.Lock(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A holder nobody keeps alive: its session ends after its TTL.
	dead, err := c.Admin().CreateSession(ctx, 2*time.Second, "cron", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := c.Admin().Acquire(ctx, dead.ID, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	l3, err := s.Lock(ctx, "ledger") // waits for the dead holder's expiry
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("GRANTED %d billing", l1.Token()), fmt.Sprintf("RELEASED %d billing", l1.Token()),
		fmt.Sprintf("GRANTED %d cron", g2.Token), fmt.Sprintf("EXPIRED %d cron", g2.Token),
		fmt.Sprintf("GRANTED %d billing", l3.Token()),
	}
	waitHistory(t, c, false, "ledger", want)
	var expired clientlib.HistoryEvent
	for e, err := range c.Admin().LockHistory(ctx, "ledger", clientlib.HistoryQuery{}) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == "EXPIRED" {
			expired = e
		}
		if e.Token == l3.Token() && e.HandedFrom != g2.Token {
			t.Errorf("the grant after the expiry names %d as its predecessor, want %d", e.HandedFrom, g2.Token)
		}
	}
	if !strings.Contains(expired.Reason, "not renewed") || !strings.Contains(expired.Reason, "member ") || expired.Held < time.Second {
		t.Errorf("expiry = %+v, want a reason naming the member that ended it and a hold of about the TTL", expired)
	}

	// REST: the reason at hand, tokens as strings, an owner filter, paging.
	base := "http://" + d.HTTPAddr() + "/v1/locks:history?name=ledger&owner=cron&pageSize=1"
	r := call(t, "GET", base, "")
	evs, _ := r.body["events"].([]any)
	if r.status != 200 || len(evs) != 1 || r.body["nextPageToken"] == "" {
		t.Fatalf("REST history = %d %v, want one event of cron and a next page", r.status, r.body)
	}
	first := evs[0].(map[string]any)
	if first["type"] != "HISTORY_EVENT_TYPE_GRANTED" || first["token"] != fmt.Sprint(g2.Token) || first["owner"] != "cron" {
		t.Fatalf("REST event = %v", first)
	}
	r = call(t, "GET", base+"&pageToken="+url.QueryEscape(r.body["nextPageToken"].(string)), "")
	if evs, _ := r.body["events"].([]any); r.status != 200 || len(evs) != 1 || evs[0].(map[string]any)["type"] != "HISTORY_EVENT_TYPE_EXPIRED" {
		t.Fatalf("REST history, page 2 = %d %v", r.status, r.body)
	}
	if r := call(t, "GET", "http://"+d.HTTPAddr()+"/v1/locks:history?name=ledger&pageSize=5000", ""); r.status != 400 {
		t.Fatalf("REST history with a page of 5000 = %d %v, want 400", r.status, r.body)
	}

	// Elections.
	lead, err := s.Campaign(ctx, "primary", "db-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitHistory(t, c, true, "primary", []string{fmt.Sprintf("ELECTED %d billing", lead.Term()), fmt.Sprintf("RESIGNED %d billing", lead.Term())})

	// A restart keeps what was recorded, and records on.
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitHistory(t, c, false, "ledger", append(slices.Clone(want), fmt.Sprintf("RELEASED %d billing", l3.Token())))
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
	c2 := newClient(t, cfg.GRPCAddr)
	s2, err := c2.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("after"))
	if err != nil {
		t.Fatal(err)
	}
	l4, err := s2.Lock(ctx, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	waitHistory(t, c2, false, "ledger", append(slices.Clone(want), fmt.Sprintf("RELEASED %d billing", l3.Token()), fmt.Sprintf("GRANTED %d after", l4.Token())))
}

// On three members one records; when it stops, another takes over from
// its cursor: the events made while it was going away are there, once.
func TestHistoryMovesToAnotherMemberWhenTheRecorderStops(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	var rec int
	wait.Within(t, time.Minute, "one member recording", func() bool {
		n := 0
		for i, d := range ds {
			if d.Metric("coordd_history_recording") == 1 {
				rec, n = i, n+1
			}
		}
		return n == 1
	})
	other := ds[(rec+1)%3]
	c := newClient(t, other.GRPCAddr())
	ctx := t.Context()
	// A cluster's first moments, and a member's stop, may refuse a call
	// before it acted (ErrUnavailable): it is tried again, as a client
	// must.
	unavailable := func(err error) bool {
		if err != nil && !errors.Is(err, clientlib.ErrUnavailable) {
			t.Fatal(err)
		}
		return err == nil
	}
	var s *clientlib.Session
	wait.Within(t, 10*time.Second, "a session", func() bool {
		var err error
		s, err = c.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("mover"))
		return unavailable(err)
	})
	var want []string
	take := func() {
		var l *clientlib.Lock
		wait.Within(t, 10*time.Second, "a grant", func() bool {
			var err error
			l, err = s.Lock(ctx, "moved")
			return unavailable(err)
		})
		wait.Within(t, 10*time.Second, "a release", func() bool { return unavailable(l.Release(ctx)) })
		want = append(want, fmt.Sprintf("GRANTED %d mover", l.Token()), fmt.Sprintf("RELEASED %d mover", l.Token()))
	}
	take()
	waitHistory(t, c, false, "moved", want)
	if err := ds[rec].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	take() // while no member records, or the next one starts
	wait.Within(t, 20*time.Second, "another member recording", func() bool {
		return other.Metric("coordd_history_recording") == 1 || ds[(rec+2)%3].Metric("coordd_history_recording") == 1
	})
	take()
	// Attempts whose answers a member's stop cut off may have been granted
	// (and ended) too: the history holds those as well. Every grant the
	// test took is there, each event once, and (once stray grants are
	// cleaned up) every grant ended.
	var got []string
	wait.Within(t, 45*time.Second, "the history of moved", func() bool {
		got = historyOf(t, c, false, "moved")
		n := 0
		for _, e := range got {
			if strings.HasPrefix(e, "GRANTED") {
				n++
			}
		}
		return isSubsequence(want, got) && 2*n == len(got)
	})
	seen, grants, ends := map[string]bool{}, 0, 0
	for _, e := range got {
		if seen[e] {
			t.Fatalf("%q recorded twice: %q", e, got)
		}
		seen[e] = true
		if strings.HasPrefix(e, "GRANTED") {
			grants++
		} else {
			ends++
		}
	}
	if grants != ends {
		t.Fatalf("%d grants, %d ends: %q", grants, ends, got)
	}
}

// isSubsequence reports whether every element of want is in got, in order.
func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// The history shows an event a moment after its commit; a read that names
// the release's revision (its answer says it) as minRevision waits until
// the history has it, and shows the grant and its release at once. A
// revision the cluster has not reached, or a negative one, is refused
// with INVALID_ARGUMENT.
func TestHistoryReadsWaitForARevision(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	s := call(t, "POST", base+"/v1/sessions", `{"ttl":"30s"}`).body["session"].(map[string]any)["id"].(string)
	for i := range 5 { // each read right after its release
		name := fmt.Sprintf("at-once/%d", i)
		g := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":%q,"sessionId":%q}`, name, s))
		token := g.body["grant"].(map[string]any)["token"].(string)
		r := call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":%q,"token":%q,"sessionId":%q}`, name, token, s))
		rev, _ := r.body["revision"].(string)
		if r.status != 200 || rev == "" || rev == "0" {
			t.Fatalf("release: %d %v; want its revision", r.status, r.body)
		}
		h := call(t, "GET", base+"/v1/locks:history?name="+url.QueryEscape(name)+"&minRevision="+rev, "")
		evs, _ := h.body["events"].([]any)
		if h.status != 200 || len(evs) != 2 {
			t.Fatalf("history at the release's revision %s: %d %v; want the grant and the release", rev, h.status, h.body)
		}
	}
	// From Go: a holder's Release and a leader's Resign say their
	// revision, and a history read from it shows the end at once.
	c := newClient(t, d.GRPCAddr())
	sess, err := c.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	l, err := sess.Lock(t.Context(), "at-once/go")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(t.Context()); err != nil || l.ReleasedAt() == 0 {
		t.Fatalf("Release: %v, ReleasedAt %d; want its revision", err, l.ReleasedAt())
	}
	ld, err := sess.Campaign(t.Context(), "at-once/go", "v")
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Resign(t.Context()); err != nil || ld.ResignedAt() == 0 {
		t.Fatalf("Resign: %v, ResignedAt %d; want its revision", err, ld.ResignedAt())
	}
	for kind, rev := range map[string]int64{"lock": l.ReleasedAt(), "election": ld.ResignedAt()} {
		events := c.Admin().LockHistory
		if kind == "election" {
			events = c.Admin().ElectionHistory
		}
		var types []string
		for ev, err := range events(t.Context(), "at-once/go", clientlib.HistoryQuery{MinRevision: rev}) {
			if err != nil {
				t.Fatal(err)
			}
			types = append(types, ev.Type)
		}
		if len(types) != 2 {
			t.Errorf("%s history from revision %d: %v; want the grant and its end", kind, rev, types)
		}
	}
	for _, bad := range []string{"minRevision=999999999", "minRevision=-1"} {
		if r := call(t, "GET", base+"/v1/locks:history?name=at-once/0&"+bad, ""); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
			t.Errorf("history with %s: %d %v; want 400 INVALID_ARGUMENT", bad, r.status, r.body)
		}
	}
}
