package daemon

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A gRPC client given coordd's HTTP port instead of its gRPC port (grpcurl,
// grpcio, a Go client) speaks HTTP/2: in plaintext it starts with HTTP/2's
// preface, which the HTTP/1 server would answer with a bare 400; over TLS
// it negotiates h2 and its call reaches the REST routes, which answer in
// JSON. Either way it is told, in gRPC's terms, which port to use: every
// call ends with FAILED_PRECONDITION and a message naming the gRPC port.
// In plaintext the server's first SETTINGS frame also carries
// SettingGRPCPort (an identifier HTTP/2 peers ignore), so that the Go SDK
// recognises the HTTP port before its first call (clientlib.New fails at
// once).

// SettingGRPCPort is the HTTP/2 setting, unknown to HTTP/2 itself, by
// which coordd's HTTP port names its gRPC port to a plaintext HTTP/2
// client.
const SettingGRPCPort http2.SettingID = 0xc0dd

// httpPortHint is the message a gRPC call on the HTTP port gets.
func httpPortHint(grpcAddr string) string {
	return fmt.Sprintf("this is coordd's HTTP port (REST, the console, /metrics); gRPC clients need its gRPC port (--grpc-addr, %s)", grpcAddr)
}

// grpcOnHTTP answers a gRPC call that reached the HTTP handler (over TLS,
// h2) with the hint, and passes every other request to next.
func grpcOnHTTP(next http.Handler, grpcAddr string) http.Handler {
	msg := grpcMessage(httpPortHint(grpcAddr))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/grpc")
		h.Set("Grpc-Status", "9") // FAILED_PRECONDITION: retrying will not help
		h.Set("Grpc-Message", msg)
		w.WriteHeader(http.StatusOK)
	})
}

// grpcMessage percent-encodes s as gRPC's grpc-message header wants.
func grpcMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// httpPortListener is the plaintext HTTP listener as the HTTP server takes
// it: a connection that starts with HTTP/2's preface is answered by
// answerGRPC; every other one passes untouched.
type httpPortListener struct {
	net.Listener
	grpcAddr string
}

func (l httpPortListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &prefaceConn{Conn: c, grpcAddr: l.grpcAddr}, nil
}

// prefaceConn looks at a connection's first bytes (in the HTTP server's
// first Read): HTTP/2's preface is answered here and the connection ends
// (the server sees EOF); anything else is read as it came.
type prefaceConn struct {
	net.Conn
	grpcAddr string
	once     sync.Once
	pending  []byte // read while looking, not yet returned
	err      error
}

func (c *prefaceConn) Read(p []byte) (int, error) {
	c.once.Do(c.look)
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(p)
}

// look reads until the first bytes are or cannot be HTTP/2's preface.
func (c *prefaceConn) look() {
	preface := []byte(http2.ClientPreface)
	buf := make([]byte, 0, len(preface))
	for len(buf) < len(preface) && bytes.HasPrefix(preface, buf) {
		n, err := c.Conn.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			c.pending, c.err = buf, err
			return
		}
	}
	if !bytes.Equal(buf, preface) {
		c.pending = buf
		return
	}
	answerGRPC(c.Conn, c.grpcAddr)
	c.err = io.EOF
}

// answerGRPC speaks just enough HTTP/2 to end the client's first call
// with the hint, then goes away: its SETTINGS name the gRPC port, a PING
// or SETTINGS is answered, the first request's HEADERS get a
// trailers-only response (FAILED_PRECONDITION), and a GOAWAY carries the
// hint too. It gives up after 10 s.
func answerGRPC(conn net.Conn, grpcAddr string) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	hint := httpPortHint(grpcAddr)
	fr := http2.NewFramer(conn, conn)
	port := uint32(0)
	if _, p, err := net.SplitHostPort(grpcAddr); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			port = uint32(n)
		}
	}
	if fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1}, http2.Setting{ID: SettingGRPCPort, Val: port}) != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.PingFrame:
			if !f.IsAck() && fr.WritePing(true, f.Data) != nil {
				return
			}
		case *http2.HeadersFrame:
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, hf := range []hpack.HeaderField{
				{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"},
				{Name: "grpc-status", Value: "9"}, {Name: "grpc-message", Value: grpcMessage(hint)},
			} {
				_ = enc.WriteField(hf) // into a bytes.Buffer: cannot fail
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true})
			_ = fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, []byte(hint))
			return
		}
	}
}
