package session

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// member is one coordd member's sessions: a Manager on its own Clock.
type member struct {
	m     *Manager
	clock *Clock
}

// startMember runs a clock named name until the test ends.
func startMember(t *testing.T, cli *clientv3.Client, name string, setup func(*Clock)) member {
	t.Helper()
	c := NewClock(cli, "/coordd/", name, nil, nil)
	if setup != nil {
		setup(c)
	}
	m := NewManager(cli, "/coordd/")
	m.UseClock(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return member{m, c}
}

func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	return etcdtest.Start(t).Client(t)
}

// A session nobody renews ends one TTL after its last renewal, not
// earlier, and a renewal after that says it is gone.
func TestClockEndsUnrenewedSessions(t *testing.T) {
	t.Parallel()
	cli := startEtcd(t)
	a := startMember(t, cli, "a", nil)
	ctx := t.Context()
	info, err := a.m.Create(ctx, Spec{TTL: 2 * time.Second, Owner: "w"})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cli.TimeToLive(ctx, clientv3.LeaseID(info.ID))
	if err != nil || lease.GrantedTTL != int64(a.clock.BackstopTTL(2*time.Second)/time.Second) {
		t.Fatalf("etcd lease = %+v, %v; want the backstop TTL %s", lease, err, a.clock.BackstopTTL(2*time.Second))
	}
	// A key bound to the session, as a lock holder's is.
	if _, err := cli.Put(ctx, "/coordd/lock/x/holder", "", clientv3.WithLease(clientv3.LeaseID(info.ID))); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if ttl, err := a.m.KeepAlive(ctx, info.ID); err != nil || ttl != 2*time.Second {
		t.Fatalf("KeepAlive = %s, %v", ttl, err)
	}
	wait.Within(t, 10*time.Second, "the session to end", func() bool {
		resp, err := cli.Get(ctx, "/coordd/lock/x/holder")
		return err == nil && len(resp.Kvs) == 0
	})
	took := time.Since(sent)
	// Never before the TTL; the slack after it stretches with the machine
	// (its production bound, TTL + 1s, is the chaos run's).
	if slack := wait.Bound(time.Second); took < 2*time.Second || took > 2*time.Second+slack {
		t.Fatalf("the session ended %s after its last renewal was sent; want within [TTL, TTL+%s] = [2s, %s]", took, slack, 2*time.Second+slack)
	}
	if _, err := a.m.KeepAlive(ctx, info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("KeepAlive after the end = %v, want ErrNotFound", err)
	}
	if _, err := a.m.Get(ctx, info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the end = %v, want ErrNotFound", err)
	}
	t.Logf("ended %s after the last renewal was sent (TTL 2s)", took.Round(time.Millisecond))
}

// A member that stopped seeing renewals (paused, or its watch stalled)
// cannot end a session that another member kept renewing: its ending
// transaction's compare fails. With the compare switched off, it does end
// it: the check that this test can fail.
func TestStalledMemberCannotEndRenewedSession(t *testing.T) {
	t.Parallel()
	for _, fenced := range []bool{true, false} {
		name := "fenced"
		if !fenced {
			name = "unfenced"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cli := startEtcd(t)
			a := startMember(t, cli, "a", nil)
			var stall sync.Mutex // held: b's watch applies nothing
			b := startMember(t, cli, "b", func(c *Clock) {
				c.beforeApply = func() { stall.Lock(); stall.Unlock() } //nolint:staticcheck // waits for the stall to end
				c.noFence = !fenced
			})
			ctx := t.Context()
			info, err := a.m.Create(ctx, Spec{TTL: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// b has seen the session before it stalls.
			wait.Within(t, 5*time.Second, "b to see the session", func() bool { _, ok := b.clock.Remaining(info.ID); return ok })
			stall.Lock()
			stalled := true
			defer func() {
				if stalled {
					stall.Unlock()
				}
			}()
			// a renews every 400 ms for three TTLs while b sees nothing.
			var gone error
			for end := time.Now().Add(6 * time.Second); time.Now().Before(end) && gone == nil; {
				if _, err := a.m.KeepAlive(ctx, info.ID); err != nil {
					gone = err
				}
				time.Sleep(400 * time.Millisecond) // the renewal interval itself
			}
			stall.Unlock()
			stalled = false
			if _, err := a.m.KeepAlive(ctx, info.ID); err != nil && gone == nil {
				gone = err
			}
			if fenced && gone != nil {
				t.Fatalf("a renewed session was ended by a member that had not seen its renewals: %v", gone)
			}
			if !fenced && !errors.Is(gone, ErrNotFound) {
				t.Fatalf("without the compare, the stalled member should have ended the renewed session; renewals say %v", gone)
			}
		})
	}
}

// A session kept alive longer than its etcd lease's TTL lives on: members
// renew the backstop lease too. (Here the backstop is the TTL + 1 s, so
// a session renewed for 8 s would end at 3 s without those renewals.)
func TestBackstopLeaseIsRenewed(t *testing.T) {
	t.Parallel()
	cli := startEtcd(t)
	a := startMember(t, cli, "a", func(c *Clock) { c.backstopExtra = time.Second })
	ctx := t.Context()
	info, err := a.m.Create(ctx, Spec{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		if _, err := a.m.KeepAlive(ctx, info.ID); err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		time.Sleep(500 * time.Millisecond) // the renewal interval itself
	}
	lease, err := cli.TimeToLive(ctx, clientv3.LeaseID(info.ID))
	if err != nil || lease.TTL <= 0 {
		t.Fatalf("the etcd lease of a renewed session: %+v, %v", lease, err)
	}
}

// Sessions that die together (a fleet of clients gone) all end on time:
// several ending transactions (maxEnd sessions each) and their revokes at
// once. Their renewals went as one write.
func TestManySessionsEndTogether(t *testing.T) {
	t.Parallel()
	cli := startEtcd(t)
	a := startMember(t, cli, "a", nil)
	ctx := t.Context()
	const n = 2*maxEnd + 50
	const ttl = 4 * time.Second
	ids := make([]ID, n)
	for i := range ids {
		info, err := a.m.Create(ctx, Spec{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = info.ID
		// Those made so far are renewed every 25 sessions, so none ends
		// while the others are made, however slow the machine.
		if i%25 == 24 {
			if _, _, err := a.m.KeepAliveAll(ctx, ids[:i+1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	puts := func() int64 {
		resp, err := cli.Get(ctx, "/coordd/session-clock")
		if err != nil || len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].Version
	}
	before := puts()
	sent := time.Now()
	ttls, errs, err := a.m.KeepAliveAll(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if errs[i] != nil || ttls[i] != ttl {
			t.Fatalf("renewal %d: %s, %v", i, ttls[i], errs[i])
		}
	}
	if d := puts() - before; d != 1 {
		t.Fatalf("%d renewals in one call took %d writes, want 1", n, d)
	}
	// The same session renewed many times at once is written once.
	if _, _, err := a.m.KeepAliveAll(ctx, slices.Repeat(ids[:1], 100)); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, "/coordd/session-clock"); err != nil || len(resp.Kvs) != 1 || strings.Count(string(resp.Kvs[0].Value), ",") != 0 {
		t.Fatalf("one session renewed 100 times at once wrote %v, %v; want it once", resp, err)
	}
	left := func() int64 {
		resp, err := cli.Get(ctx, "/coordd/session/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return -1
		}
		return resp.Count
	}
	wait.Within(t, 10*time.Second, "the first session to end", func() bool { return left() >= 0 && left() < n })
	// The member ends them about a TTL after their renewal: its decision
	// is prompt, whatever the load.
	if took := time.Since(sent); took > ttl+2*time.Second {
		t.Fatalf("the first of %d sessions ended %s after their renewal was sent; want at most TTL+2s = %s", n, took, ttl+2*time.Second)
	}
	wait.Within(t, 15*time.Second, "every session to end", func() bool { return left() == 0 })
	// Each end is a lease revoke (etcd has no batch of them): 250 take
	// some 100 ms on a quiet machine, over a second beside a CPU hog under
	// the race detector, and up to 4 s in a loaded CI run (beside other
	// packages' clusters): the bound for the last is the first's plus that.
	if took := time.Since(sent); took > ttl+6*time.Second {
		t.Fatalf("the last of %d sessions ended %s after their renewal was sent; want at most TTL+6s = %s", n, took, ttl+6*time.Second)
	}
	t.Logf("the last of %d sessions ended %s after their renewal was sent (TTL %s)", n, time.Since(sent).Round(time.Millisecond), ttl)
}

// A member that ended a session and stopped before revoking its lease
// revokes it when it starts again (with no other member to do it).
func TestEndedSessionIsRevokedAfterARestart(t *testing.T) {
	t.Parallel()
	cli := startEtcd(t)
	ctx := t.Context()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	id := ID(lease.ID)
	// What the ending transaction leaves: the record marked ended, still
	// bound to the lease, and the session's keys.
	if _, err := cli.Put(ctx, "/coordd/session/"+id.String(), `{"ttl_seconds":2,"ended_by":"a"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/coordd/lock/x/holder", "", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	startMember(t, cli, "a", nil)
	wait.Within(t, 5*time.Second, "the ended session's lease to be revoked", func() bool {
		resp, err := cli.Get(ctx, "/coordd/lock/x/holder")
		return err == nil && len(resp.Kvs) == 0
	})
}
