package configcenter

import (
	"context"
	"errors"
	"testing"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// Costly validations share the gate's places: a second one waits while
// the place is taken (here its wait ends with its context), and takes the
// place once the first gave it back and it has rested.
func TestHeavyValidationsShareOnePlace(t *testing.T) {
	t.Parallel()
	g := newGate(1)
	release, err := g.acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := g.acquire(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("a second acquire while the place is taken = %v, want its context's error", err)
	}
	release()
	wait.For(t, "the place back after its rest", func() bool {
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // only a place free now will do
		r, err := g.acquire(ctx)
		if err == nil {
			r()
		}
		return err == nil
	})
}
