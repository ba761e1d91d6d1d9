package election

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidateRequest checks that campaign validation never panics, reports
// only ErrInvalid or ErrTooLarge, and accepts only requests within the
// documented limits.
func FuzzValidateRequest(f *testing.F) {
	f.Add("jobs/leader", "req-1", "host-1:80")
	f.Add("", "", "")
	f.Add("a b", "x/y", "\xff")
	f.Add("n", "r", strings.Repeat("v", MaxValueBytes+1))
	f.Fuzz(func(t *testing.T, name, requestID, value string) {
		req := Request{Name: name, Session: 1, RequestID: requestID, Value: value}
		err := validateRequest(&req)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps neither ErrInvalid nor ErrTooLarge", err)
			}
			return
		}
		if req.Name == "" || len(req.Name) > 256 || strings.Contains(req.Name, "%") || req.RequestID == "" ||
			strings.Contains(req.RequestID, "/") || len(req.Value) > MaxValueBytes || !utf8.ValidString(req.Value) {
			t.Fatalf("accepted out-of-limit request %+v", req)
		}
	})
}
