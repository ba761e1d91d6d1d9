package daemon_test

import (
	"errors"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/wait"
)

// A client's sessions are kept alive over one KeepAliveStream, however
// many it has (the member holds no stream, goroutine or buffer per
// session); a session the server no longer has is told so on that stream
// and ends alone, while the others renew on, on the same stream.
func TestSessionsShareOneKeepAliveStream(t *testing.T) {
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	ctx := t.Context()
	streams := func() float64 {
		return max(value(scrape(t, base), "coordd_grpc_server_started_total", "grpc_method", "KeepAliveStream"), 0)
	}
	before := streams()
	c := newClient(t, d.GRPCAddr())
	admin := newClient(t, d.GRPCAddr())
	t0 := time.Now()
	var ss []*clientlib.Session
	for range 20 {
		s, err := c.NewSession(ctx, clientlib.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	renewedSince := func(at time.Time, ss []*clientlib.Session) func() bool {
		return func() bool {
			for _, s := range ss {
				// A renewal sent after at moves the deadline past at + TTL - margin.
				if !s.Deadline().After(at.Add(1750 * time.Millisecond)) {
					return false
				}
			}
			return true
		}
	}
	wait.Within(t, 10*time.Second, "every session to renew", renewedSince(t0.Add(100*time.Millisecond), ss))
	if got := streams() - before; got != 1 {
		t.Fatalf("%v keep-alive streams for one client's 20 sessions, want 1", got)
	}

	if err := admin.Admin().CloseSession(ctx, ss[0].ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ss[0].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a session closed by another client is still alive in its own after 10s")
	}
	if !errors.Is(ss[0].Err(), clientlib.ErrSessionNotFound) {
		t.Fatalf("the closed session ended with %v, want ErrSessionNotFound", ss[0].Err())
	}
	wait.Within(t, 10*time.Second, "the others to renew on", renewedSince(time.Now(), ss[1:]))
	for _, s := range ss[1:] {
		if err := s.Err(); err != nil {
			t.Fatalf("session %s ended with %v when another one was closed", s.ID(), err)
		}
	}
	if got := streams() - before; got != 1 {
		t.Fatalf("one session's end reopened the shared stream: %v streams, want 1", got)
	}
}
