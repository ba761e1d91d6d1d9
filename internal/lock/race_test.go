//go:build race

package lock_test

// raceEnabled: the race detector slows every step several times over;
// tests that put crowds on a lock use smaller ones under it.
const raceEnabled = true
