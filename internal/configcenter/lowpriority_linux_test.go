package configcenter

import (
	"runtime"
	"syscall"
	"testing"
)

// A heavy validation runs at nice 19 on a thread of its own, and the
// priority stays on that thread: the caller's thread keeps its own.
// (syscall.Getpriority answers the kernel's 20 - nice.)
func TestHeavyValidationsRunAtTheLowestPriority(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	var inside int
	atLowPriority(func() { inside, err = syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid()) })
	if err != nil {
		t.Fatal(err)
	}
	if nice := 20 - inside; nice != 19 {
		t.Errorf("fn ran at nice %d, want 19", nice)
	}
	after, err := syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the caller's thread went from nice %d to %d", 20-before, 20-after)
	}
}
