package daemon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A client given every member's endpoint gathers its calls and its
// keep-alive stream on the member whose etcd member leads, follows the
// leadership each time it moves, and loses nothing on the way: the session
// and the lock it held across the moves are still its own. Each member
// reports whether it leads on the health service, and exactly one does:
// the one etcd says leads. (With Config.AnyMember the client stays where it connected and the wait
// below fails: after a move at the latest, it is on a member that does not
// lead.)
func TestClientFollowsTheMemberThatLeads(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	ds := startCluster(t, 3)
	eps := grpcAddrs(ds)
	ctx := t.Context()
	c := newClient(t, eps...)
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Lock(ctx, "held-across-moves")
	if err != nil {
		t.Fatal(err)
	}
	grants := func() []float64 {
		out := make([]float64, len(ds))
		for i, d := range ds {
			out[i] = d.Metric("coordd_lock_grants_total")
		}
		return out
	}
	health := make([]healthpb.HealthClient, len(ds))
	for i, d := range ds {
		health[i] = healthpb.NewHealthClient(dialRaw(t, d.GRPCAddr()))
	}
	var last string // what the last check found, for the failure message
	onLeader := func() bool {
		l := leadingMember(t, ds, health)
		if l < 0 {
			last = "no one member reports that it leads, as etcd says it does"
			return false
		}
		for i, d := range ds {
			if n := d.Metric("coordd_keepalive_streams"); (i == l) != (n == 1) {
				last = fmt.Sprintf("%v keep-alive streams on member %s", n, d.Config().Name)
				return false
			}
		}
		before := grants()
		cycle, err := s.Lock(ctx, "cycle")
		if err != nil {
			t.Fatal(err)
		}
		if err := cycle.Release(ctx); err != nil {
			t.Fatal(err)
		}
		after := grants()
		for i := range ds {
			if want := float64(0); i == l {
				want = 1
				if after[i]-before[i] != want {
					last = "the lock was not granted through the leading member " + ds[i].Config().Name
					return false
				}
			} else if after[i]-before[i] != want {
				last = "the lock was granted through member " + ds[i].Config().Name + ", which does not lead"
				return false
			}
		}
		return true
	}
	defer func() {
		if t.Failed() && last != "" {
			t.Logf("the last check found: %s", last)
		}
	}()
	within := func(what string) {
		t.Helper()
		wait.Within(t, 10*time.Second, what, onLeader)
	}
	within("the client's keep-alives and calls on the member that leads")
	moves := c.Stats().Moves
	for range 2 {
		moveEtcdLeader(t, ds)
		within("the client to follow etcd's leadership to another member")
	}
	if got := c.Stats().Moves - moves; got < 2 {
		t.Errorf("Stats().Moves grew by %d over two leadership moves, want at least 2", got)
	}
	select {
	case <-held.Lost():
		t.Fatal("the lock held across the moves was lost")
	case <-s.Done():
		t.Fatal("the session ended across the moves")
	default:
	}
	if err := held.Validate(ctx); err != nil {
		t.Fatalf("the lock held across the moves no longer validates: %v", err)
	}
}

// leadingMember is the index of the one member that reports on the health
// service (health, one client per member) that it leads etcd, and whose
// etcd member does lead; -1 otherwise (for a moment as the leadership
// moves: the report follows within a tick).
func leadingMember(t *testing.T, ds []*daemon.Daemon, health []healthpb.HealthClient) int {
	t.Helper()
	l := -1
	for i, h := range health {
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Second))
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: coorddv1.LeaderHealthService})
		cancel()
		if err != nil {
			t.Fatalf("health check of %s: %v", coorddv1.LeaderHealthService, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			continue
		}
		if l >= 0 {
			return -1 // two say they lead
		}
		l = i
	}
	if l >= 0 {
		if s := ds[l].Etcd().Server; s.Leader() != s.MemberID() {
			return -1 // it says it leads; etcd says otherwise
		}
	}
	return l
}
