// Package wait is for tests that wait for something to happen: it polls a
// condition until it holds and, when it does not hold in time, fails the
// test with a message that names what was awaited ("timed out after 10s
// waiting for the waiter to queue"). A test waits on a condition it can
// observe, never on a bare time.Sleep: a sleep is too short on a busy
// machine, which makes a flake, and too long everywhere else.
//
// Every time bound of a test is scaled by one factor, Scale: what a quiet
// developer machine needs, times COORDD_TEST_TIMESCALE (the Makefile's
// TIMESCALE; CI sets its own), times two under the race detector. Within
// scales its timeout; Bound scales any other bound a test keeps (a
// context's deadline, a select's time.After, "took at most"). A bound that
// is itself what a test asserts about production (a fail-over's speed) is
// not for a unit test: it lives in `make chaos` or the bench.
package wait

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// ScaleEnv is the environment variable that stretches every bound: a
// positive number (1.5, 3); unset or not a positive number, 1.
const ScaleEnv = "COORDD_TEST_TIMESCALE"

// Scale is the factor by which this run stretches every time bound: the
// value of ScaleEnv, doubled when the race detector is on (it slows code
// down two to ten times).
var Scale = scale(os.Getenv(ScaleEnv), raceEnabled)

func scale(env string, race bool) float64 {
	f, err := strconv.ParseFloat(env, 64)
	if err != nil || !(f > 0) || f > 1000 {
		f = 1
	}
	if race {
		f *= 2
	}
	return f
}

// Bound is d stretched by Scale: the bound a test keeps for something it
// gives d on a quiet machine.
func Bound(d time.Duration) time.Duration { return time.Duration(float64(d) * Scale) }

// describe is how a failure names a bound: d, and the scale when it is
// not 1.
func describe(d time.Duration) string {
	if Scale == 1 {
		return d.String()
	}
	return fmt.Sprintf("%s (%s × %g)", Bound(d), d, Scale)
}

// Timeout is how long For waits before it fails the test (stretched by
// Scale).
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
// process to start) or that must be quicker. The timeout is stretched by
// Scale.
func Within(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Bound(timeout))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", describe(timeout), what)
			return
		}
		time.Sleep(Interval)
	}
}
