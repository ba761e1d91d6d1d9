package configcenter

import (
	"runtime"
	"syscall"
)

// atLowPriority runs fn on an OS thread of its own at the lowest
// scheduling priority (nice 19), and returns when fn has: when the
// machine's CPUs are all busy, the kernel runs every other thread of the
// member (other tenants' calls, etcd's raft loop and fsyncs) before it.
// The thread is thrown away afterwards (its goroutine ends still locked
// to it), so its priority never reaches other goroutines. If the
// priority cannot be lowered, fn runs at the ordinary one.
func atLowPriority(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19)
		fn()
	}()
	<-done
}
