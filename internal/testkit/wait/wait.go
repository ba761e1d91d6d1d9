// Package wait is for tests that wait for something to happen: it polls a
// condition until it holds and, when it does not hold in time, fails the
// test with a message that names what was awaited ("timed out after 10s
// waiting for the waiter to queue"). A test waits on a condition it can
// observe, never on a bare time.Sleep: a sleep is too short on a busy
// machine, which makes a flake, and too long everywhere else.
package wait

import (
	"testing"
	"time"
)

// Timeout is how long For waits before it fails the test.
const Timeout = 10 * time.Second

// Interval is how long For and Within sleep between two polls of the
// condition.
const Interval = 10 * time.Millisecond

// For polls cond every Interval until it returns true, and fails the test
// if it has not within Timeout. what names what is awaited, as the end of
// "waiting for ...": "the waiter to queue", "b to take over".
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Timeout, what, cond)
}

// Within is For with its own timeout, for a wait that takes longer than
// Timeout on a loaded machine (a session to expire, a leader to change, a
// process to start) or that must be quicker.
func Within(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
			return
		}
		time.Sleep(Interval)
	}
}
