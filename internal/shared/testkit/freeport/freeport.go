// Package freeport hands out loopback TCP ports for tests that must name a
// port before anything binds it: etcd's peer and client URLs, and daemons
// restarted on the same address.
//
// Asking the kernel for a free port (listening on :0 and closing) is racy:
// the port goes back to the kernel's ephemeral range, where the next
// outgoing connection of any process may take it as its source port before
// the test binds it. This package avoids both kinds of collision:
//   - ports come from outside the kernel's ephemeral range (below it where
//     there is room), which the kernel never hands out by itself;
//   - each process reserves a block of ports by keeping a listener open on
//     the block's first port for as long as it runs, so two test processes
//     that use this package never hand out the same port;
//   - within a process, a port is handed out once.
//
// A port is also checked to be bindable before it is handed out, in case a
// program outside the tests listens on it.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const blockSize = 64

var (
	mu       sync.Mutex
	reserved []net.Listener // block locks, kept open until the process exits
	next     int            // next port to hand out; 0 when no block is open
	end      int            // end of the open block
)

// Port returns a loopback TCP port that no other caller of this package
// has been or will be given while this process runs.
func Port(tb testing.TB) int {
	tb.Helper()
	p, err := Get()
	if err != nil {
		tb.Fatalf("freeport: %v", err)
	}
	return p
}

// Get is Port for callers without a testing.TB (a TestMain): it returns
// the error instead of failing the test.
func Get() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for {
		for next != 0 && next < end {
			p := next
			next++
			if bindable(p) {
				return p, nil
			}
		}
		if err := reserveBlock(); err != nil {
			return 0, err
		}
	}
}

// Addr returns "127.0.0.1:<port>" for a fresh Port.
func Addr(tb testing.TB) string {
	tb.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(tb))
}

// URL returns "http://127.0.0.1:<port>" for a fresh Port.
func URL(tb testing.TB) string {
	tb.Helper()
	return "http://" + Addr(tb)
}

// reserveBlock takes the first free block of the range, starting at a
// random one, and holds it by listening on its first port.
func reserveBlock() error {
	lo, hi := portRange()
	blocks := (hi - lo) / blockSize
	first := rand.IntN(blocks)
	for i := range blocks {
		base := lo + ((first+i)%blocks)*blockSize
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base))
		if err != nil {
			continue // another process holds this block
		}
		reserved = append(reserved, l)
		next, end = base+1, base+blockSize
		return nil
	}
	return fmt.Errorf("no free block of %d ports in %d-%d", blockSize, lo, hi)
}

// portRange is a range of ports outside the kernel's ephemeral range
// (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default):
// the part of 10000-32767 below it, else the ports above it. Only when the
// ephemeral range leaves neither (or cannot be read) does it fall back to
// 10000-32767, where the kernel may hand out a port too.
func portRange() (lo, hi int) {
	const minPorts = 16 * blockSize
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	f := strings.Fields(string(b))
	if err != nil || len(f) != 2 {
		return 10000, 32768
	}
	start, err1 := strconv.Atoi(f[0])
	end, err2 := strconv.Atoi(f[1])
	switch {
	case err1 != nil || err2 != nil:
		return 10000, 32768
	case start >= 10000+minPorts:
		return 10000, min(start, 32768)
	case end+1+minPorts <= 65536:
		return end + 1, 65536
	}
	return 10000, 32768
}

func bindable(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = l.Close() // a probe only: it was bound, which is the answer
	return true
}

// Socket returns "unix://<path>" for a unix socket in a fresh directory of
// its own, removed when the test ends. The path is short (under /tmp, not
// under the test's own temp dir, whose name grows with the test's), since
// a unix socket's path may have at most 107 bytes.
func Socket(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "cdd")
	if err != nil {
		tb.Fatalf("freeport: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return "unix://" + dir + "/etcd.sock"
}
