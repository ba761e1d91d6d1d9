package freeport

import (
	"net"
	"testing"
)

// Ports are handed out once per process, lie outside the kernel's
// ephemeral range, and can be bound.
func TestPort(t *testing.T) {
	lo, hi := portRange()
	seen := map[int]bool{}
	for range 3 * blockSize { // crosses into further blocks
		p := Port(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < lo || p >= hi {
			t.Fatalf("port %d outside %d-%d", p, lo, hi)
		}
	}
	l, err := net.Listen("tcp", Addr(t))
	if err != nil {
		t.Fatalf("a handed-out port cannot be bound: %v", err)
	}
	_ = l.Close()
}
