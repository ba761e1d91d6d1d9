package configcenter

import (
	"errors"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/base/names"
)

// FuzzValidateWrite checks that namespace and mutation validation never
// panics, reports only ErrInvalid or ErrTooLarge, accepts only what the
// documented rules allow, and that an accepted namespace and key escape
// to one key segment each, reversibly (so "a" and "a/b" never share keys).
func FuzzValidateWrite(f *testing.F) {
	f.Add("payments/prod", "db.url", "postgres://x", false)
	f.Add("a//b", "bad key", "\xff", false)
	f.Add("a/../b", "", "", true)
	f.Add("ns", "k%2Fx", strings.Repeat("v", 300), false)
	s := &Store{limits: Limits{MaxValueBytes: 256}.withDefaults()}
	f.Fuzz(func(t *testing.T, ns, key, value string, del bool) {
		if err := ValidateNamespace(ns); err == nil {
			for _, seg := range strings.Split(ns, "/") {
				if seg == "" || seg == "." || seg == ".." {
					t.Fatalf("accepted namespace %q with segment %q", ns, seg)
				}
			}
			if len(ns) > MaxNamespaceBytes || strings.Contains(ns, "%") {
				t.Fatalf("accepted namespace %q", ns)
			}
			if esc := names.Escape(ns); strings.Contains(esc, "/") || names.Unescape(esc) != ns {
				t.Fatalf("namespace %q escapes to %q", ns, esc)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("namespace error %v is not ErrInvalid", err)
		}
		err := s.checkMutations([]Mutation{{Key: key, Value: value, Delete: del}})
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems()) == 0 || !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("mutation error %v: want a ValidationError of ErrInvalid or ErrTooLarge", err)
			}
			return
		}
		if key == "" || len(key) > MaxKeyBytes || strings.Contains(key, "%") || !del && len(value) > 256 {
			t.Fatalf("accepted key %q with a %d-byte value", key, len(value))
		}
		if esc := names.Escape(key); strings.Contains(esc, "/") || names.Unescape(esc) != key {
			t.Fatalf("key %q escapes to %q", key, esc)
		}
	})
}
