package wait_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// recorder is a testing.TB whose Fatalf records the message instead of
// ending the test, so that a failing wait can be checked.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	var polls atomic.Int32
	wait.For(t, "the third poll", func() bool { return polls.Add(1) >= 3 })
	if n := polls.Load(); n != 3 {
		t.Fatalf("cond polled %d times, want 3", n)
	}
}

func TestWithinFailsNamingWhatWasAwaited(t *testing.T) {
	r := &recorder{TB: t}
	start := time.Now()
	wait.Within(r, 50*time.Millisecond, "the impossible", func() bool { return false })
	if elapsed := time.Since(start); elapsed < wait.Bound(50*time.Millisecond) {
		t.Fatalf("gave up after %s, before the 50ms timeout (× %g)", elapsed, wait.Scale)
	}
	want := "timed out after 50ms waiting for the impossible"
	if wait.Scale != 1 {
		want = fmt.Sprintf("timed out after %s (50ms × %g) waiting for the impossible", wait.Bound(50*time.Millisecond), wait.Scale)
	}
	if r.failed != want {
		t.Fatalf("failure message %q, want %q", r.failed, want)
	}
}
