// Package tcpproxy is a loopback TCP proxy for tests that need a network
// fault between a client and a server: it can hold traffic back
// (connections stay open and nothing gets through, as in a partition; what
// was sent arrives once it heals, as TCP delivers it, never a stream with a
// hole in it), make the target look dead (connections reset and refused,
// as after kill -9) and report how many connections it carries. It is for
// tests only.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards connections from its own loopback address to a target.
type Proxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	active atomic.Int64
	quit   chan struct{} // closed by Close

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
// then stop, and TCP's flow control holds back the rest).
func (p *Proxy) pump(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.gate():
			case <-p.quit:
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
