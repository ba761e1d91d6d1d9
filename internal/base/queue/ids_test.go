package queue_test

import (
	"testing"

	"github.com/coordd/coordd/internal/base/queue"
)

// An id made up by Take comes back from Take only after its entry was
// released, and only for the same session, name and mode; a key Take did
// not make is never freed.
func TestIDsAreUsedAgainOnlyAfterTheirRelease(t *testing.T) {
	var p queue.IDs
	key := func(id string) string { return "q/1/" + id }
	take := func(session int64, name string, read bool) string {
		id, _ := p.Take(session, name, read, false, key)
		return id
	}
	a := take(1, "x", false)
	if b := take(1, "x", false); b == a {
		t.Fatalf("an id still in use (%q) was handed out again", a)
	}
	p.Released("q/1/chosen-by-the-caller")
	if c := take(1, "x", false); c == "chosen-by-the-caller" {
		t.Fatal("an id Take did not make up was handed out")
	}
	p.Released(key(a))
	for _, other := range []struct {
		session int64
		name    string
		read    bool
	}{{2, "x", false}, {1, "y", false}, {1, "x", true}} {
		if id := take(other.session, other.name, other.read); id == a {
			t.Fatalf("session %d, name %q, read %v got another's released id %q", other.session, other.name, other.read, id)
		}
	}
	if id, reused := p.Take(1, "x", false, false, key); id != a || !reused {
		t.Fatalf("after its release: %q (reused %v), want %q again", id, reused, a)
	}
	if id := take(1, "x", false); id == a {
		t.Fatalf("a released id (%q) was handed out twice", a)
	}
}
