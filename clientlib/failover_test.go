package clientlib_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// An endpoint left out after a failed keep-alive comes back as soon as a
// probe finds it serving, and one that does not answer stays out: the SDK
// never keeps only a dead endpoint while a live one is left out. (It used
// to leave a live member out for a fixed 10 s, and a client that had given
// up on every survivor during an etcd election kept only the dead member.)
func TestAvoidedEndpointComesBackWhenItServes(t *testing.T) {
	if testing.Short() {
		t.Skip("uses the in-process daemon")
	}
	live := endpoints[0]
	dead := fmt.Sprintf("127.0.0.1:%d", freeport.Port(t)) // nothing listens there
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{live, dead}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	// A live endpoint left out, the dead one in (what a client saw when it
	// gave up on both survivors of a crash during the etcd election).
	c.Avoid(live)
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(3*time.Second))
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("NewSession %s after the live endpoint was left out: %v", time.Since(start).Round(time.Millisecond), err)
	}
	took := time.Since(start)
	_ = s.Close(ctx)
	if took > wait.Bound(2*time.Second) {
		t.Fatalf("NewSession took %s, want the live endpoint back within a probe or two", took)
	}
	if c.Avoided(live) {
		t.Fatal("the live endpoint still left out after a call succeeded through it")
	}
	t.Logf("NewSession succeeded %s after the live endpoint was left out", took.Round(time.Millisecond))

	// The dead endpoint, once left out, stays out while nothing answers.
	probed := c.Stats().Probes
	c.Avoid(dead)
	wait.Within(t, 5*time.Second, "three probes of the dead endpoint", func() bool { return c.Stats().Probes >= probed+3 })
	if !c.Avoided(dead) {
		t.Fatal("the dead endpoint was readmitted, but nothing answers there")
	}
}

// A client that moves to the member leading etcd leaves its calls in
// flight to finish where they are; when that member then stops answering,
// they end (and a lock acquire retries on the member the client uses)
// instead of waiting for their deadline: the keep-alive stream, which
// would notice the silence, moved with the client.
func TestCallsLeftBehindEndWhenTheirMemberGoesSilent(t *testing.T) {
	if testing.Short() {
		t.Skip("uses the in-process daemon")
	}
	live := endpoints[0]
	proxy := tcpproxy.Start(t, live)
	hc, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{live}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hc.Close() })
	holder, err := hc.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held, err := holder.Lock(t.Context(), "left-behind")
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{live, proxy.Addr()}, AnyMember: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// The client uses the proxy: the live endpoint is left out until its
	// probe readmits it, behind the proxy the client is connected to.
	c.Avoid(live)
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if proxy.Active() == 0 {
		t.Fatal("the client does not use the proxy")
	}
	wait.Within(t, 5*time.Second, "the live endpoint readmitted", func() bool { return !c.Avoided(live) })

	type result struct {
		l   *clientlib.Lock
		err error
	}
	got := make(chan result, 1)
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
	defer cancel()
	go func() {
		l, err := s.Lock(ctx, "left-behind")
		got <- result{l, err}
	}()
	wait.Within(t, 5*time.Second, "the acquire waiting behind the holder", func() bool {
		st, err := hc.Admin().DescribeLock(t.Context(), "left-behind")
		return err == nil && len(st.Waiters) == 1
	})
	proxy.Freeze()
	t.Cleanup(proxy.Thaw)
	c.MoveTo(live, proxy.Addr())
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	r := <-got
	if r.err != nil {
		t.Fatalf("Lock left behind on the silent member: %v after %s", r.err, time.Since(released).Round(time.Millisecond))
	}
	took := time.Since(released)
	if r.l.Token() <= held.Token() {
		t.Fatalf("token %d after the holder's %d", r.l.Token(), held.Token())
	}
	if s.Err() != nil {
		t.Fatalf("session lost across the move: %v", s.Err())
	}
	t.Logf("the acquire left behind was granted on the other member %s after the release", took.Round(time.Millisecond))
}

// A member that answers slowly, but answers, keeps the sessions of a
// client that has no other member to go to: the client waits for each
// renewal's answer (until the next one is due) instead of taking the slow
// answer for silence. It used to give the stream up whenever a renewal
// went unanswered for half a second and a health check took as long, and
// open another to the same member, where the next renewal fared no
// better: its sessions expired though every renewal would have been
// answered in time (seen under a crowd on a starved machine).
func TestASlowMemberKeepsTheSessionsOfItsOnlyClient(t *testing.T) {
	if testing.Short() {
		t.Skip("uses the in-process daemon")
	}
	proxy := tcpproxy.Start(t, endpoints[0])
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{proxy.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	const ttl = 6 * time.Second
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Every round trip now takes at least 0.8 s: longer than a keep-alive
	// waits before asking for a health check and that check's own wait
	// together, far shorter than the renewal interval (ttl / 3).
	proxy.SetLatency(400 * time.Millisecond)
	slowFrom := time.Now()
	givenUp := c.Stats().StreamsGivenUp
	// Three renewals sent over the slow link answered: the local deadline
	// has moved past what the last renewal before it gave.
	wait.Within(t, 5*ttl, "renewals over the slow link answered", func() bool {
		if err := s.Err(); err != nil {
			t.Fatalf("the session ended over a slow link to its only member: %v", err)
		}
		return s.Deadline().After(slowFrom.Add(ttl + 2*ttl/3))
	})
	if n := c.Stats().StreamsGivenUp - givenUp; n > 0 {
		t.Fatalf("the keep-alive stream was given up %d times over a slow link to the only member", n)
	}
}
