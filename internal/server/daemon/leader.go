package daemon

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/coordd/coordd/internal/server/api"
)

// leaderWatch tracks whether the embedded etcd member can commit: it has a
// leader, and a linearizable read through that leader (etcd's ReadIndex, a
// round from the leader to a quorum) was confirmed lately. The daemon talks
// to its member in process, which skips etcd's own require-leader check, so
// a member cut off from its peers would leave waits (lock waiters,
// keep-alive streams) hanging. A leader alone is not enough: a member whose
// outgoing peer traffic is lost while it still hears the others (a one-way
// cut, or a cut of the connections to its peer port only: raft's streams
// run over connections the receiver dialed) follows the new leader it hears,
// reports it, and can neither commit nor confirm a read.
//
// Guarantees, with election the member's election timeout:
//   - health: the member reports NOT_SERVING (onServing(false)) at once
//     when it has no leader, and when no read was confirmed for
//     servingAfter (half an election timeout, at least 0.3 s: a read
//     takes one heartbeat round);
//   - calls: Lost() is cancelled (with api.ErrNoQuorum) when no read was
//     confirmed for lostAfter (two election timeouts, at least 1 s), so the
//     calls waiting on the member end with Unavailable and the SDKs retry
//     them on a member that can commit; new calls get a fresh context once
//     a read is confirmed again.
//
// A one-member cluster always reaches its quorum (itself): it is not probed,
// and its calls end after three election timeouts without a leader (etcd's
// own require-leader bound; it happens only while it starts or stops).
// Non-guarantee: a member whose reads are confirmed but whose disk is slow
// still serves, slowly.
type leaderWatch struct {
	etcd *embed.Etcd // nil with external etcd: nothing to watch
	// grace bounds how long a one-member cluster may be without a leader
	// before its calls end; servingAfter and lostAfter are the bounds
	// above for a member of several.
	grace, servingAfter, lostAfter time.Duration
	// onServing is told when the member starts or stops being able to
	// serve (it has a leader, and reads are confirmed), from run's
	// goroutine.
	onServing func(serving bool)
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

	born time.Time // the origin of confirmed (a monotonic clock)
	// confirmed is when (since born) a read through the leader was last
	// confirmed, or the member found alone in its cluster.
	confirmed atomic.Int64

	mu     sync.Mutex
	ctx    context.Context // cancelled while the member cannot commit
	cancel context.CancelCauseFunc
	// changed is cancelled at the next change of the member's leader (to
	// none or to another member), then replaced; see bindToLeader.
	changed       context.Context
	cancelChanged context.CancelFunc
}

// newLeaderWatch watches e (nil: nothing) with the bounds derived from its
// election timeout.
func newLeaderWatch(e *embed.Etcd, election time.Duration) *leaderWatch {
	w := &leaderWatch{
		etcd: e, grace: 3 * election, born: time.Now(),
		servingAfter: max(election/2, 300*time.Millisecond), lostAfter: max(2*election, time.Second),
	}
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
// member cannot commit (see leaderWatch).
func (w *leaderWatch) Lost() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ctx
}

// unconfirmed is how long no read through the leader has been confirmed.
func (w *leaderWatch) unconfirmed() time.Duration {
	return time.Since(w.born) - time.Duration(w.confirmed.Load())
}

// run polls the member's leader every tick, and probes whether reads
// through it are confirmed (on a goroutine of its own, which run waits
// for), until stop is closed.
func (w *leaderWatch) run(stop <-chan struct{}) {
	if w.etcd == nil {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before wg.Wait: ends the probe
	wg.Go(func() { w.probe(ctx) })
	const tick = 50 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	var leaderless time.Time // when the leader went missing; zero while there is one
	last := w.etcd.Server.Leader()
	learner, leads, serving := false, w.led, true
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
		switch {
		case lead != 0:
			leaderless = time.Time{}
		case leaderless.IsZero():
			leaderless = time.Now()
		}
		unconfirmed := w.unconfirmed()
		if s := lead != 0 && unconfirmed <= w.servingAfter; s != serving {
			serving = s
			if w.onServing != nil {
				w.onServing(s)
			}
		}
		lost := unconfirmed > w.lostAfter || !leaderless.IsZero() && time.Since(leaderless) > w.grace
		w.mu.Lock()
		switch {
		case lost && w.ctx.Err() == nil:
			w.cancel(api.ErrNoQuorum)
		case !lost && w.ctx.Err() != nil:
			w.ctx, w.cancel = context.WithCancelCause(context.Background())
		}
		w.mu.Unlock()
	}
}

// probe confirms a linearizable read through the member's leader (etcd's
// ReadIndex: the leader hears from a quorum that it still leads, and the
// member applies up to its index) twice per servingAfter (at most 250 ms
// apart), each given lostAfter, until ctx ends,
// and records when one succeeded. A member alone in its cluster needs no
// round and counts as confirmed. A probe joins the reads of the member's
// clients in etcd's batch: one heartbeat round a period at most.
func (w *leaderWatch) probe(ctx context.Context) {
	every := min(w.servingAfter/2, 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if w.alone() || w.confirm(ctx) {
			w.confirmed.Store(int64(time.Since(w.born)))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// confirm waits, at most lostAfter, for one linearizable read.
func (w *leaderWatch) confirm(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, w.lostAfter)
	defer cancel()
	return w.etcd.Server.LinearizableReadNotify(ctx) == nil
}

// alone reports whether the member is its cluster's only voting member.
func (w *leaderWatch) alone() bool {
	voters := 0
	for _, m := range w.etcd.Server.Cluster().Members() {
		if !m.IsLearner {
			voters++
		}
	}
	return voters <= 1
}

// isLearner reports whether e is a learner. (etcd's own IsLearner panics
// once the member has been removed from the cluster.)
func isLearner(e *embed.Etcd) bool {
	m := e.Server.Cluster().Member(e.Server.MemberID())
	return m != nil && m.IsLearner
}
