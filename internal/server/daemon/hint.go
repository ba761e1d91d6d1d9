package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// grpcPortHint is the gRPC listener as the gRPC server takes it: a client
// that speaks HTTP/1 to the gRPC port (curl or a browser given the wrong
// port) is answered with a plain-text 400 that names the HTTP port,
// instead of gRPC's silence (curl: "Received HTTP/0.9 when not allowed").
// gRPC clients start with HTTP/2's preface or a TLS hello, never an
// HTTP/1 method, and pass untouched.
type grpcPortHint struct {
	net.Listener
	answer []byte
}

// hintFor returns l with the hint naming httpAddr.
func hintFor(l net.Listener, httpAddr string) grpcPortHint {
	body := fmt.Sprintf("This is coordd's gRPC port: coordctl and the SDKs talk here. REST, the console and /metrics are on its HTTP port (--http-addr, %s).\n", httpAddr)
	return grpcPortHint{Listener: l, answer: fmt.Appendf(nil, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)}
}

func (l grpcPortHint) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &hintConn{Conn: c, answer: l.answer}, nil
}

// hintConn answers an HTTP/1 request with the hint and ends (see
// grpcPortHint). The gRPC server writes its HTTP/2 settings before it
// reads anything: what it writes before the client's first bytes were
// looked at is held, and sent once they are gRPC's. Read has one caller,
// the server's handshake and then its reader.
type hintConn struct {
	net.Conn
	answer []byte
	looked atomic.Bool
	mu     sync.Mutex // guards held, and looked's change
	held   []byte
}

// errHTTP1 ends a connection whose client spoke HTTP/1.
var errHTTP1 = errors.New("an HTTP/1 request on the gRPC port (answered with a hint)")

func (c *hintConn) Write(p []byte) (int, error) {
	if !c.looked.Load() {
		c.mu.Lock()
		if !c.looked.Load() {
			c.held = append(c.held, p...)
			c.mu.Unlock()
			return len(p), nil
		}
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *hintConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.looked.Load() || n == 0 {
		return n, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.looked.Store(true)
	held := c.held
	c.held = nil
	if isHTTP1Request(p[:n]) {
		_, _ = c.Conn.Write(c.answer)
		return 0, errHTTP1
	}
	if len(held) > 0 {
		if _, werr := c.Conn.Write(held); werr != nil {
			return 0, werr
		}
	}
	return n, err
}

// SyscallConn lets the gRPC server set socket options (TCP_USER_TIMEOUT)
// as on the connection itself.
func (c *hintConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// isHTTP1Request reports whether first starts an HTTP/1 request line.
func isHTTP1Request(first []byte) bool {
	for _, m := range []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH "} {
		if bytes.HasPrefix(first, []byte(m)) {
			return true
		}
	}
	return false
}
