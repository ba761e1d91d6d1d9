package clientlib

import (
	"math/rand/v2"
	"testing"
	"time"
)

// Sessions of like TTLs renew on one grid whatever their jitter, so their
// renewals travel together.
func TestAlignTickDependsOnTheBaseIntervalAlone(t *testing.T) {
	for _, tc := range []struct{ base, want time.Duration }{
		{10 * time.Second, 250 * time.Millisecond},
		{4 * time.Second, 250 * time.Millisecond},
		{3 * time.Second, 125 * time.Millisecond},
		{500 * time.Millisecond, 31250 * time.Microsecond},
		{10 * time.Millisecond, 0},
	} {
		if got := alignTick(tc.base); got != tc.want {
			t.Errorf("alignTick(%s) = %s, want %s", tc.base, got, tc.want)
		}
	}
}

// A renewal is moved onto a tick of the wall clock only ever earlier, by
// less than a tick, and never to less than half its interval: the local
// deadline's margin is not eaten into, and sessions renewed together stay
// together.
func TestAlignedRenewalsComeEarlyNeverLate(t *testing.T) {
	for _, interval := range []time.Duration{300 * time.Millisecond, 3 * time.Second, 10 * time.Second, 20 * time.Minute} {
		tick := alignTick(interval)
		if tick <= 0 || tick > interval/16 || tick > 250*time.Millisecond {
			t.Fatalf("interval %s: tick %s, want one in (0, min(interval/16, 250ms)]", interval, tick)
		}
		for range 1000 {
			now := time.Unix(0, rand.Int64N(1<<62))
			due := now.Add(interval - time.Duration(rand.Int64N(int64(interval/2))))
			got := aligned(now, due, interval, tick)
			want := due.Sub(now)
			switch at := now.Add(got); {
			case got > want:
				t.Fatalf("interval %s: renewal due in %s moved later, to %s", interval, want, got)
			case want-got >= tick:
				t.Fatalf("interval %s: renewal due in %s moved by a tick (%s) or more, to %s", interval, want, tick, got)
			case got != want && (got <= interval/2 || !at.Equal(at.Truncate(tick))):
				t.Fatalf("interval %s: renewal due in %s moved to %s: off the %s tick, or under half the interval", interval, want, got, tick)
			case got == want && due.Truncate(tick).Sub(now) > interval/2:
				t.Fatalf("interval %s: renewal due in %s not moved onto its tick", interval, want)
			}
		}
	}
}
