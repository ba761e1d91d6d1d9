package clientlib_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/freeport"
	"github.com/coordd/coordd/internal/wait"
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
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("NewSession %s after the live endpoint was left out: %v", time.Since(start).Round(time.Millisecond), err)
	}
	took := time.Since(start)
	_ = s.Close(ctx)
	if took > 2*time.Second {
		t.Fatalf("NewSession took %s, want the live endpoint back within a probe or two", took)
	}
	if c.Avoided(live) {
		t.Fatal("the live endpoint still left out after a call succeeded through it")
	}
	t.Logf("NewSession succeeded %s after the live endpoint was left out", took.Round(time.Millisecond))

	// The dead endpoint, once left out, stays out while nothing answers.
	probed := c.Probed()
	c.Avoid(dead)
	wait.Within(t, 5*time.Second, "three probes of the dead endpoint", func() bool { return c.Probed() >= probed+3 })
	if !c.Avoided(dead) {
		t.Fatal("the dead endpoint was readmitted, but nothing answers there")
	}
}
