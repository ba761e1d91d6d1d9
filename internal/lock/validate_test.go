package lock

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzValidateRequest checks that validation never panics and accepts only
// requests within the documented limits, and that escaping stays
// reversible and free of "/" for every accepted name.
func FuzzValidateRequest(f *testing.F) {
	f.Add("jobs/nightly", "req-1", "meta", 1, int64(0))
	f.Add("", "", "", 0, int64(-1))
	f.Add("a b", "x/y", "\xff", 5000, int64(time.Hour))
	f.Add("pct%2F", "r", "m", 3, int64(time.Second))
	f.Fuzz(func(t *testing.T, name, requestID, metadata string, limit int, delay int64) {
		req := Request{Name: name, Session: 1, Limit: limit, RequestID: requestID, Metadata: metadata, LockDelay: time.Duration(delay)}
		err := validateRequest(&req)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps neither ErrInvalid nor ErrTooLarge", err)
			}
			return
		}
		if req.Limit < 1 || req.Limit > MaxLimit || req.RequestID == "" || len(req.RequestID) > MaxRequestIDBytes ||
			strings.Contains(req.RequestID, "/") || len(req.Metadata) > MaxMetadataBytes || req.LockDelay < 0 || req.LockDelay > MaxLockDelay {
			t.Fatalf("accepted out-of-limit request %+v", req)
		}
		esc := escape(req.Name)
		if strings.Contains(esc, "/") || unescape(esc) != req.Name {
			t.Fatalf("escape(%q) = %q does not round-trip to one path segment", req.Name, esc)
		}
	})
}
