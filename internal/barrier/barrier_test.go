package barrier_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/barrier"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup starts etcd and a Manager over it (closed when the test ends),
// and returns with them a function that grants a session of 60 s that
// nobody renews.
func setup(t *testing.T) (*barrier.Manager, *clientv3.Client, func() session.ID) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cli := etcdtest.Start(t).Client(t)
	m := barrier.NewManager(cli, "/coordd/")
	t.Cleanup(m.Close)
	grant := func() session.ID {
		l, err := cli.Grant(t.Context(), 60)
		if err != nil {
			t.Fatal(err)
		}
		return session.ID(l.ID)
	}
	return m, cli, grant
}

type entered struct {
	e   barrier.Entered
	err error
}

func enter(ctx context.Context, m *barrier.Manager, name string, s session.ID, id string, count int) <-chan entered {
	ch := make(chan entered, 1)
	go func() {
		e, err := m.Enter(ctx, name, s, id, count)
		ch <- entered{e, err}
	}()
	return ch
}

// A retry of an Enter (the same session and participant id, as the SDK
// sends after a lost connection) enters again; the first call giving up
// afterwards removes nothing the retry owns, and the barrier opens for the
// retry when the last participant comes. It fails when a call that gives
// up deletes the participant whatever its value: the retry then failed
// with "session ended" and the barrier never opened.
func TestEnterTakeOverByARetry(t *testing.T) {
	t.Parallel()
	m, cli, grant := setup(t)
	ctx := t.Context()
	s := grant()
	key := func() *clientv3.GetResponse {
		resp, err := cli.Get(ctx, "/coordd/barrier/b/p/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	firstCtx, cancelFirst := context.WithCancel(ctx)
	defer cancelFirst()
	first := enter(firstCtx, m, "b", s, "worker", 2)
	wait.For(t, "the first call to enter", func() bool { return len(key().Kvs) == 1 })
	retry := enter(ctx, m, "b", s, "worker", 2)
	wait.For(t, "the retry to enter again", func() bool { r := key(); return len(r.Kvs) == 1 && r.Kvs[0].Version == 2 })
	cancelFirst()
	if r := <-first; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("first call = %+v, %v; want it cancelled", r.e, r.err)
	}
	if n := len(key().Kvs); n != 1 {
		t.Fatalf("%d participants after the first call gave up; want the retry's", n)
	}
	if _, err := m.Enter(ctx, "b", grant(), "other", 2); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-retry:
		if r.err != nil || r.e.Participants != 2 {
			t.Fatalf("retry = %+v, %v; want the barrier open with 2 in", r.e, r.err)
		}
	case <-time.After(wait.Bound(30 * time.Second)):
		t.Fatal("the barrier's count was reached and the retry was not let through")
	}
	st, err := m.Describe(ctx, "b")
	if err != nil || !st.Open || len(st.Participants) != 2 || st.Participants[0].ID != "worker" || st.Participants[0].Count != 2 || st.Participants[0].Entered.IsZero() {
		t.Fatalf("Describe = %+v, %v; want open, with the worker (count 2, a time) and the other", st, err)
	}
}

// Parked Enters (EnterLater) share their barrier's one watch, which counts
// the participants from its events: a wait whose context ends takes its
// participant out (the count goes down), one whose session ends is told,
// and the rest pass together once the count is reached; Leave waits on
// the same watch until nobody is in.
func TestParkedEntersShareOneWatch(t *testing.T) {
	t.Parallel()
	m, cli, grant := setup(t)
	ctx := t.Context()
	const n = 20
	park := func(ctx context.Context, s session.ID, id string) <-chan entered {
		ch := make(chan entered, 1)
		_, parked, err := m.EnterLater(ctx, "crowd", s, id, n, barrier.Later{Ctx: ctx, Done: func(e barrier.Entered, err error) { ch <- entered{e, err} }})
		if err != nil || !parked {
			t.Fatalf("EnterLater below the count: parked %v, %v", parked, err)
		}
		return ch
	}
	s := grant()
	var waits []<-chan entered
	for i := range n - 3 {
		waits = append(waits, park(ctx, s, fmt.Sprintf("w%d", i)))
	}
	cctx, cancel := context.WithCancel(ctx)
	canceled := park(cctx, s, "canceled")
	dying := grant()
	ended := park(ctx, dying, "dying")
	in := func() int {
		st, err := m.Describe(ctx, "crowd")
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Participants)
	}
	wait.For(t, "every participant in", func() bool { return in() == n-1 })
	cancel()
	if r := <-canceled; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("an Enter whose context ended: %+v, %v", r.e, r.err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(dying)); err != nil {
		t.Fatal(err)
	}
	if r := <-ended; !errors.Is(r.err, barrier.ErrSessionNotFound) {
		t.Fatalf("an Enter whose session ended: %+v, %v; want ErrSessionNotFound", r.e, r.err)
	}
	wait.For(t, "the two to leave the count", func() bool { return in() == n-3 })
	waits = append(waits, park(ctx, s, "late0"), park(ctx, s, "late1"))
	if e, err := m.Enter(ctx, "crowd", s, "last", n); err != nil || e.Participants != n { // the n-th
		t.Fatalf("the last arrival: %+v, %v; want the barrier open with %d in", e, err, n)
	}
	for _, w := range waits {
		if r := <-w; r.err != nil || r.e.Participants != n {
			t.Fatalf("a parked participant: %+v, %v; want the barrier open with %d in", r.e, r.err, n)
		}
	}
}

// A round whose participants all ended without leaving (their sessions
// died after the barrier opened) leaves its open key behind; the next
// arrival starts a new round: it waits for its own count instead of
// passing through the dead round's open barrier. One opened by hand stays
// open for arrivals. It fails when an arrival at an open barrier passes
// without checking whether anyone of that round is still in.
func TestAnArrivalAfterADeadRoundStartsANewOne(t *testing.T) {
	t.Parallel()
	m, cli, grant := setup(t)
	ctx := t.Context()
	a, b := grant(), grant()
	first := enter(ctx, m, "r", a, "a", 2)
	if _, err := m.Enter(ctx, "r", b, "b", 2); err != nil {
		t.Fatal(err)
	}
	if r := <-first; r.err != nil {
		t.Fatal(r.err)
	}
	for _, s := range []session.ID{a, b} { // both die inside, without leaving
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(s)); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := m.Describe(ctx, "r"); err != nil || !st.Open || len(st.Participants) != 0 {
		t.Fatalf("after the round died: %+v, %v; want its open key left, nobody in", st, err)
	}
	c := grant()
	next := enter(ctx, m, "r", c, "c", 2)
	wait.For(t, "the new round's first arrival in", func() bool {
		st, err := m.Describe(ctx, "r")
		return err == nil && len(st.Participants) == 1
	})
	select {
	case r := <-next:
		t.Fatalf("an arrival after a dead round passed alone: %+v, %v", r.e, r.err)
	default:
	}
	if st, _ := m.Describe(ctx, "r"); st.Open {
		t.Fatal("the dead round's open key is still there after the new round began")
	}
	if _, err := m.Enter(ctx, "r", grant(), "d", 2); err != nil {
		t.Fatal(err)
	}
	if r := <-next; r.err != nil || r.e.Participants != 2 {
		t.Fatalf("the new round's first arrival = %+v, %v; want it through with 2 in", r.e, r.err)
	}
	// Opened by hand with nobody in: arrivals pass.
	if _, err := m.Open(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Enter(ctx, "h", grant(), "x", 5); err != nil || e.Participants != 1 {
		t.Fatalf("an arrival at a barrier opened by hand = %+v, %v; want through at once", e, err)
	}
}

// DescribePage lists the participants in the order they entered, a page
// at a time, each page with the count of all; the last page has no next.
func TestDescribePagesThroughTheParticipants(t *testing.T) {
	t.Parallel()
	m, _, grant := setup(t)
	ctx := t.Context()
	s := grant()
	const n = 7
	waits, stop := context.WithCancel(ctx)
	var parked sync.WaitGroup
	defer parked.Wait() // each takes its participant out once stopped
	defer stop()
	for i := range n { // a count never reached: each waits, parked
		parked.Add(1)
		_, ok, err := m.EnterLater(waits, "pages", s, fmt.Sprintf("p%d", i), n+1, barrier.Later{Ctx: waits, Done: func(barrier.Entered, error) { parked.Done() }})
		if err != nil || !ok {
			parked.Done() // not parked: Done is not called
			t.Fatalf("enter p%d: parked %v, %v", i, ok, err)
		}
	}
	var got []string
	p := barrier.Page{Size: 3}
	for pages := 1; ; pages++ {
		st, err := m.DescribePage(ctx, "pages", p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Count != n || st.Open || len(st.Participants) > 3 {
			t.Fatalf("page %d: %+v; want %d in all, closed, at most 3 listed", pages, st, n)
		}
		for _, pt := range st.Participants {
			got = append(got, pt.ID)
		}
		if st.Next == 0 {
			if pages != 3 {
				t.Fatalf("%d pages of 3 for %d participants, want 3", pages, n)
			}
			break
		}
		p.After = st.Next
	}
	if want := "p0 p1 p2 p3 p4 p5 p6"; strings.Join(got, " ") != want {
		t.Fatalf("participants over the pages: %v, want %s in the order they entered", got, want)
	}
	for _, size := range []int{-1, barrier.MaxPage + 1} {
		if _, err := m.DescribePage(ctx, "pages", barrier.Page{Size: size}); !errors.Is(err, barrier.ErrInvalid) {
			t.Errorf("page size %d: %v, want ErrInvalid", size, err)
		}
	}
}
