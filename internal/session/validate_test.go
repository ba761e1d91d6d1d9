package session_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/session"
)

func TestValidateSpec(t *testing.T) {
	t.Parallel()
	manyLabels := map[string]string{}
	for i := range session.MaxLabels + 1 {
		manyLabels[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name    string
		spec    session.Spec
		wantTTL time.Duration
		wantErr error
	}{
		{name: "minimum ttl", spec: session.Spec{TTL: session.MinTTL}, wantTTL: 2 * time.Second},
		{name: "maximum ttl", spec: session.Spec{TTL: session.MaxTTL}, wantTTL: time.Hour},
		{name: "fraction rounds up", spec: session.Spec{TTL: 2500 * time.Millisecond}, wantTTL: 3 * time.Second},
		{name: "full metadata", spec: session.Spec{TTL: 10 * time.Second, Owner: "billing-worker", Hostname: "host-1", Labels: map[string]string{"app.kubernetes.io/name": "billing", "zone": "eu-1"}}, wantTTL: 10 * time.Second},
		{name: "zero ttl", spec: session.Spec{}, wantErr: session.ErrInvalid},
		{name: "negative ttl", spec: session.Spec{TTL: -time.Second}, wantErr: session.ErrInvalid},
		{name: "tiny ttl", spec: session.Spec{TTL: time.Millisecond}, wantErr: session.ErrInvalid},
		{name: "just below minimum", spec: session.Spec{TTL: session.MinTTL - 1}, wantErr: session.ErrInvalid},
		{name: "huge ttl", spec: session.Spec{TTL: 1000 * time.Hour}, wantErr: session.ErrInvalid},
		{name: "oversized owner", spec: session.Spec{TTL: 5 * time.Second, Owner: strings.Repeat("o", session.MaxOwnerBytes+1)}, wantErr: session.ErrTooLarge},
		{name: "oversized hostname", spec: session.Spec{TTL: 5 * time.Second, Hostname: strings.Repeat("h", session.MaxHostnameBytes+1)}, wantErr: session.ErrTooLarge},
		{name: "owner not utf-8", spec: session.Spec{TTL: 5 * time.Second, Owner: "\xff\xfe"}, wantErr: session.ErrInvalid},
		{name: "owner with newline", spec: session.Spec{TTL: 5 * time.Second, Owner: "a\nb"}, wantErr: session.ErrInvalid},
		{name: "too many labels", spec: session.Spec{TTL: 5 * time.Second, Labels: manyLabels}, wantErr: session.ErrTooLarge},
		{name: "empty label key", spec: session.Spec{TTL: 5 * time.Second, Labels: map[string]string{"": "v"}}, wantErr: session.ErrInvalid},
		{name: "label key with space", spec: session.Spec{TTL: 5 * time.Second, Labels: map[string]string{"a b": "v"}}, wantErr: session.ErrInvalid},
		{name: "oversized label key", spec: session.Spec{TTL: 5 * time.Second, Labels: map[string]string{strings.Repeat("k", 64): "v"}}, wantErr: session.ErrTooLarge},
		{name: "oversized label value", spec: session.Spec{TTL: 5 * time.Second, Labels: map[string]string{"k": strings.Repeat("v", 257)}}, wantErr: session.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ttl, err := session.ValidateSpec(tt.spec)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ValidateSpec() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ValidateSpec() error = %v", err)
			}
			if ttl != tt.wantTTL {
				t.Errorf("ValidateSpec() ttl = %s, want %s", ttl, tt.wantTTL)
			}
		})
	}
}

func TestParseID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    session.ID
		wantErr bool
	}{
		{in: "694d7a1b2c3d4e5f", want: 0x694d7a1b2c3d4e5f},
		{in: "1", want: 1},
		{in: "ABCDEF", want: 0xabcdef},
		{in: "", wantErr: true},
		{in: "0", wantErr: true},
		{in: "0000000000000000", wantErr: true},
		{in: "xyz", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "8000000000000000", wantErr: true}, // above int64
		{in: "11112222333344445", wantErr: true},
		{in: "12 34", wantErr: true},
		{in: "../x", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := session.ParseID(tt.in)
			if tt.wantErr {
				if !errors.Is(err, session.ErrInvalid) {
					t.Fatalf("ParseID(%q) error = %v, want ErrInvalid", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseID(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if s := got.String(); s != fmt.Sprintf("%016x", uint64(got)) {
				t.Fatalf("%v.String() = %q, want 16 lower-case hex digits", uint64(got), s)
			}
			if back, err := session.ParseID(got.String()); err != nil || back != got {
				t.Fatalf("round trip of %s = %v, %v", got, back, err)
			}
		})
	}
}

// FuzzValidateCreate checks that validation never panics, that it accepts only
// specs within the documented limits, and that an accepted TTL is a whole
// number of seconds within bounds.
func FuzzValidateCreate(f *testing.F) {
	f.Add(int64(10*time.Second), "owner", "host", "k", "v")
	f.Add(int64(0), "", "", "", "")
	f.Add(int64(-1), "\xff", "h\n", "a b", "v")
	f.Add(int64(2500*time.Millisecond), "o", "h", "app.io/name", "x")
	f.Fuzz(func(t *testing.T, ttl int64, owner, host, lk, lv string) {
		spec := session.Spec{TTL: time.Duration(ttl), Owner: owner, Hostname: host, Labels: map[string]string{lk: lv}}
		got, err := session.ValidateSpec(spec)
		if err != nil {
			if !errors.Is(err, session.ErrInvalid) && !errors.Is(err, session.ErrTooLarge) {
				t.Fatalf("error %v wraps neither ErrInvalid nor ErrTooLarge", err)
			}
			return
		}
		if got < session.MinTTL || got > session.MaxTTL || got%time.Second != 0 || got < spec.TTL {
			t.Fatalf("accepted ttl %s for %s", got, spec.TTL)
		}
		if len(owner) > session.MaxOwnerBytes || len(host) > session.MaxHostnameBytes || lk == "" || len(lv) > session.MaxLabelValueBytes {
			t.Fatalf("accepted out-of-limit spec %+v", spec)
		}
	})
}

// FuzzParseID checks that any accepted id is positive and prints back to
// a form that parses to the same id.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{"694d7a1b2c3d4e5f", "1", "", "0", "-1", "ffffffffffffffff", "7fffffffffffffff", "0x10", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := session.ParseID(s)
		if err != nil {
			if !errors.Is(err, session.ErrInvalid) {
				t.Fatalf("ParseID(%q) error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if id <= 0 {
			t.Fatalf("ParseID(%q) accepted %d", s, id)
		}
		if back, err := session.ParseID(id.String()); err != nil || back != id || len(id.String()) != 16 {
			t.Fatalf("ParseID(%q) = %s does not round-trip: %v, %v", s, id, back, err)
		}
	})
}
