package keyring

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func ring(t *testing.T, ids ...string) *Ring {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		l, err := NewKeyLine(id)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(l)
	}
	r, err := Parse([]byte("# keys\n\n" + b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSealOpensOnlyWhereItWasSealed(t *testing.T) {
	k := NewDataKey()
	s, err := Seal(k, []byte("ns\x00a"), "hunter2")
	if err != nil {
		t.Fatal(err)
	}
	if !IsSealed(s) || strings.Contains(s, "hunter2") {
		t.Fatalf("sealed %q", s)
	}
	if got, err := Open(k, []byte("ns\x00a"), s); err != nil || got != "hunter2" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if s2, _ := Seal(k, []byte("ns\x00a"), "hunter2"); s2 == s {
		t.Fatal("two seals of one value are equal: the nonce is not random")
	}
	for name, try := range map[string]func() (string, error){
		"other key":      func() (string, error) { return Open(k, []byte("ns\x00b"), s) },
		"other data key": func() (string, error) { return Open(NewDataKey(), []byte("ns\x00a"), s) },
		"altered":        func() (string, error) { return Open(k, []byte("ns\x00a"), s[:len(s)-2]+"AA") },
		"short":          func() (string, error) { return Open(k, []byte("ns\x00a"), SealedPrefix+"AAAA") },
		"clear":          func() (string, error) { return Open(k, []byte("ns\x00a"), "hunter2") },
	} {
		if _, err := try(); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: err = %v, want ErrOpen", name, err)
		}
	}
}

func TestWrapNamesItsKeyAndRotates(t *testing.T) {
	ctx := context.Background()
	old := ring(t, "k1")
	dek := NewDataKey()
	w, err := old.Wrap(ctx, dek, []byte("ns"))
	if err != nil || w.KEK != "k1" {
		t.Fatalf("Wrap = %+v, %v", w, err)
	}
	// A new primary first, the old key kept to unwrap.
	both, err := Parse([]byte(mustLine(t, "k2") + lineOf(t, old, "k1")))
	if err != nil {
		t.Fatal(err)
	}
	if both.Primary() != "k2" {
		t.Fatalf("primary %q", both.Primary())
	}
	got, err := both.Unwrap(ctx, w, []byte("ns"))
	if err != nil || string(got) != string(dek) {
		t.Fatalf("Unwrap with the old key kept: %v", err)
	}
	w2, _ := both.Wrap(ctx, dek, []byte("ns"))
	if w2.KEK != "k2" {
		t.Fatalf("rewrapped with %q", w2.KEK)
	}
	if _, err := both.Unwrap(ctx, w2, []byte("other")); !errors.Is(err, ErrOpen) {
		t.Fatalf("unwrap for another namespace: %v", err)
	}
	if _, err := old.Unwrap(ctx, w2, []byte("ns")); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unwrap without the key: %v", err)
	}
}

func mustLine(t *testing.T, id string) string {
	l, err := NewKeyLine(id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lineOf writes r's key id back as a key file line.
func lineOf(t *testing.T, r *Ring, id string) string {
	t.Helper()
	return id + " " + b64(r.keys[id]) + "\n"
}

func TestParseAndLoadRefuseBadFiles(t *testing.T) {
	for name, text := range map[string]string{
		"empty":     "# nothing\n",
		"short key": "k1 AAAA\n",
		"bad id":    "k/1 " + b64(NewDataKey()) + "\n",
		"one field": "k1\n",
		"twice":     mustLine(t, "k1") + mustLine(t, "k1"),
	} {
		if _, err := Parse([]byte(text)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	if err := os.WriteFile(p, []byte(mustLine(t, "k1")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("Load of a world-readable file: %v", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := Load(p); err != nil || r.Primary() != "k1" {
		t.Fatalf("Load = %v", err)
	}
	// Group read is allowed (a Kubernetes Secret for the pod's fsGroup),
	// group write is not.
	for mode, ok := range map[os.FileMode]bool{0o440: true, 0o640: true, 0o620: false, 0o604: false} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); (err == nil) != ok {
			t.Errorf("mode %04o: Load = %v", mode, err)
		}
	}
	if _, err := NewKeyLine("bad id"); err == nil {
		t.Fatal("NewKeyLine took a bad id")
	}
}

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// BenchmarkSealOpen is the cost a secret adds per value written (Seal)
// and per value revealed (Open), for a 64-byte value.
func BenchmarkSealOpen(b *testing.B) {
	k, aad, v := NewDataKey(), []byte("ns\x00key"), strings.Repeat("x", 64)
	sealed, _ := Seal(k, aad, v)
	b.Run("seal", func(b *testing.B) {
		for b.Loop() {
			if _, err := Seal(k, aad, v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			if _, err := Open(k, aad, sealed); err != nil {
				b.Fatal(err)
			}
		}
	})
}
