//go:build race

package daemon_test

// raceEnabled: the race detector allows at most 8,128 goroutines alive at
// once and slows every step; tests that put crowds on a lock use smaller
// ones under it.
const raceEnabled = true
