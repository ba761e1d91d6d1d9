package clientlib

import (
	"runtime"
	"sync"
)

// dispatchPool runs the dispatchers of a client's subscriptions on a few
// goroutines, not on one each: a release that reaches a hundred
// subscriptions of a client wakes a worker or two, which take the
// subscriptions in turn, where it woke and parked a hundred goroutines
// (about 2 us of the 5.4 us a delivery cost the client; go run ./bench
// -only config -config-in-rounds, docs/performance.md).
//
// Guarantee: a callback that does not return delays no other
// subscription. Whenever a subscription waits in the queue, some worker is
// outside user code (callbacks, OnError functions, the cache file's
// write) and will take it: a worker about to enter user code while none
// other is outside it first wakes a parked worker or starts a new one. So
// the pool grows to one worker per callback that is stuck, plus one, as
// one goroutine per subscription would have run them; workers beyond a
// few that find nothing to do end.
//
// Not guaranteed: which goroutine runs a subscription's callbacks (they
// still run one at a time, in order, never two of one subscription at
// once: see Subscription.wake).
type dispatchPool struct {
	mu     sync.Mutex
	ready  sync.Cond     // parked workers wait here
	queue  []*dispatcher // subscriptions to dispatch, oldest first
	parked int           // workers waiting on ready
	// free counts the workers that are neither parked nor in user code,
	// and those woken but not yet running: each of them takes from the
	// queue before it can block.
	free   int
	closed bool // the client closed: workers with nothing to do end
}

// maxParked is how many idle workers stay for the next release.
var maxParked = runtime.GOMAXPROCS(0)

func newDispatchPool() *dispatchPool {
	p := &dispatchPool{}
	p.ready.L = &p.mu
	return p
}

// schedule queues d; a worker outside user code will run it.
func (p *dispatchPool) schedule(d *dispatcher) {
	p.mu.Lock()
	p.queue = append(p.queue, d)
	p.serveLocked()
	p.mu.Unlock()
}

// serveLocked makes sure a worker outside user code will look at a queue
// that is not empty: a parked one woken, else a new one.
func (p *dispatchPool) serveLocked() {
	if len(p.queue) == 0 || p.free > 0 {
		return
	}
	p.free++ // counted now, so that the next schedule wakes no other
	if p.parked > 0 {
		p.parked--
		p.ready.Signal()
		return
	}
	go p.work()
}

// work takes queued dispatchers until there are none and enough workers
// wait already (or the client closed).
func (p *dispatchPool) work() {
	p.mu.Lock()
	for {
		for len(p.queue) == 0 {
			if p.closed || p.parked >= maxParked {
				p.free--
				p.mu.Unlock()
				return
			}
			p.free--
			p.parked++
			p.ready.Wait() // serveLocked or shutdown moved us to free
		}
		d := p.queue[0]
		p.queue[0] = nil
		if p.queue = p.queue[1:]; len(p.queue) == 0 {
			p.queue = p.queue[:0:0] // let the array go; the next append makes one
		}
		p.mu.Unlock()
		p.run(d)
		p.mu.Lock()
	}
}

// run runs a step of d. A wake that came during it queues d again, behind
// the subscriptions already waiting (stepping d again at once would keep
// them waiting while d's releases keep coming). If user code ends the
// goroutine (runtime.Goexit: a test's t.FailNow in a callback), another
// worker serves the queue in its place; the change that step did not
// finish is taken by d's next step, queued at once if a wake came during
// it, else at d's next release.
func (p *dispatchPool) run(d *dispatcher) {
	returned := false
	defer func() {
		idle := d.s.sched.CompareAndSwap(schedBusy, schedIdle)
		if idle && returned {
			return
		}
		p.mu.Lock()
		if !returned {
			p.free-- // this worker, which exitUser counted back
		}
		if !idle { // woken meanwhile: once more, behind the others
			d.s.sched.Store(schedBusy)
			p.queue = append(p.queue, d)
		}
		p.serveLocked()
		p.mu.Unlock()
	}()
	d.s.sched.Store(schedBusy) // wakes from here on ask for another step
	d.step()
	returned = true
}

// enterUser is called by a worker before it runs user code, which may
// not return: the queue must not wait for it.
func (p *dispatchPool) enterUser() {
	p.mu.Lock()
	p.free--
	p.serveLocked()
	p.mu.Unlock()
}

// exitUser is called when the user code enterUser announced returned.
func (p *dispatchPool) exitUser() {
	p.mu.Lock()
	p.free++
	p.mu.Unlock()
}

// shutdown ends the parked workers, and every other once the queue is
// empty. It does not wait for workers in user code.
func (p *dispatchPool) shutdown() {
	p.mu.Lock()
	p.closed = true
	p.free += p.parked
	p.parked = 0
	p.ready.Broadcast()
	p.mu.Unlock()
}
