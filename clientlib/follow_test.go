package clientlib

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A grant the server follows from the start may have its end reported on
// the stream before the grant's answer reaches its session: the stream
// remembers the reports, and watch finds it there. A grant followed on a
// stream other than the one its session's holdings are named on is named
// (pending) instead.
func TestAFollowedGrantReportedEndedBeforeItsAnswerIsLost(t *testing.T) {
	ks := &kaStream{}
	ks.serverID.Store(7)
	s := &Session{holdings: map[holdingID]*watchedHolding{}, announce: make(chan struct{}, 1), named: ks}
	h := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "x", Token: 42, RequestId: "r"}
	ks.recent.add(holdingID{kind: h.GetKind(), name: h.GetName(), token: h.GetToken()})

	if _, gone := s.watch(h, watchedHolding{ended: func() {}}, following{stream: 7}); !gone {
		t.Fatal("a followed grant whose end the stream reported is not seen as gone")
	}
	if len(s.holdings) != 0 || len(s.pending) != 0 {
		t.Fatalf("a gone grant is kept (%d) or named (%d)", len(s.holdings), len(s.pending))
	}

	other := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "y", Token: 43, RequestId: "r"}
	if _, gone := s.watch(other, watchedHolding{ended: func() {}}, following{stream: 7}); gone || len(s.pending) != 0 || len(s.holdings) != 1 {
		t.Fatalf("a live followed grant: gone %v, %d named, %d kept; want kept, not named", gone, len(s.pending), len(s.holdings))
	}
	moved := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "z", Token: 44, RequestId: "r"}
	if _, gone := s.watch(moved, watchedHolding{ended: func() {}}, following{stream: 8}); gone || len(s.pending) != 1 {
		t.Fatalf("a grant followed on another stream: gone %v, %d named; want it named here", gone, len(s.pending))
	}
	// Reports forgotten since the grant was asked for may have held its
	// end: it is named.
	for i := range maxRecentEnds {
		ks.recent.add(holdingID{kind: coorddv1.Holding_KIND_LOCK, name: "filler", token: int64(1000 + i)})
	}
	late := &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "w", Token: 45, RequestId: "r"}
	if _, gone := s.watch(late, watchedHolding{ended: func() {}}, following{stream: 7}); gone || len(s.pending) != 2 {
		t.Fatalf("a grant asked for before the stream forgot reports: gone %v, %d named; want it named", gone, len(s.pending))
	}
}

// A holding may be ended while newHeld is still starting it (its session
// is over already, or the stream reports its end as soon as it is
// added): it ends once, Lost closes, and nothing it started stays behind.
func TestAHoldingEndedWhileItStartsEndsOnce(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("session over"))
	s := &Session{ctx: ctx, holdings: map[holdingID]*watchedHolding{}, announce: make(chan struct{}, 1)}
	for i := range 200 {
		h := newHeld(s, &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: "x", Token: int64(i + 1), RequestId: "r"}, func() error { return errors.New("gone") }, following{}, nil)
		select {
		case <-h.lost:
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatal("a holding of an ended session is not lost")
		}
	}
	if n := func() int { s.hmu.Lock(); defer s.hmu.Unlock(); return len(s.holdings) }(); n != 0 {
		t.Errorf("%d holdings of an ended session are still watched", n)
	}
}
