package daemon

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/coordd/coordd/internal/api"
)

// leaderWatch tracks whether the embedded etcd member has a leader. The
// daemon talks to its member in process, which skips etcd's own
// require-leader check, so a member cut off from its peers would leave
// waits (lock waiters, keep-alive streams) hanging. Calls take Lost() and
// end with Unavailable once the member has had no leader for longer than
// the grace period; new calls get a fresh context once a leader is back.
type leaderWatch struct {
	etcd  *embed.Etcd // nil with external etcd: nothing to watch
	grace time.Duration

	mu     sync.Mutex
	ctx    context.Context // cancelled while leaderless past grace
	cancel context.CancelCauseFunc
}

func newLeaderWatch(e *embed.Etcd, grace time.Duration) *leaderWatch {
	w := &leaderWatch{etcd: e, grace: grace}
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	return w
}

// Lost returns a context that is cancelled (with api.ErrNoLeader) once the
// member has been without a leader for longer than the grace period.
func (w *leaderWatch) Lost() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ctx
}

// run polls the member's leader every tick until stop is closed.
func (w *leaderWatch) run(stop <-chan struct{}) {
	if w.etcd == nil {
		return
	}
	const tick = 50 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	var since time.Time // when the leader went missing; zero while there is one
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if w.etcd.Server.Leader() != 0 {
			since = time.Time{}
			w.mu.Lock()
			if w.ctx.Err() != nil {
				w.ctx, w.cancel = context.WithCancelCause(context.Background())
			}
			w.mu.Unlock()
			continue
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) > w.grace {
			w.mu.Lock()
			w.cancel(api.ErrNoLeader)
			w.mu.Unlock()
		}
	}
}
