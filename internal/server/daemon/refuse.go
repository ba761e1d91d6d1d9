package daemon

import (
	"net"
	"time"
)

// refuser closes every connection its listener accepts, so that while the
// daemon starts (etcd may wait minutes for a quorum) a client is turned
// away at once and tries another member, instead of waiting on a port that
// is bound, to fail fast on a taken port, but not yet served.
type refuser struct {
	l    *net.TCPListener
	done chan struct{}
}

// refuse starts refusing connections on l; Stop ends it. A listener that
// is not TCP is left alone.
func refuse(l net.Listener) *refuser {
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return nil
	}
	r := &refuser{l: tl, done: make(chan struct{})}
	go func() { // owned by r: Stop ends it and waits for it
		defer close(r.done)
		for {
			c, err := tl.Accept()
			if err != nil {
				return // Stop's deadline, or the listener was closed
			}
			_ = c.Close() // refused: nothing was read or written
		}
	}()
	return r
}

// Stop stops refusing and leaves the listener open for the real server.
// It is safe on a nil refuser; call it once.
func (r *refuser) Stop() {
	if r == nil {
		return
	}
	// SetDeadline fails only on a closed listener, whose Accept has
	// returned already; the server that takes the listener over then
	// reports that it is closed.
	_ = r.l.SetDeadline(time.Now()) // wakes the Accept
	<-r.done
	_ = r.l.SetDeadline(time.Time{})
}
