package session

import (
	"slices"
	"testing"
)

// A batch is renewed in lots of at most renewLot sessions, the session
// named on its own first; a request naming one session is one lot.
func TestLots(t *testing.T) {
	batch := make([]ID, 2*renewLot+1)
	for i := range batch {
		batch[i] = ID(i + 1)
	}
	if got := Lots(7, nil); len(got) != 1 || got[0].single != 7 || got[0].batch != nil {
		t.Fatalf("Lots(7, nil) = %+v, want one lot of session 7", got)
	}
	got := Lots(99, batch)
	var all []ID
	for _, l := range got {
		if len(l.batch) == 0 || len(l.batch) > renewLot {
			t.Fatalf("a lot of %d sessions, want 1 to %d", len(l.batch), renewLot)
		}
		all = append(all, l.batch...)
	}
	if want := append([]ID{99}, batch...); !slices.Equal(all, want) || len(got) != 3 {
		t.Fatalf("Lots(99, batch) covers %v in %d lots, want %v in 3", all, len(got), want)
	}
}
