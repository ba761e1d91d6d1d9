package api

import (
	"context"
	"errors"
	"testing"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/base/errkind"
)

// A principal's streams and subscriptions are counted against its own
// bound: past it a take is refused (QUOTA_EXCEEDED, naming the flag) and
// counts nothing, another principal is not affected, anonymous callers are
// not counted, and what is given back (once, however often released) can
// be taken again. A WatchMany stream's watches count once each, a restart
// of a live watch id not again, and all of them go with the stream.
func TestPerPrincipalBounds(t *testing.T) {
	as := func(name string) context.Context {
		return context.WithValue(t.Context(), principalKey{}, auth.Principal{Name: name})
	}
	refused := 0
	q := &PerPrincipal{Max: 2, What: "streams", Flag: "--max-streams-per-principal", Refused: func() { refused++ }}
	r1, err := q.take(as("alice"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.take(as("alice"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := q.take(as("alice"), 1); !errors.Is(err, errkind.QuotaExceeded) || refused != 1 || q.Held("alice") != 2 {
		t.Fatalf("alice's third: %v (refusals %d, held %d); want QUOTA_EXCEEDED, 1 refusal, 2 held", err, refused, q.Held("alice"))
	}
	if _, err := q.take(as("bob"), 2); err != nil {
		t.Fatalf("bob, while alice is at her bound: %v", err)
	}
	for range 100 {
		if _, err := q.take(t.Context(), 1); err != nil {
			t.Fatalf("an anonymous caller: %v", err)
		}
	}
	r1()
	r1() // a second release gives nothing back twice
	if q.Held("alice") != 1 {
		t.Fatalf("alice holds %d after one release (called twice); want 1", q.Held("alice"))
	}
	if _, err := q.take(as("alice"), 1); err != nil {
		t.Fatalf("alice after a release: %v", err)
	}

	subs := &subscriptions{ctx: as("carol"), q: &PerPrincipal{Max: 2, What: "config subscriptions"}}
	for _, id := range []int64{1, 2, 2} {
		if err := subs.start(id); err != nil {
			t.Fatalf("watch %d: %v", id, err)
		}
	}
	if err := subs.start(3); !errors.Is(err, errkind.QuotaExceeded) {
		t.Fatalf("a third watch: %v; want QUOTA_EXCEEDED", err)
	}
	subs.stop(1)
	if err := subs.start(3); err != nil {
		t.Fatalf("a watch after one stopped: %v", err)
	}
	subs.close()
	if n := subs.q.Held("carol"); n != 0 {
		t.Fatalf("%d subscriptions counted after the stream ended; want 0", n)
	}
}
