package lock

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// validateName accepts 1 to MaxNameBytes of [A-Za-z0-9._:@/-]. "%" is not
// allowed, which keeps escape unambiguous.
func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: lock name is required", ErrInvalid)
	}
	if len(name) > MaxNameBytes {
		return fmt.Errorf("%w: lock name is %d bytes, at most %d are allowed", ErrInvalid, len(name), MaxNameBytes)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%w: lock name %q may contain only letters, digits and . _ : @ / -", ErrInvalid, name)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '@' || c == '/' || c == '-'
}

func validateRequest(req *Request) error {
	if err := validateName(req.Name); err != nil {
		return err
	}
	if req.Session <= 0 {
		return fmt.Errorf("%w: session is required", ErrInvalid)
	}
	if req.Limit == 0 {
		req.Limit = 1
	}
	if req.Limit < 0 || req.Limit > MaxLimit {
		return fmt.Errorf("%w: limit %d is outside 1..%d", ErrInvalid, req.Limit, MaxLimit)
	}
	if req.RequestID == "" {
		req.RequestID = newRequestID()
	}
	if err := validateRequestID(req.RequestID); err != nil {
		return err
	}
	if req.LockDelay < 0 || req.LockDelay > MaxLockDelay {
		return fmt.Errorf("%w: lock delay %s is outside 0..%s", ErrInvalid, req.LockDelay, MaxLockDelay)
	}
	if len(req.Metadata) > MaxMetadataBytes {
		return fmt.Errorf("%w: metadata is %d bytes, at most %d are allowed", ErrTooLarge, len(req.Metadata), MaxMetadataBytes)
	}
	if !utf8.ValidString(req.Metadata) {
		return fmt.Errorf("%w: metadata is not valid UTF-8", ErrInvalid)
	}
	return nil
}

func validateRequestID(id string) error {
	if len(id) > MaxRequestIDBytes {
		return fmt.Errorf("%w: request id is %d bytes, at most %d are allowed", ErrInvalid, len(id), MaxRequestIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !nameByte(c) || c == '/' {
			return fmt.Errorf("%w: request id %q may contain only letters, digits and . _ : @ -", ErrInvalid, id)
		}
	}
	return nil
}

// validateKey accepts 1 to MaxKeyBytes of UTF-8 without control characters.
func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is required", ErrInvalid)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: key is %d bytes, at most %d are allowed", ErrInvalid, len(key), MaxKeyBytes)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: key is not valid UTF-8", ErrInvalid)
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: key contains a control character", ErrInvalid)
		}
	}
	return nil
}

// escape maps a lock name to one path segment: "/" becomes "%2F", so lock
// "a" (subtree "a/") and lock "a/b" (subtree "a%2Fb/") never overlap.
func escape(name string) string { return strings.ReplaceAll(name, "/", "%2F") }

func unescape(seg string) string { return strings.ReplaceAll(seg, "%2F", "/") }
