package api

import (
	"context"
	"fmt"
	"sync"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Waiters bounds how many lock acquisitions and campaigns each principal
// may have in progress on this member at once: each is a call held open,
// with its goroutine and queue entry, so one principal could otherwise
// exhaust a member's memory for everyone. Calls without a principal (no
// authentication configured) are not counted: they would all share one
// bound. The zero value, or Max 0, bounds nothing.
type Waiters struct {
	Max int

	mu sync.Mutex
	n  map[string]int
}

// enter counts a waiting call of ctx's principal and returns the function
// that ends it, or fails with errkind.QuotaExceeded when the principal is at
// Max.
func (w *Waiters) enter(ctx context.Context) (done func(), err error) {
	p := PrincipalFrom(ctx)
	if w == nil || w.Max <= 0 || p.IsAnonymous() {
		return func() {}, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[p.Name] >= w.Max {
		return nil, errkind.QuotaExceeded.New(fmt.Sprintf("principal %s has %d acquisitions and campaigns waiting on this member, the most it may (--max-waiters-per-principal); let some end first", p.Name, w.n[p.Name]))
	}
	if w.n == nil {
		w.n = map[string]int{}
	}
	w.n[p.Name]++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.n[p.Name]--; w.n[p.Name] == 0 {
			delete(w.n, p.Name)
		}
	}, nil
}
