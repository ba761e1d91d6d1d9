package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// TestSDKCallsOnTheStreamAndWithout runs the SDK's lock and election calls
// three ways: pipelined on the Calls stream (the default), as unary RPCs
// by choice (Config.UnaryCalls), and against a server without the stream
// (--no-call-stream), where the SDK falls back by itself. Every outcome
// is the same; only the first takes the calls on a stream.
func TestSDKCallsOnTheStreamAndWithout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		unaryCalls bool // the SDK's choice
		noStream   bool // the server's
		onStream   bool
	}{
		{name: "stream", onStream: true},
		{name: "unary by choice", unaryCalls: true},
		{name: "server without the stream", noStream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			cfg.NoCallStream = tc.noStream
			d := start(t, cfg)
			c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr()}, UnaryCalls: tc.unaryCalls})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			base := "http://" + d.HTTPAddr()
			before := value(scrape(t, base), "coordd_stream_calls_total")
			n := exerciseSessionCalls(t, c)
			got := value(scrape(t, base), "coordd_stream_calls_total") - before
			if tc.onStream && got < float64(n) {
				t.Fatalf("coordd_stream_calls_total grew by %v over %d calls: the SDK did not pipeline them", got, n)
			}
			if !tc.onStream && got != 0 {
				t.Fatalf("coordd_stream_calls_total grew by %v: calls went on a stream", got)
			}
		})
	}
}

// exerciseSessionCalls makes every kind of call the Calls stream carries,
// checking each outcome, and returns how many calls it made at least.
func exerciseSessionCalls(t *testing.T, c *clientlib.Client) int {
	t.Helper()
	ctx := t.Context()
	a, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.Lock(ctx, "calls/lock") // 1
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if _, err := b.TryLock(ctx, "calls/lock"); !errors.Is(err, clientlib.ErrLockHeld) { // 2
		t.Fatalf("TryLock of a held lock = %v, want ErrLockHeld", err)
	}
	// A waiting acquisition whose caller gives up is withdrawn.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = b.Lock(short, "calls/lock") // 3
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held lock within 200ms = %v, want DeadlineExceeded", err)
	}
	wait.For(t, "the abandoned waiter to leave the queue", func() bool {
		st, err := c.Admin().DescribeLock(ctx, "calls/lock")
		return err == nil && len(st.Waiters) == 0
	})
	if _, err := l.Put(ctx, "calls/key", []byte("v1")); err != nil { // 4
		t.Fatalf("fenced Put: %v", err)
	}
	if err := l.Validate(ctx); err != nil { // 5
		t.Fatalf("Validate: %v", err)
	}
	if _, err := l.Delete(ctx, "calls/key"); err != nil { // 6
		t.Fatalf("fenced Delete: %v", err)
	}
	if err := l.Release(ctx); err != nil { // 7
		t.Fatalf("Release: %v", err)
	}
	if _, err := l.Put(ctx, "calls/key", []byte("late")); !errors.Is(err, clientlib.ErrStaleToken) && !errors.Is(err, clientlib.ErrNotHolder) { // 8
		t.Fatalf("fenced Put after Release = %v, want a refusal", err)
	}
	lead, err := a.Campaign(ctx, "calls/election", "a") // 9
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if err := lead.Proclaim(ctx, "a2"); err != nil { // 10
		t.Fatalf("Proclaim: %v", err)
	}
	if got, err := c.Leader(ctx, "calls/election"); err != nil || got.Value != "a2" {
		t.Fatalf("Leader = %+v, %v; want value a2", got, err)
	}
	if err := lead.Resign(ctx); err != nil { // 11
		t.Fatalf("Resign: %v", err)
	}
	return 11
}

// rawSession creates a session of 10s through the API itself, as ctx's
// caller, and returns its id.
func rawSession(ctx context.Context, t *testing.T, sessions coorddv1.SessionServiceClient) string {
	t.Helper()
	resp, err := sessions.CreateSession(ctx, &coorddv1.CreateSessionRequest{Ttl: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetSession().GetId()
}

// TestCallsArePipelined speaks the Calls stream itself: a call that waits
// holds up none sent after it, failures answer their call and leave the
// stream open, and a cancel withdraws a waiting call.
func TestCallsArePipelined(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	conn := dialRaw(t, d.GRPCAddr())
	sessions := coorddv1.NewSessionServiceClient(conn)
	ctx := t.Context()
	holder, waiter := rawSession(ctx, t, sessions), rawSession(ctx, t, sessions)
	if _, err := coorddv1.NewLockServiceClient(conn).Acquire(ctx, &coorddv1.AcquireRequest{Name: "pipe/held", SessionId: holder, RequestId: "h"}); err != nil {
		t.Fatal(err)
	}
	st, err := sessions.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(req *coorddv1.CallsRequest) {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *coorddv1.CallsResponse {
		t.Helper()
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// 1 waits behind the holder; 2, 3 and 4 are answered meanwhile.
	send(&coorddv1.CallsRequest{CallId: 1, Call: &coorddv1.CallsRequest_Acquire{Acquire: &coorddv1.AcquireRequest{Name: "pipe/held", SessionId: waiter, RequestId: "w"}}})
	wait.For(t, "call 1 to queue behind the holder", func() bool {
		resp, err := coorddv1.NewLockServiceClient(conn).DescribeLock(ctx, &coorddv1.DescribeLockRequest{Name: "pipe/held"})
		return err == nil && len(resp.GetWaiters()) == 1
	})
	send(&coorddv1.CallsRequest{CallId: 2, Call: &coorddv1.CallsRequest_TryAcquire{TryAcquire: &coorddv1.TryAcquireRequest{Name: "pipe/free", SessionId: waiter, RequestId: "f"}}})
	if r := recv(); r.GetCallId() != 2 || r.GetTryAcquire().GetGrant().GetToken() <= 0 {
		t.Fatalf("answer to call 2 (TryAcquire of a free lock) = %v", r)
	}
	send(&coorddv1.CallsRequest{CallId: 3, Call: &coorddv1.CallsRequest_TryAcquire{TryAcquire: &coorddv1.TryAcquireRequest{Name: "pipe/held", SessionId: waiter, RequestId: "t"}}})
	if r := recv(); r.GetCallId() != 3 || codes.Code(r.GetError().GetCode()) != codes.Aborted {
		t.Fatalf("answer to call 3 (TryAcquire of a held lock) = %v, want ABORTED", r)
	}
	send(&coorddv1.CallsRequest{CallId: 4, Call: &coorddv1.CallsRequest_Release{Release: &coorddv1.ReleaseRequest{Name: "pipe/free", Token: 1 << 40}}})
	if r := recv(); r.GetCallId() != 4 || r.GetError() == nil {
		t.Fatalf("answer to call 4 (Release of a token never granted) = %v, want an error", r)
	}
	send(&coorddv1.CallsRequest{CallId: 0, Call: &coorddv1.CallsRequest_TryAcquire{TryAcquire: &coorddv1.TryAcquireRequest{Name: "pipe/free", SessionId: waiter}}})
	if r := recv(); codes.Code(r.GetError().GetCode()) != codes.InvalidArgument {
		t.Fatalf("answer to a call without an id = %v, want INVALID_ARGUMENT", r)
	}
	// Cancelling 1 withdraws it from the queue and answers CANCELLED.
	send(&coorddv1.CallsRequest{CallId: 1, Call: &coorddv1.CallsRequest_Cancel{Cancel: &coorddv1.CancelCall{}}})
	if r := recv(); r.GetCallId() != 1 || codes.Code(r.GetError().GetCode()) != codes.Canceled {
		t.Fatalf("answer to the cancelled call 1 = %v, want CANCELLED", r)
	}
	resp, err := coorddv1.NewLockServiceClient(conn).DescribeLock(ctx, &coorddv1.DescribeLockRequest{Name: "pipe/held"})
	if err != nil || len(resp.GetWaiters()) != 0 {
		t.Fatalf("waiters after the cancel = %v, %v; want none", resp.GetWaiters(), err)
	}
	// A waiting call (parked on the member) whose wait runs out answers
	// DEADLINE_EXCEEDED, as its unary RPC does, and leaves the queue.
	send(&coorddv1.CallsRequest{CallId: 5, Call: &coorddv1.CallsRequest_Acquire{Acquire: &coorddv1.AcquireRequest{Name: "pipe/held", SessionId: waiter, RequestId: "w5", Wait: durationpb.New(200 * time.Millisecond)}}})
	if r := recv(); r.GetCallId() != 5 || codes.Code(r.GetError().GetCode()) != codes.DeadlineExceeded {
		t.Fatalf("answer to call 5 (its wait ran out) = %v, want DEADLINE_EXCEEDED", r)
	}
	wait.For(t, "call 5 to leave the queue", func() bool {
		resp, err := coorddv1.NewLockServiceClient(conn).DescribeLock(ctx, &coorddv1.DescribeLockRequest{Name: "pipe/held"})
		return err == nil && len(resp.GetWaiters()) == 0
	})
	// One that waits until the holder releases is answered with its grant.
	send(&coorddv1.CallsRequest{CallId: 6, Call: &coorddv1.CallsRequest_Acquire{Acquire: &coorddv1.AcquireRequest{Name: "pipe/held", SessionId: waiter, RequestId: "w6"}}})
	wait.For(t, "call 6 to queue behind the holder", func() bool {
		resp, err := coorddv1.NewLockServiceClient(conn).DescribeLock(ctx, &coorddv1.DescribeLockRequest{Name: "pipe/held"})
		return err == nil && len(resp.GetWaiters()) == 1
	})
	held := resp.GetHolders()[0]
	if _, err := coorddv1.NewLockServiceClient(conn).Release(ctx, &coorddv1.ReleaseRequest{Name: "pipe/held", Token: held.GetToken(), SessionId: holder, RequestId: "h"}); err != nil {
		t.Fatal(err)
	}
	if r := recv(); r.GetCallId() != 6 || r.GetAcquire().GetGrant().GetToken() <= held.GetToken() {
		t.Fatalf("answer to call 6 after the release = %v, want its grant", r)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("the stream went on after the client closed its side")
	}
}

// TestCallsAreAuthorizedOneByOne: under a policy, each call on a Calls
// stream is authorized and audited as its unary RPC; a refused call
// answers PERMISSION_DENIED and the stream serves the next one.
func TestCallsAreAuthorizedOneByOne(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	d := start(t, cfg)
	conn := dialRaw(t, d.GRPCAddr())
	sessions := coorddv1.NewSessionServiceClient(conn)
	as := func(p string) context.Context { return withToken(t.Context(), p) }
	aliceSession, bobSession := rawSession(as("alice"), t, sessions), rawSession(as("bob"), t, sessions)
	grant, err := coorddv1.NewLockServiceClient(conn).Acquire(as("alice"), &coorddv1.AcquireRequest{Name: "a/x", SessionId: aliceSession, RequestId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	token := grant.GetGrant().GetToken()
	call := func(st coorddv1.SessionService_CallsClient, req *coorddv1.CallsRequest) *coorddv1.CallsResponse {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("the stream ended: %v", err)
		}
		if r.GetCallId() != req.GetCallId() {
			t.Fatalf("answer to call %d names call %d", req.GetCallId(), r.GetCallId())
		}
		return r
	}
	bob, err := sessions.Calls(as("bob"))
	if err != nil {
		t.Fatal(err)
	}
	// bob may hold sessions, not locks: not a/x, and not alice's grant.
	if r := call(bob, &coorddv1.CallsRequest{CallId: 1, Call: &coorddv1.CallsRequest_TryAcquire{TryAcquire: &coorddv1.TryAcquireRequest{Name: "a/x", SessionId: bobSession, RequestId: "b"}}}); codes.Code(r.GetError().GetCode()) != codes.PermissionDenied {
		t.Fatalf("bob's TryAcquire on the stream = %v, want PERMISSION_DENIED", r)
	}
	if r := call(bob, &coorddv1.CallsRequest{CallId: 2, Call: &coorddv1.CallsRequest_Release{Release: &coorddv1.ReleaseRequest{Name: "a/x", Token: token}}}); codes.Code(r.GetError().GetCode()) != codes.PermissionDenied {
		t.Fatalf("bob's Release of alice's grant on the stream = %v, want PERMISSION_DENIED", r)
	}
	alice, err := sessions.Calls(as("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if r := call(alice, &coorddv1.CallsRequest{CallId: 1, Call: &coorddv1.CallsRequest_Release{Release: &coorddv1.ReleaseRequest{Name: "a/x", Token: token, SessionId: aliceSession, RequestId: "r"}}}); r.GetError() != nil {
		t.Fatalf("alice's Release on the stream = %v", r)
	}
	// Only with a session action may one open the stream at all.
	carol, err := sessions.Calls(as("carol"))
	if err == nil {
		_, err = carol.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("carol's Calls stream = %v, want PERMISSION_DENIED", err)
	}
	// The audit log names each call by its RPC, as if it were unary.
	raw, err := os.ReadFile(cfg.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	var released, refused bool
	for line := range strings.Lines(string(raw)) {
		var r auth.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		released = released || r.RPC == "/coordd.v1.LockService/Release" && r.Principal == "alice" && r.Result == "OK"
		refused = refused || r.RPC == "/coordd.v1.LockService/Release" && r.Principal == "bob" && r.Result == "PermissionDenied"
	}
	if !released || !refused {
		t.Fatalf("audit log (alice's release %v, bob's refusal %v):\n%s", released, refused, raw)
	}
}

// TestCallsWithoutTheSessionAction: a principal allowed to release
// others' locks but not to hold sessions (an operator) may not open a
// Calls stream; the SDK sends its calls as unary RPCs, which the policy
// judges one by one.
func TestCallsWithoutTheSessionAction(t *testing.T) {
	t.Parallel()
	d := start(t, authConfig(t, `
rules:
  - principals: [alice]
    actions: ["*"]
    locks: ["a/*"]
  - principals: [carol]
    actions: [lock.release, lock.describe]
    locks: ["a/*"]
  - principals: [carol]
    actions: [cluster.admin]
`))
	alice := newClientWithToken(t, d.GRPCAddr(), "alice")
	s, err := alice.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(t.Context(), "a/x")
	if err != nil {
		t.Fatal(err)
	}
	carol := newClientWithToken(t, d.GRPCAddr(), "carol")
	if err := carol.Admin().Release(t.Context(), "a/x", l.Token()); err != nil {
		t.Fatalf("carol's release of a/x: %v", err)
	}
	select {
	case <-l.Lost():
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("alice was not told her lock was released")
	}
}
