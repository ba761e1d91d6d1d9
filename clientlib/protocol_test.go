package clientlib_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// A client pointed at an endpoint that answers in another protocol than
// gRPC (coordd's HTTP port; a TLS-only server, to a plaintext client)
// fails at once with what to do, instead of retrying until its dial
// timeout (a minute here: without the check the test fails on the
// message after it).
func TestAnEndpointOfAnotherProtocolIsNamedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer []byte
		want   string
	}{
		{"http", []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n400 Bad Request"), "coordd's HTTP port"},
		{"tls", []byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46}, "give the client TLS"}, // an alert record
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var served sync.WaitGroup
			t.Cleanup(func() { _ = lis.Close(); served.Wait() })
			served.Go(func() {
				for {
					conn, err := lis.Accept()
					if err != nil {
						return
					}
					_, _ = conn.Read(make([]byte, 64)) // the client's preface
					_, _ = conn.Write(tc.answer)
					_ = conn.Close()
				}
			})
			_, err = clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{lis.Addr().String()}, DialTimeout: time.Minute})
			if !errors.Is(err, clientlib.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want ErrUnavailable saying %q", err, tc.want)
			}
		})
	}
}
