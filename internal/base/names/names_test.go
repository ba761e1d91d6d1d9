package names

import (
	"strings"
	"testing"
)

// One rule for lock, election and namespace names: every name a client or
// proxy could normalise into another (dot segments, empty segments, slashes
// at either end) is refused, so GET /v1/locks/{name} always reads back the
// lock that was taken.
func TestCheck(t *testing.T) {
	good := []string{"a", "payments/prod", "reports/daily", "a.b_c:d@e-f", "x/y/z", "..a", "a..", ".hidden/x", "v1.2", strings.Repeat("a", MaxName)}
	bad := []string{
		"", ".", "..", "../etc/passwd", "a/../b", "./a", "a/.", "a/..", "/leading", "trailing/", "a//b", "/",
		"a b", "a%2Fb", "é", "a\x00", "a?b", "a#b", strings.Repeat("a", MaxName+1),
	}
	for _, n := range good {
		if err := Check("lock name", n); err != nil {
			t.Errorf("Check(%q) = %v, want ok", n, err)
		}
	}
	for _, n := range bad {
		err := Check("lock name", n)
		if err == nil {
			t.Errorf("Check(%q) accepted", n)
			continue
		}
		if !strings.HasPrefix(err.Error(), "lock name") {
			t.Errorf("Check(%q) = %q: the error should name what it checked", n, err)
		}
	}
	if err := Check("lock name", "a b"); err == nil || !strings.Contains(err.Error(), "ASCII letters") {
		t.Errorf("Check(%q) = %v, want it to say which characters are allowed", "a b", err)
	}
}

// Keys take the same characters without the segment rule.
func TestCheckKey(t *testing.T) {
	for _, k := range []string{"db.url", "a//b", "/x", "x/"} {
		if err := CheckKey("key", k); err != nil {
			t.Errorf("CheckKey(%q) = %v", k, err)
		}
	}
	for _, k := range []string{"", "a b", "a%b"} {
		if CheckKey("key", k) == nil {
			t.Errorf("CheckKey(%q) accepted", k)
		}
	}
}

func FuzzEscape(f *testing.F) {
	f.Add("payments/prod")
	f.Fuzz(func(t *testing.T, name string) {
		if Check("name", name) != nil {
			return
		}
		if got := Unescape(Escape(name)); got != name {
			t.Fatalf("Unescape(Escape(%q)) = %q", name, got)
		}
		if strings.Contains(Escape(name), "/") {
			t.Fatalf("Escape(%q) = %q holds a slash", name, Escape(name))
		}
	})
}
