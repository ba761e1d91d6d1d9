package daemon

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/coordd/coordd/internal/server/api"
)

// leaderWatch tracks whether the embedded etcd member has a leader. The
// daemon talks to its member in process, which skips etcd's own
// require-leader check, so a member cut off from its peers would leave
// waits (lock waiters, keep-alive streams) hanging. Calls take Lost() and
// end with Unavailable once the member has had no leader for longer than
// the grace period; new calls get a fresh context once a leader is back.
//
// It also reports every change of "the member has a leader" to onLeader
// (from run's goroutine), without grace: the daemon's gRPC health status
// follows it, so a client probing a member it gave up on readmits it as
// soon as the member can serve again.
type leaderWatch struct {
	etcd     *embed.Etcd // nil with external etcd: nothing to watch
	grace    time.Duration
	onLeader func(has bool)
	// onLearner is told when the member becomes or stops being a learner
	// (added, not yet promoted: it serves no client requests).
	onLearner func(learner bool)
	// onLeads is told when the member becomes or stops being etcd's
	// leader, from the state in led on.
	onLeads func(leads bool)
	// led is whether the member led when the watch was made: the daemon
	// starts its health status from it, so a member that leads says so
	// from its first answer.
	led bool

	mu     sync.Mutex
	ctx    context.Context // cancelled while leaderless past grace
	cancel context.CancelCauseFunc
	// changed is cancelled at the next change of the member's leader (to
	// none or to another member), then replaced; see bindToLeader.
	changed       context.Context
	cancelChanged context.CancelFunc
}

func newLeaderWatch(e *embed.Etcd, grace time.Duration) *leaderWatch {
	w := &leaderWatch{etcd: e, grace: grace}
	if e != nil {
		lead := e.Server.Leader()
		w.led = lead != 0 && lead == e.Server.MemberID()
	}
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.changed, w.cancelChanged = context.WithCancel(context.Background())
	return w
}

// leaderChanged ends the requests bound to the previous leader.
func (w *leaderWatch) leaderChanged() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancelChanged()
	w.changed, w.cancelChanged = context.WithCancel(context.Background())
}

// Lost returns a context that is cancelled (with api.ErrNoQuorum) once the
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
	last := w.etcd.Server.Leader()
	learner, leads := false, w.led
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if l := isLearner(w.etcd); l != learner {
			learner = l
			if w.onLearner != nil {
				w.onLearner(l)
			}
		}
		lead := w.etcd.Server.Leader()
		if lead != last {
			last = lead
			w.leaderChanged()
		}
		if l := lead != 0 && lead == w.etcd.Server.MemberID(); l != leads {
			leads = l
			if w.onLeads != nil {
				w.onLeads(l)
			}
		}
		if lead != 0 {
			if !since.IsZero() && w.onLeader != nil {
				w.onLeader(true)
			}
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
			if w.onLeader != nil {
				w.onLeader(false)
			}
		}
		if time.Since(since) > w.grace {
			w.mu.Lock()
			w.cancel(api.ErrNoQuorum)
			w.mu.Unlock()
		}
	}
}

// isLearner reports whether e is a learner. (etcd's own IsLearner panics
// once the member has been removed from the cluster.)
func isLearner(e *embed.Etcd) bool {
	m := e.Server.Cluster().Member(e.Server.MemberID())
	return m != nil && m.IsLearner
}
