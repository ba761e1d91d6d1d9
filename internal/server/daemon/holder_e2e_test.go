package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// toldWithin bounds how long a holder may take to learn that its lock or
// leadership was ended from outside. The sessions live far longer (30s),
// so only the server's report can end the holder's context in time: the
// bound stretches with the machine (wait.Scale) but stays under 20s.
var toldWithin = min(wait.Bound(5*time.Second), 20*time.Second)

// A lock released or a leadership resigned by someone else (an admin,
// coordctl, curl) ends the holder's context: the server reports it on the
// holder's keep-alive stream.
func TestHoldersAreToldOfOutsideEnds(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	holder := newClient(t, d.GRPCAddr())
	admin := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	newSession := func(t *testing.T) *clientlib.Session {
		t.Helper()
		s, err := holder.NewSession(ctx, clientlib.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	endedWith := func(t *testing.T, what string, c context.Context, lost <-chan struct{}, want error) {
		t.Helper()
		wait.Within(t, toldWithin, what+" ended", func() bool { return c.Err() != nil })
		if cause := context.Cause(c); !errors.Is(cause, want) {
			t.Fatalf("%s: cause %v, want %v", what, cause, want)
		}
		select {
		case <-lost:
		default:
			t.Fatalf("%s: Lost not closed", what)
		}
	}

	t.Run("lock released through the API", func(t *testing.T) {
		s := newSession(t)
		l, err := s.Lock(ctx, "told/api")
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.Admin().Release(ctx, "told/api", l.Token()); err != nil {
			t.Fatal(err)
		}
		endedWith(t, "the lock's context", l.Context(), l.Lost(), clientlib.ErrNotHolder)
		if s.Err() != nil {
			t.Fatalf("the session ended with the lock: %v", s.Err())
		}
	})

	t.Run("lock released over REST", func(t *testing.T) {
		s := newSession(t)
		l, err := s.Lock(ctx, "told/rest")
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"name":"told/rest","token":"%d"}`, l.Token())
		resp, err := httpClient.Post("http://"+d.HTTPAddr()+"/v1/locks:release", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("REST release: %s", resp.Status)
		}
		endedWith(t, "the lock's context", l.Context(), l.Lost(), clientlib.ErrNotHolder)
	})

	t.Run("leadership resigned through the API", func(t *testing.T) {
		s := newSession(t)
		lead, err := s.Campaign(ctx, "told/election", "v1")
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.Admin().Resign(ctx, "told/election", lead.Term()); err != nil {
			t.Fatal(err)
		}
		endedWith(t, "the leadership's context", lead.Context(), lead.Lost(), clientlib.ErrNotLeader)
	})

	// RunAsLeader's callback is cancelled and has returned before the
	// process campaigns again; it then leads again with a greater term.
	t.Run("RunAsLeader resigned from outside", func(t *testing.T) {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var running, overlaps atomic.Int32
		terms := make(chan fencing.Token, 10)
		demoted := make(chan error, 10)
		done := make(chan error, 1)
		go func() {
			done <- holder.RunAsLeader(rctx, "told/run", "me", func(fctx context.Context, lead *clientlib.Leadership) error {
				if running.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer running.Add(-1)
				terms <- lead.Term()
				<-fctx.Done()
				return fctx.Err()
			}, clientlib.WithElectionSession(clientlib.WithTTL(30*time.Second)),
				clientlib.WithElectionBackoff(10*time.Millisecond, 100*time.Millisecond),
				clientlib.OnDemoted(func(_ fencing.Token, cause error) { demoted <- cause }))
		}()
		first := <-terms
		if err := admin.Admin().Resign(ctx, "told/run", first); err != nil {
			t.Fatal(err)
		}
		select {
		case cause := <-demoted:
			if !errors.Is(cause, clientlib.ErrNotLeader) {
				t.Fatalf("OnDemoted cause %v, want ErrNotLeader", cause)
			}
		case <-time.After(toldWithin):
			t.Fatal("the callback was not stopped after its term was resigned from outside")
		}
		select {
		case second := <-terms:
			if second <= first {
				t.Fatalf("re-elected with term %d, not after %d", second, first)
			}
		case <-time.After(toldWithin):
			t.Fatal("RunAsLeader did not campaign again")
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("RunAsLeader = %v", err)
		}
		if overlaps.Load() != 0 {
			t.Fatal("two callbacks ran at once")
		}
	})

	// Client.Close closes its live sessions on the server: what they held
	// is free at once, not after their TTL.
	t.Run("Client.Close releases", func(t *testing.T) {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.GRPCAddr()}})
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lock(ctx, "told/closing"); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(s.Err(), clientlib.ErrSessionClosed) {
			t.Fatalf("session after Client.Close: %v", s.Err())
		}
		other := newSession(t)
		if _, err := other.TryLock(ctx, "told/closing"); err != nil {
			t.Fatalf("lock of a closed client's session: %v, want it free", err)
		}
	})

	// The protocol itself: a holding that is already gone when it is named
	// is reported at once (what a client reconnecting after a release
	// sees), and a malformed one ends the stream with InvalidArgument.
	t.Run("keep-alive stream", func(t *testing.T) {
		conn := dialRaw(t, d.GRPCAddr())
		s := newSession(t)
		sctx, cancel := context.WithTimeout(ctx, toldWithin)
		defer cancel()
		st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(sctx)
		if err != nil {
			t.Fatal(err)
		}
		gone := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "told/never", Token: 5, RequestId: "r1"}
		if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionId: s.ID(), Watch: []*coorddv1.Holding{gone}, WatchOnly: true}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetEnded()) != 1 || resp.GetEnded()[0].GetName() != "told/never" || resp.GetTtl() != nil {
			t.Fatalf("response %v, want only the gone holding in ended", resp)
		}
		if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionId: s.ID(), Watch: []*coorddv1.Holding{{Name: "x", Token: 1, RequestId: "r"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a holding without a kind: %v, want InvalidArgument", err)
		}
		// A revision before the token is not one the holding was alive at.
		st, err = coorddv1.NewSessionServiceClient(conn).KeepAliveStream(sctx)
		if err != nil {
			t.Fatal(err)
		}
		early := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "told/x", Token: 9, RequestId: "r", Revision: 8}
		if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionId: s.ID(), Watch: []*coorddv1.Holding{early}, WatchOnly: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a holding alive at a revision before its token: %v, want InvalidArgument", err)
		}
	})
}
