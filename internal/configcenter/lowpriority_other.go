//go:build !linux

package configcenter

// atLowPriority runs fn. Only Linux lowers one thread's priority (see
// lowpriority_linux.go); elsewhere heavy validations are bounded by
// heavyValidations alone.
func atLowPriority(fn func()) { fn() }
