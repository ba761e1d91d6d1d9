package daemon_test

import (
	"context"
	"fmt"
	"net/url"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// A crowded lock is described in pages, through the SDK and over REST:
// each page lists the queue in order after the one before, every page
// carries the holder and waiter counts, and a page token is opaque (it
// does not show the token of the entry it continues after: a caller may
// not be allowed to see tokens). Bad page sizes and tokens are refused
// with INVALID_ARGUMENT.
func TestACrowdedLockIsDescribedInPages(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	holder, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Lock(ctx, "crowd"); err != nil {
		t.Fatal(err)
	}
	const n = 45
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		go func() { _, _ = s.Lock(ctx, "crowd", clientlib.WithRequestID(fmt.Sprintf("w%d", i))) }()
	}
	admin := c.Admin()
	wait.For(t, "the crowd to queue", func() bool {
		st, err := admin.DescribeLockPage(ctx, "crowd", clientlib.LockPage{Size: 1})
		return err == nil && st.WaiterCount == n
	})

	var sdkTokens []int64
	for p := (clientlib.LockPage{Size: 10}); ; {
		st, err := admin.DescribeLockPage(ctx, "crowd", p)
		if err != nil {
			t.Fatal(err)
		}
		if st.HolderCount != 1 || st.WaiterCount != n || len(st.Holders)+len(st.Waiters) > 10 {
			t.Fatalf("a page: %d holding, %d waiting, %d listed; want 1, %d, at most 10", st.HolderCount, st.WaiterCount, len(st.Holders)+len(st.Waiters), n)
		}
		for _, e := range append(st.Holders, st.Waiters...) {
			sdkTokens = append(sdkTokens, int64(e.Token))
		}
		if st.NextPageToken == "" {
			break
		}
		if slices.ContainsFunc(st.Waiters, func(e clientlib.LockEntry) bool { return st.NextPageToken == e.Token.String() }) {
			t.Fatalf("the page token %q is an entry's token in the clear", st.NextPageToken)
		}
		p.Token = st.NextPageToken
	}
	if len(sdkTokens) != n+1 || !slices.IsSorted(sdkTokens) {
		t.Fatalf("paged %d entries (%v); want %d in queue order", len(sdkTokens), sdkTokens, n+1)
	}

	base := "http://" + d.HTTPAddr() + "/v1/locks/crowd"
	r := call(t, "GET", base+"?pageSize=20", "")
	if r.status != 200 || len(r.body["waiters"].([]any)) != 19 || fmt.Sprint(r.body["waiterCount"]) != fmt.Sprint(n) || r.body["nextPageToken"] == "" {
		t.Fatalf("GET %s?pageSize=20 = %d %v; want the holder, 19 waiters, the counts and a next page", base, r.status, r.body)
	}
	r = call(t, "GET", base+"?pageSize=20&pageToken="+url.QueryEscape(r.body["nextPageToken"].(string)), "")
	if r.status != 200 || len(r.body["waiters"].([]any)) != 20 || r.body["holders"] != nil && len(r.body["holders"].([]any)) != 0 {
		t.Fatalf("the second page = %d %v; want 20 waiters and no holder", r.status, r.body)
	}
	for _, bad := range []string{"pageSize=1001", "pageSize=-1", "pageToken=12", "pageToken=not-a-token"} {
		if r := call(t, "GET", base+"?"+bad, ""); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
			t.Errorf("GET %s?%s = %d %v; want 400 INVALID_ARGUMENT", base, bad, r.status, r.body)
		}
	}
}

// A crowd of 10,000 (2,000 under the race detector) waits through a
// restart of its member: every waiting Lock (the SDK's, on its call
// stream, parked on the member) is cut off and retried with its request id,
// takes its entry over (its place and token kept), and once the holder
// releases, every waiter is granted exactly once, in the order the crowd
// had queued in before the restart. None is lost or granted twice.
func TestACrowdWaitsThroughARestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.GRPCAddr, cfg.HTTPAddr = freeport.Addr(t), freeport.Addr(t) // the same after the restart
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	newSession := func() *clientlib.Session {
		s, err := c.NewSession(ctx, clientlib.WithTTL(60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	holder, err := newSession().Lock(ctx, "crowd")
	if err != nil {
		t.Fatal(err)
	}
	// 10,000 as the issue of crowds asks; the race detector allows 8,128
	// goroutines in all.
	n := 10000
	if raceEnabled {
		n = 2000
	}
	sessions := []*clientlib.Session{newSession(), newSession(), newSession()}
	type granted struct {
		id    string
		token int64
		err   error
	}
	grants := make(chan granted, n)
	var mu sync.Mutex
	var order []int64 // tokens in grant order
	for i := range n {
		go func() {
			id := fmt.Sprintf("w%d", i)
			l, err := sessions[i%len(sessions)].Lock(ctx, "crowd", clientlib.WithRequestID(id))
			if err != nil {
				grants <- granted{id: id, err: err}
				return
			}
			mu.Lock()
			order = append(order, int64(l.Token()))
			mu.Unlock()
			grants <- granted{id, int64(l.Token()), l.Release(ctx)}
		}()
	}
	admin := c.Admin()
	wait.Within(t, 2*time.Minute, "the crowd to queue", func() bool {
		st, err := admin.DescribeLockPage(ctx, "crowd", clientlib.LockPage{Size: 1})
		return err == nil && st.WaiterCount == n
	})
	var queued []int64 // the waiters' tokens in queue order
	for p := (clientlib.LockPage{Size: 1000}); ; {
		st, err := admin.DescribeLockPage(ctx, "crowd", p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range st.Waiters {
			queued = append(queued, int64(e.Token))
		}
		if p.Token = st.NextPageToken; p.Token == "" {
			break
		}
	}

	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	start(t, cfg) // the same data dir and addresses
	wait.Within(t, 2*time.Minute, "the waiters to wait again", func() bool {
		select {
		case g := <-grants:
			t.Fatalf("waiter %s, before the holder released: %v", g.id, g.err)
		default:
		}
		short, cancel := context.WithTimeout(ctx, wait.Bound(5*time.Second))
		defer cancel()
		st, err := admin.DescribeLock(short, "crowd")
		return err == nil && st.WaiterCount == n
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]int64{}
	for range n {
		select {
		case g := <-grants:
			if g.err != nil {
				t.Fatalf("waiter %s: %v", g.id, g.err)
			}
			if _, twice := tokens[g.id]; twice {
				t.Fatalf("waiter %s was granted twice", g.id)
			}
			tokens[g.id] = g.token
		case <-time.After(wait.Bound(2 * time.Minute)):
			t.Fatalf("%d of %d waiters granted; the others were lost in the restart", len(tokens), n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, queued) {
		t.Fatalf("grants after the restart came in another order than the queue before it (%d grants, %d queued)", len(order), len(queued))
	}
}

// A crowd waiting on the SDK's call stream holds no goroutine on the
// member: each waiting acquisition is parked in the member's view of the
// queue (a registration, not a stack), so that 10,000 waiters (2,000 under
// the race detector, which allows 8,128 goroutines in all) cost the member
// what they are, not 10,000 stacks. Once the holder releases, each is
// granted once, in the order they queued in.
func TestACrowdWaitsWithoutAGoroutineEach(t *testing.T) {
	t.Parallel()
	n := 10000
	if raceEnabled {
		n = 2000
	}
	d := start(t, testConfig(t))
	ctx := t.Context()
	// Three clients, as fleets spread over connections; each could
	// pipeline 16,384 calls on its stream (the member's bound).
	clients := make([]*clientlib.Client, 3)
	sessions := make([]*clientlib.Session, len(clients))
	for i := range clients {
		clients[i] = newClient(t, d.GRPCAddr())
		s, err := clients[i].NewSession(ctx, clientlib.WithTTL(60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	holderSession, err := clients[0].NewSession(ctx, clientlib.WithTTL(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	holder, err := holderSession.Lock(ctx, "crowd")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int64 // tokens in grant order
	failed := make(chan error, n)
	var granted sync.WaitGroup
	for i := range n {
		granted.Go(func() {
			l, err := sessions[i%len(sessions)].Lock(ctx, "crowd", clientlib.WithRequestID(fmt.Sprintf("w%d", i)))
			if err != nil {
				failed <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, int64(l.Token()))
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				failed <- fmt.Errorf("waiter %d's release: %w", i, err)
			}
		})
	}
	admin := clients[0].Admin()
	wait.Within(t, 5*time.Minute, "the crowd to queue", func() bool {
		st, err := admin.DescribeLockPage(ctx, "crowd", clientlib.LockPage{Size: 1})
		return err == nil && st.WaiterCount == n
	})
	// Every waiter has queued, and each acquisition's answer is the grant:
	// no goroutine of this process (member and clients) waits in the
	// queue's Wait, the one a held waiting call blocks in.
	if held := goroutinesIn(t, "queue.(*Waiters).Wait+"); held > 0 {
		t.Fatalf("%d goroutines of the member wait for a turn while %d acquisitions wait; want none (parked)", held, n)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	granted.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	if len(order) != n || !slices.IsSorted(order) {
		t.Fatalf("%d of %d granted, in token order: %v; want all, each once, in the order they queued", len(order), n, slices.IsSorted(order))
	}
	seen := map[int64]bool{}
	for _, tok := range order {
		if seen[tok] {
			t.Fatalf("token %d granted twice", tok)
		}
		seen[tok] = true
	}
}

// goroutinesIn counts this process's goroutines whose stack has a frame of
// a function whose name contains fn: end fn with "+" (as a frame shows
// "pkg.F+0x1a") to count F and not FLater.
func goroutinesIn(t *testing.T, fn string) int {
	t.Helper()
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	_, records, _ := strings.Cut(b.String(), "\n") // after "goroutine profile: total N"
	n := 0
	for _, record := range strings.Split(records, "\n\n") {
		var count int
		if _, err := fmt.Sscanf(record, "%d @", &count); err != nil {
			continue
		}
		if strings.Contains(record, fn) {
			n += count
		}
	}
	return n
}

// A crowd of campaigns on the call stream waits without a goroutine each
// on the member (CampaignLater: one watch per election for all its
// parked candidates), and each candidate leads once, in the order it
// arrived.
func TestACrowdOfCandidatesWaitsWithoutAGoroutineEach(t *testing.T) {
	t.Parallel()
	n := 2000
	if raceEnabled {
		n = 500
	}
	d := start(t, testConfig(t))
	ctx := t.Context()
	clients := make([]*clientlib.Client, 3)
	sessions := make([]*clientlib.Session, len(clients))
	for i := range clients {
		clients[i] = newClient(t, d.GRPCAddr())
		s, err := clients[i].NewSession(ctx, clientlib.WithTTL(60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	leaderSession, err := clients[0].NewSession(ctx, clientlib.WithTTL(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leader, err := leaderSession.Campaign(ctx, "crowd-election", "first")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var terms []int64 // in the order they led
	failed := make(chan error, n)
	var led sync.WaitGroup
	for i := range n {
		led.Go(func() {
			l, err := sessions[i%len(sessions)].Campaign(ctx, "crowd-election", fmt.Sprint(i), clientlib.WithRequestID(fmt.Sprintf("c%d", i)))
			if err != nil {
				failed <- fmt.Errorf("candidate %d: %w", i, err)
				return
			}
			mu.Lock()
			terms = append(terms, int64(l.Term()))
			mu.Unlock()
			if err := l.Resign(ctx); err != nil {
				failed <- fmt.Errorf("candidate %d's resignation: %w", i, err)
			}
		})
	}
	wait.Within(t, 5*time.Minute, "the candidates to queue", func() bool {
		cs, err := clients[0].Candidates(ctx, "crowd-election")
		return err == nil && len(cs) == n
	})
	if held := goroutinesIn(t, "election.(*Manager).waitSeat+"); held > 0 {
		t.Fatalf("%d goroutines of the member wait for the seat while %d candidates wait; want none (parked)", held, n)
	}
	if err := leader.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	led.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, term := range terms {
		if seen[term] {
			t.Fatalf("term %d led twice", term)
		}
		seen[term] = true
	}
	if len(terms) != n || !slices.IsSorted(terms) {
		t.Fatalf("%d of %d led, terms rising: %v; want all, each once, one after another", len(terms), n, slices.IsSorted(terms))
	}
}

// A crowd entering a barrier on the call stream waits without a goroutine
// each on the member (EnterLater: one watch per barrier, which counts the
// participants from its events), and every participant passes once the
// last arrives, then leaves together.
func TestACrowdAtABarrierWaitsWithoutAGoroutineEach(t *testing.T) {
	t.Parallel()
	n := 2000
	if raceEnabled {
		n = 500
	}
	d := start(t, testConfig(t))
	ctx := t.Context()
	sessions := make([]*clientlib.Session, 3)
	var admin *clientlib.Admin
	for i := range sessions {
		c := newClient(t, d.GRPCAddr())
		admin = c.Admin()
		s, err := c.NewSession(ctx, clientlib.WithTTL(60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	failed := make(chan error, n+1)
	passed := make(chan *clientlib.Barrier, n+1)
	var entered sync.WaitGroup
	for i := range n {
		entered.Go(func() {
			b, err := sessions[i%len(sessions)].EnterBarrier(ctx, "crowd-barrier", n+1, clientlib.WithParticipant(fmt.Sprintf("p%d", i)))
			if err != nil {
				failed <- fmt.Errorf("participant %d: %w", i, err)
				return
			}
			passed <- b
		})
	}
	// A page of one: the count without the crowd rendered at every poll.
	count := func() int {
		st, err := admin.DescribeBarrierPage(ctx, "crowd-barrier", clientlib.BarrierPage{Size: 1})
		if err != nil {
			return -1
		}
		return st.ParticipantCount
	}
	wait.Within(t, 5*time.Minute, "the crowd to enter", func() bool { return count() == n })
	if held := goroutinesIn(t, "barrier.(*Manager).Enter+"); held > 0 {
		t.Fatalf("%d goroutines of the member wait at the barrier while %d participants wait; want none (parked)", held, n)
	}
	if len(passed) > 0 {
		t.Fatalf("%d participants passed a barrier of %d with %d in", len(passed), n+1, n)
	}
	last, err := sessions[0].EnterBarrier(ctx, "crowd-barrier", n+1, clientlib.WithParticipant("last"))
	if err != nil {
		t.Fatal(err)
	}
	entered.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	close(passed)
	all := []*clientlib.Barrier{last}
	for b := range passed {
		all = append(all, b)
	}
	if len(all) != n+1 {
		t.Fatalf("%d of %d passed", len(all), n+1)
	}
	// All but the last leave and wait for it, parked too.
	var left sync.WaitGroup
	for _, b := range all[1:] {
		left.Go(func() {
			if err := b.Leave(ctx); err != nil {
				t.Errorf("leave: %v", err)
			}
		})
	}
	wait.Within(t, 5*time.Minute, "the crowd to leave but one", func() bool { return count() == 1 })
	if held := goroutinesIn(t, "barrier.(*Manager).Leave+"); held > 0 {
		t.Fatalf("%d goroutines of the member wait for the others to leave; want none (parked)", held)
	}
	if err := last.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	left.Wait()
	if st, err := admin.DescribeBarrier(ctx, "crowd-barrier"); err != nil || st.Open || len(st.Participants) != 0 {
		t.Fatalf("the barrier after everyone left: %+v, %v; want closed and empty", st, err)
	}
}
