package lock

import (
	"context"
	"time"
)

// Watch calls fn with the lock's description (its first page p, as
// DescribePage reads it) at once, and again after its holders, waiters or lock-delay change, until
// ctx ends or fn fails (its error is returned). Changes that arrive while
// a description is read or fn runs are coalesced into the next one, so a
// slow fn sees fewer, newer descriptions: every call describes the lock at
// a revision at least as new as every change it was woken by. A lock-delay
// that ends without a change (its waiter's grant is time-based) wakes it
// too. Changes come from the member's one watch over every lock (the
// Watcher given to NewManager): a watch opens no etcd watch of its own.
func (m *Manager) Watch(ctx context.Context, name string, p Page, fn func(Description) error) error {
	if err := validateName(name); err != nil {
		return err
	}
	p.After = 0
	feed, _ := m.dels.Subscribe(m.locks+escape(name)+"/", true)
	defer feed.Stop()
	delay := time.NewTimer(time.Hour)
	defer delay.Stop()
	for {
		d, err := m.DescribePage(ctx, name, p)
		if err != nil {
			return err
		}
		if err := fn(d); err != nil {
			return err
		}
		var delayEnd <-chan time.Time
		if !d.DelayedUntil.IsZero() {
			delay.Reset(time.Until(d.DelayedUntil) + time.Millisecond)
			delayEnd = delay.C
		}
		for woken := false; !woken; {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-delayEnd:
				woken = true
			case <-feed.Ready():
				changes, restarted := feed.Take()
				for _, ev := range changes {
					woken = woken || ev.Kv.ModRevision > d.Revision
				}
				woken = woken || restarted != 0
			}
		}
	}
}
