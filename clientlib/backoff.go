package clientlib

import (
	"context"
	"math/rand/v2"
	"time"
)

// pause waits for d, or until ctx ends; it reports whether the wait went
// its full length (false: ctx ended).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jittered returns a random duration in [d/2, d], so that clients backing
// off from the same failure do not come back in step.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }
