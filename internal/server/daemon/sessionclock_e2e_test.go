package daemon_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A session whose client died ends one TTL after its last renewal even
// while etcd's leadership moves every TTL/2: etcd would give its lease the
// whole TTL back at each move (issue 35: 15.9 s for a 3 s TTL).
func TestDeadSessionEndsOnTimeWhileEtcdLeadershipMoves(t *testing.T) {
	// Not parallel: it bounds how long something takes (a session's end,
	// within 1 s of its TTL), which the other tests' load stretched by
	// 67 ms once beside two other packages.
	ds := startCluster(t, 3)
	ctx := t.Context()
	const ttl = 2 * time.Second
	sessions := coorddv1.NewSessionServiceClient(dialRaw(t, ds[0].GRPCAddr()))
	created, err := sessions.CreateSession(ctx, &coorddv1.CreateSessionRequest{Ttl: durationpb.New(ttl), Owner: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetId()
	sent := time.Now()
	if _, err := sessions.KeepAlive(ctx, &coorddv1.KeepAliveRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	// The client is gone from here on. Leadership moves every TTL/2 for
	// four TTLs, or until the session ends.
	other := coorddv1.NewSessionServiceClient(dialRaw(t, ds[1].GRPCAddr()))
	moves, ended := 0, time.Duration(0)
	for start := time.Now(); time.Since(start) < 4*ttl && ended == 0; {
		moveEtcdLeader(t, ds)
		moves++
		for next := time.Now().Add(ttl / 2); time.Now().Before(next); time.Sleep(20 * time.Millisecond) { // polls the session: the interval is the measurement's resolution
			_, err := other.GetSession(ctx, &coorddv1.GetSessionRequest{SessionId: id})
			if status.Code(err) == codes.NotFound {
				ended = time.Since(sent)
				break
			}
		}
	}
	if ended == 0 {
		t.Fatalf("the session was still there %s after its last renewal (TTL %s, %d leader moves)", time.Since(sent).Round(time.Millisecond), ttl, moves)
	}
	if ended < ttl || ended > ttl+time.Second {
		t.Fatalf("the session ended %s after its last renewal was sent; want within [TTL, TTL+1s] = [%s, %s]", ended, ttl, ttl+time.Second)
	}
	t.Logf("ended %s after its last renewal (TTL %s), across %d etcd leader moves", ended.Round(time.Millisecond), ttl, moves)
}

// moveEtcdLeader hands etcd's leadership from its leader to the next
// member.
func moveEtcdLeader(t *testing.T, ds []*daemon.Daemon) {
	t.Helper()
	for i, d := range ds {
		s := d.Etcd().Server
		if s.Leader() != s.MemberID() {
			continue
		}
		next := ds[(i+1)%len(ds)].Etcd().Server.MemberID()
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(5*time.Second))
		defer cancel()
		if err := s.MoveLeader(ctx, uint64(s.MemberID()), uint64(next)); err != nil {
			t.Fatalf("move etcd's leadership: %v", err)
		}
		return
	}
	t.Fatal("no member leads etcd")
}
