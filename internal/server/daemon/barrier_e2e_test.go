package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// A barrier of three opens only when the third arrives, lets all three
// through, and as a double barrier lets them out only once the last has
// left; then a new round starts from nothing.
func TestBarrierOpensAtTheCountAndLetsAllOutTogether(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	var sess []*clientlib.Session
	for range 3 {
		s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sess = append(sess, s)
	}
	entered := make(chan *clientlib.Barrier, 3)
	enter := func(s *clientlib.Session) {
		go func() {
			b, err := s.EnterBarrier(ctx, "jobs/nightly", 3)
			if err != nil {
				t.Error(err)
			}
			entered <- b
		}()
	}
	participants := func() int {
		st, err := c.Admin().DescribeBarrier(ctx, "jobs/nightly")
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Participants)
	}
	enter(sess[0])
	enter(sess[1])
	wait.Within(t, 10*time.Second, "two participants in", func() bool { return participants() == 2 })
	select {
	case <-entered:
		t.Fatal("the barrier opened with two of three participants in")
	case <-time.After(300 * time.Millisecond): // nothing may come: a bounded look
	}
	if st, _ := c.Admin().DescribeBarrier(ctx, "jobs/nightly"); st.Open {
		t.Fatal("the barrier is open with two of three participants")
	}
	enter(sess[2])
	var bs []*clientlib.Barrier
	for range 3 {
		select {
		case b := <-entered:
			bs = append(bs, b)
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatal("the barrier did not let all three through once the third arrived")
		}
	}
	// Leaving: the first two wait for the last.
	left := make(chan error, 3)
	go func() { left <- bs[0].Leave(ctx) }()
	go func() { left <- bs[1].Leave(ctx) }()
	wait.Within(t, 10*time.Second, "two participants out", func() bool { return participants() == 1 })
	select {
	case err := <-left:
		t.Fatalf("a participant got out before the last had left (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := bs[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-left; err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := c.Admin().DescribeBarrier(ctx, "jobs/nightly"); st.Open || len(st.Participants) > 0 {
		t.Fatalf("after everyone left: %+v, want closed and empty", st)
	}
}

// A dead participant leaves with its session; a wait that runs out takes
// the participant out; an Open lets a waiting participant through at
// once; one arriving at an open barrier passes.
func TestBarrierParticipantsAreSessionBound(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	newSession := func() *clientlib.Session {
		s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1, s2 := newSession(), newSession()
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s1.EnterBarrier(wctx, "b/x", 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait that runs out: %v", err)
	}
	if st, _ := c.Admin().DescribeBarrier(ctx, "b/x"); len(st.Participants) != 0 {
		t.Fatalf("the timed-out participant stayed: %+v", st)
	}

	done := make(chan error, 1)
	go func() { _, err := s1.EnterBarrier(ctx, "b/y", 2); done <- err }()
	wait.Within(t, 10*time.Second, "s1 in b/y", func() bool {
		st, _ := c.Admin().DescribeBarrier(ctx, "b/y")
		return len(st.Participants) == 1
	})
	if err := s1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("EnterBarrier returned nil after its session closed")
	}
	wait.Within(t, 10*time.Second, "the dead participant gone", func() bool {
		st, _ := c.Admin().DescribeBarrier(ctx, "b/y")
		return len(st.Participants) == 0
	})
	// A new round needs two live participants again.
	s3 := newSession()
	go func() { _, err := s2.EnterBarrier(ctx, "b/y", 2); done <- err }()
	if _, err := s3.EnterBarrier(ctx, "b/y", 2); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Opened by hand, however many are in.
	go func() { _, err := s2.EnterBarrier(ctx, "b/z", 10, clientlib.WithParticipant("w-1")); done <- err }()
	wait.Within(t, 10*time.Second, "w-1 in b/z", func() bool {
		st, _ := c.Admin().DescribeBarrier(ctx, "b/z")
		return len(st.Participants) == 1 && st.Participants[0].Participant == "w-1"
	})
	if err := c.Admin().OpenBarrier(ctx, "b/z"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("OpenBarrier did not let the waiting participant through")
	}
	if _, err := s3.EnterBarrier(ctx, "b/z", 10); err != nil {
		t.Fatalf("arriving at an open barrier: %v", err)
	}
	if _, err := s3.EnterBarrier(ctx, "b/z", 0); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Errorf("count 0: %v, want ErrInvalidArgument", err)
	}
}

// Over REST: enter (count 1 opens at once), describe, leave.
func TestBarrierOverREST(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	sess := restSession(t, base)
	r := call(t, "POST", base+"/v1/barriers:enter", `{"name":"rest/b","sessionId":"`+sess+`","count":1,"wait":"5s"}`)
	if r.status != 200 || fmt.Sprint(r.body["participants"]) != "1" {
		t.Fatalf("enter = %d %v", r.status, r.body)
	}
	desc := call(t, "GET", base+"/v1/barriers/rest/b", "")
	if desc.status != 200 || desc.body["open"] != true || len(desc.body["participants"].([]any)) != 1 || fmt.Sprint(desc.body["participantCount"]) != "1" {
		t.Fatalf("describe = %d %v", desc.status, desc.body)
	}
	// Paged: a second participant, one per page.
	other := restSession(t, base)
	if r := call(t, "POST", base+"/v1/barriers:enter", `{"name":"rest/b","sessionId":"`+other+`","count":1,"wait":"5s"}`); r.status != 200 {
		t.Fatalf("second enter = %d %v", r.status, r.body)
	}
	first := call(t, "GET", base+"/v1/barriers/rest/b?pageSize=1", "")
	token, _ := first.body["nextPageToken"].(string)
	if first.status != 200 || len(first.body["participants"].([]any)) != 1 || fmt.Sprint(first.body["participantCount"]) != "2" || token == "" {
		t.Fatalf("first page = %d %v", first.status, first.body)
	}
	second := call(t, "GET", base+"/v1/barriers/rest/b?pageSize=1&pageToken="+token, "")
	if p, _ := second.body["participants"].([]any); second.status != 200 || len(p) != 1 || second.body["nextPageToken"] != nil && second.body["nextPageToken"] != "" ||
		p[0].(map[string]any)["sessionId"] != other {
		t.Fatalf("second page = %d %v; want the second participant, %s, and no next page", second.status, second.body, other)
	}
	if r := call(t, "GET", base+"/v1/barriers/rest/b?pageToken=x", ""); r.status != 400 {
		t.Fatalf("a bad page token = %d %v, want 400", r.status, r.body)
	}
	otherLeft := make(chan int, 1)
	go func() { // not call: it may end the test, which only the test's goroutine may
		resp, err := httpClient.Post(base+"/v1/barriers:leave", "application/json", strings.NewReader(`{"name":"rest/b","sessionId":"`+other+`"}`))
		if err != nil {
			otherLeft <- -1
			return
		}
		_ = resp.Body.Close()
		otherLeft <- resp.StatusCode
	}()
	if r := call(t, "POST", base+"/v1/barriers:leave", `{"name":"rest/b","sessionId":"`+sess+`"}`); r.status != 200 {
		t.Fatalf("leave = %d %v", r.status, r.body)
	}
	if status := <-otherLeft; status != 200 {
		t.Fatalf("the second participant's leave = %d", status)
	}
	if r := call(t, "POST", base+"/v1/barriers:enter", `{"name":"rest/b","sessionId":"`+sess+`","count":0}`); r.status != 400 {
		t.Fatalf("count 0 = %d %v, want 400", r.status, r.body)
	}
}

// TestConsoleShowsABarrier: the console's barrier page shows who has
// entered a barrier, live, and opens it for the one waiting.
func TestConsoleShowsABarrier(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan error, 1)
	go func() {
		_, err := s.EnterBarrier(ctx, "jobs/nightly", 3, clientlib.WithParticipant("worker-1"))
		entered <- err
	}()
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")
	p.open("#/barriers")
	p.run("name the barrier", chromedp.SendKeys(chromedp.CSS(`main input[aria-label="Barrier name"]`), "jobs/nightly\n"))
	p.see("main", "closed")
	p.see("main table", "worker-1")
	p.screenshot("barrier")
	p.run("open it", chromedp.Click(chromedp.Search(`//button[text()="Open it now…"]`)))
	p.confirm()
	p.see("main .badge.ok", "open")
	select {
	case err := <-entered:
		if err != nil {
			t.Fatalf("the waiting participant: %v", err)
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the console's opening did not let the participant in")
	}
}
