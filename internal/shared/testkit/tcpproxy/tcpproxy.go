// Package tcpproxy is a loopback TCP proxy for tests that need a network
// fault between a client and a server: it can hold traffic back
// (connections stay open and nothing gets through, as in a partition; what
// was sent arrives once it heals, as TCP delivers it, never a stream with a
// hole in it), make the target look dead (connections reset and refused,
// as after kill -9), delay every byte (a slow or distant link) and report
// how many connections it carries. It is for tests only.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections from its own loopback address to a target.
type Proxy struct {
	ln      net.Listener
	target  string
	down    atomic.Bool
	active  atomic.Int64
	latency atomic.Int64  // a time.Duration: see SetLatency
	quit    chan struct{} // closed by Close

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	open  chan struct{} // closed while traffic flows; a fresh one while frozen
	wg    sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target until the
// test ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("tcpproxy: %v", err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, open: open, quit: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address; clients dial it instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze holds traffic back in both directions: connections stay open and
// nothing gets through until Thaw. (Dropping the bytes instead would cut a
// hole in the middle of a stream, which no network does: TCP delivers
// everything or resets.)
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // frozen already
	}
}

// Thaw lets the traffic held back, and what follows, through.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open: // flowing already
	default:
		close(p.open)
	}
}

// gate is closed while traffic may flow.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Down makes the target look dead, as after kill -9: every forwarded
// connection is reset and new ones are closed as soon as they are
// accepted, until Up.
func (p *Proxy) Down() {
	p.down.Store(true)
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// SetLatency delays every byte by d, in both directions and in order,
// from when the proxy reads it to when it passes it on, as a slow or
// distant link does; 0 turns the delay off. Bytes read before the call keep
// the delay they had.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Up forwards new connections again after Down.
func (p *Proxy) Up() { p.down.Store(false) }

// Active is the number of client connections currently forwarded.
func (p *Proxy) Active() int { return int(p.active.Load()) }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines to exit. Here and below, the error of closing a
// connection being torn down (or already closed by its peer) is ignored:
// there is nothing left to do about it.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	close(p.quit)
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil // connections accepted from now on are refused by track
	p.mu.Unlock()
	p.wg.Wait()
}

// track records a forwarded pair; it reports false once the proxy closed.
func (p *Proxy) track(client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.active.Add(1)
		var once sync.Once
		closeBoth := func() {
			once.Do(func() {
				_ = client.Close()
				_ = server.Close()
				p.mu.Lock()
				delete(p.conns, client) // no-op once Close set conns to nil
				delete(p.conns, server)
				p.mu.Unlock()
				p.active.Add(-1)
			})
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.pump(server, client); closeBoth() }()
		go func() { defer p.wg.Done(); p.pump(client, server); closeBoth() }()
	}
}

// pump copies src to dst, holding what it read while frozen (the reads
// then stop, and TCP's flow control holds back the rest) and passing each
// chunk on once its latency (SetLatency) has passed, by deliver.
func (p *Proxy) pump(dst io.Writer, src io.Reader) {
	chunks := make(chan chunk, 16)
	delivered := make(chan struct{})
	go func() { defer close(delivered); p.deliver(dst, chunks) }()
	defer func() { close(chunks); <-delivered }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.gate():
			case <-p.quit:
				return
			}
			c := chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.latency.Load()))}
			select {
			case chunks <- c:
			case <-delivered: // dst failed
				return
			case <-p.quit:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// chunk is what one read of a pump got, and when it may be passed on.
type chunk struct {
	b   []byte
	due time.Time
}

// deliver writes chunks to dst in order, each no earlier than its due
// time, until chunks closes, a write fails or the proxy closes.
func (p *Proxy) deliver(dst io.Writer, chunks <-chan chunk) {
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.quit:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}
