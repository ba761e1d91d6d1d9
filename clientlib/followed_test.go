package clientlib_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// Once a session's holdings are named on its keep-alive stream, the locks
// and leaderships it takes on that member are followed from their grant:
// the SDK names none of them on the stream, and an end from outside still
// reaches the holder.
func TestGrantsOnTheStreamsMemberAreNotNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the daemon")
	}
	ctx := t.Context()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	wait.For(t, "the session's holdings to be named on its stream", func() bool { return s.FollowStream() != 0 })
	named := c.Stats().HoldingsNamed
	for range 3 {
		l, err := s.Lock(ctx, "followed/lock")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.Lock(ctx, "followed/lock")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := s.Campaign(ctx, "followed/election", "v")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().HoldingsNamed - named; got != 0 {
		t.Errorf("%d grants named on the stream; want none (the server follows them)", got)
	}
	if err := c.Admin().Release(ctx, "followed/lock", l.Token()); err != nil {
		t.Fatal(err)
	}
	if err := c.Admin().Resign(ctx, "followed/election", lead.Term()); err != nil {
		t.Fatal(err)
	}
	for what, ctx := range map[string]context.Context{"lock": l.Context(), "leadership": lead.Context()} {
		wait.Within(t, 5*time.Second, "the "+what+" to end", func() bool { return ctx.Err() != nil })
	}
	if !errors.Is(context.Cause(l.Context()), clientlib.ErrNotHolder) {
		t.Errorf("the lock ended with %v, want ErrNotHolder", context.Cause(l.Context()))
	}
}
