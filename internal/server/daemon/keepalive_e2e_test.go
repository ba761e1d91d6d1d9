package daemon_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/api"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// renewedSince reports whether every session of ss (of TTL ttl) renewed
// after at: a renewal sent after at moves the SDK's deadline past
// at + TTL - margin (max(250ms, TTL/10)).
func renewedSince(at time.Time, ttl time.Duration, ss []*clientlib.Session) func() bool {
	return func() bool {
		for _, s := range ss {
			if !s.Deadline().After(at.Add(ttl - max(250*time.Millisecond, ttl/10))) {
				return false
			}
		}
		return true
	}
}

// A client's sessions are kept alive over one KeepAliveStream, however
// many it has (the member holds no stream, goroutine or buffer per
// session); a session the server no longer has is told so on that stream
// and ends alone, while the others renew on, on the same stream.
func TestSessionsShareOneKeepAliveStream(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	ctx := t.Context()
	streams := func() float64 {
		return max(value(scrape(t, base), "coordd_grpc_server_started_total", "grpc_method", "KeepAliveStream"), 0)
	}
	before := streams()
	c := newClient(t, d.GRPCAddr())
	// oneStream checks that the client kept one stream. A session whose
	// keep-alive was answered too late, or whose member went silent (a
	// loaded machine), gives the stream up for a new one
	// (Stats.StreamsGivenUp): a reopen for that reason is not what this
	// test is about, and is only logged. A session's end gives nothing up.
	oneStream := func(why string) {
		t.Helper()
		if got := streams() - before; got != 1 {
			if n := c.Stats().StreamsGivenUp; n > 0 {
				t.Logf("%v streams, after the client's sessions gave a stream up %d times (slow answers): not counted", got, n)
				return
			}
			t.Fatalf("%s: %v streams, want 1", why, got)
		}
	}
	admin := newClient(t, d.GRPCAddr())
	// Long enough that no session is lost on a busy machine; they renew
	// every TTL/3, and a keep-alive waits that long for its answer before
	// its session gives the stream up (a reopen this test would count: at
	// 4 s, answers slower than 1.3 s on a loaded CI machine did).
	const ttl = 12 * time.Second
	t0 := time.Now()
	var ss []*clientlib.Session
	for range 20 {
		s, err := c.NewSession(ctx, clientlib.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	wait.Within(t, 20*time.Second, "every session to renew", renewedSince(t0.Add(100*time.Millisecond), ttl, ss))
	oneStream("keep-alive streams for one client's 20 sessions")

	if err := admin.Admin().CloseSession(ctx, ss[0].ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ss[0].Done():
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("a session closed by another client is still alive in its own after 10s")
	}
	if !errors.Is(ss[0].Err(), clientlib.ErrSessionNotFound) {
		t.Fatalf("the closed session ended with %v, want ErrSessionNotFound", ss[0].Err())
	}
	wait.Within(t, 20*time.Second, "the others to renew on", renewedSince(time.Now(), ttl, ss[1:]))
	for _, s := range ss[1:] {
		if err := s.Err(); err != nil {
			t.Fatalf("session %s ended with %v when another one was closed", s.ID(), err)
		}
	}
	oneStream("one session's end reopened the shared stream")
}

// The renewals of a client's many sessions travel together: the server
// reads a batch of them in one message and answers in one, so a member
// serving many idle sessions handles a few messages per renewal tick
// instead of one per session.
func TestRenewalsTravelInBatches(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	ctx := t.Context()
	received := func() float64 {
		return max(value(scrape(t, base), "coordd_grpc_server_msg_received_total", "grpc_method", "KeepAliveStream"), 0)
	}
	c := newClient(t, d.GRPCAddr())
	const n = 200
	// A keep-alive waits TTL/3 for its answer before its session gives
	// the stream up, and every session then renews on a new one, alone
	// at first: at 6 s (a 2 s wait), a loaded CI run saw sessions give
	// streams up again and again and not renew within 20 s.
	const ttl = 12 * time.Second
	var ss []*clientlib.Session
	for range n {
		s, err := c.NewSession(ctx, clientlib.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	// Let every session renew once on the stream (the first renewal of
	// each names its holdings, on its own), then count the messages it
	// takes for every one of them to renew again.
	wait.Within(t, 20*time.Second, "every session to renew", renewedSince(time.Now(), ttl, ss))
	before, t1 := received(), time.Now()
	wait.Within(t, 20*time.Second, "every session to renew again", renewedSince(t1, ttl, ss))
	if got := received() - before; got >= n/2 {
		t.Fatalf("the server read %v keep-alive messages while %d sessions renewed once each; want a few batches (< %d)", got, n, n/2)
	}
	for _, s := range ss {
		if err := s.Err(); err != nil {
			t.Fatalf("session %s ended with %v", s.ID(), err)
		}
	}
}

// The batch protocol itself: a batch is answered by one response naming
// every session (a gone one as gone, without ending the stream), a large
// one by a few (lots of at most 32, renewed at once), and a
// batch on a stream that is not shared, or a malformed id in one, ends the
// stream with InvalidArgument.
func TestKeepAliveBatchProtocol(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	ctx := t.Context()
	c := newClient(t, d.GRPCAddr())
	a, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Admin().CloseSession(ctx, b.ID()); err != nil {
		t.Fatal(err)
	}
	conn := dialRaw(t, d.GRPCAddr())
	open := func() coorddv1.SessionService_KeepAliveStreamClient {
		st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		md, err := st.Header()
		if err != nil || len(md.Get(api.KeepAliveBatchesHeader)) == 0 {
			t.Fatalf("stream header %v, %v: want %s", md, err, api.KeepAliveBatchesHeader)
		}
		return st
	}
	st := open()
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionIds: []string{a.ID(), b.ID()}, Shared: true}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*coorddv1.Renewal{}
	for _, r := range resp.GetRenewals() {
		got[r.GetSessionId()] = r
	}
	if len(got) != 2 || got[a.ID()].GetTtl().AsDuration() != 10*time.Second || got[a.ID()].GetGone() || !got[b.ID()].GetGone() {
		t.Fatalf("batch answer %v: want %s renewed for 10s and %s gone", resp, a.ID(), b.ID())
	}
	// The stream goes on after a gone session.
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionIds: []string{a.ID()}, Shared: true}); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || len(resp.GetRenewals()) != 1 {
		t.Fatalf("second batch: %v, %v", resp, err)
	}
	// A large batch is renewed in lots, each answered on its own, every
	// session once.
	var many []string
	for range 70 {
		info, err := c.Admin().CreateSession(ctx, 10*time.Second, "", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		many = append(many, info.ID)
	}
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionIds: many, Shared: true}); err != nil {
		t.Fatal(err)
	}
	answered := map[string]bool{}
	for responses := 0; len(answered) < len(many); responses++ {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(resp.GetRenewals()); n == 0 || n > 32 || responses > len(many) {
			t.Fatalf("response %d to a batch of %d answers %d sessions, want 1 to 32 each", responses, len(many), n)
		}
		for _, r := range resp.GetRenewals() {
			if answered[r.GetSessionId()] || r.GetGone() || r.GetTtl().AsDuration() != 10*time.Second {
				t.Fatalf("renewal %v: answered twice, gone or with the wrong TTL", r)
			}
			answered[r.GetSessionId()] = true
		}
	}
	for what, req := range map[string]*coorddv1.KeepAliveStreamRequest{
		"a batch on a stream that is not shared": {SessionIds: []string{a.ID()}},
		"a malformed id in a batch":              {SessionIds: []string{a.ID(), "nope"}, Shared: true},
		"holdings without their session":         {SessionIds: []string{a.ID()}, Shared: true, Watch: []*coorddv1.Holding{{Kind: coorddv1.Holding_KIND_LOCK, Name: "x", Token: 1, RequestId: "r"}}},
	} {
		st := open()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", what, err)
		}
	}
	if err := a.Err(); err != nil {
		t.Fatalf("session a ended with %v", err)
	}
}

// The server says in the stream header how many sessions one batch may
// name under its message limit, and a batch of that many fits: at the
// least limit allowed (4 KiB), 224.
func TestBatchesFitTheMessageLimit(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MaxRequestBytes = 4096
	cfg.ConfigLimits.MaxValueBytes = 2048
	d := start(t, cfg)
	conn := dialRaw(t, d.GRPCAddr())
	st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	md, err := st.Header()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.Join(md.Get(api.KeepAliveBatchesHeader), ""))
	if err != nil || n != 224 {
		t.Fatalf("header %s = %v (%v), want 224", api.KeepAliveBatchesHeader, md.Get(api.KeepAliveBatchesHeader), err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%016x", 0xfff0000+i) // no such sessions: answered gone
	}
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionIds: ids, Shared: true}); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < n {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("a batch of the %d sessions the header allows: %v", n, err)
		}
		got += len(resp.GetRenewals())
	}
}
