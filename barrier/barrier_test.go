package barrier_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/barrier"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
	"github.com/coordd/coordd/internal/testkit/wait"
	"github.com/coordd/coordd/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cli := etcdtest.Start(t).Client(t)
	m := barrier.NewManager(cli, "/coordd/")
	ctx := t.Context()
	grant := func() session.ID {
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		return session.ID(l.ID)
	}
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
	case <-time.After(30 * time.Second):
		t.Fatal("the barrier's count was reached and the retry was not let through")
	}
	st, err := m.Describe(ctx, "b")
	if err != nil || !st.Open || len(st.Participants) != 2 || st.Participants[0].ID != "worker" || st.Participants[0].Count != 2 || st.Participants[0].Entered.IsZero() {
		t.Fatalf("Describe = %+v, %v; want open, with the worker (count 2, a time) and the other", st, err)
	}
}
