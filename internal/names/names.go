// Package names validates and escapes the names of locks and elections and
// the request ids of their callers, so both keep one set of rules.
//
// A name is 1 to MaxName bytes of [A-Za-z0-9._:@/-]. Escape maps it to one
// etcd key segment ("/" becomes "%2F"), so "a" and "a/b" never share a
// subtree. "%" is not allowed in names, which keeps Escape reversible.
package names

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Limits.
const (
	MaxName      = 256
	MaxRequestID = 64
)

// Check validates a name; what names it in the error ("lock name"). Callers
// wrap the error in their own package's sentinel.
func Check(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is required", what)
	}
	if len(name) > MaxName {
		return fmt.Errorf("%s is %d bytes, at most %d are allowed", what, len(name), MaxName)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%s %q may contain only letters, digits and . _ : @ / -", what, name)
		}
	}
	return nil
}

// CheckRequestID validates a request id: 1 to MaxRequestID bytes of
// [A-Za-z0-9._:@-] (no "/": it is one key segment).
func CheckRequestID(id string) error {
	if id == "" {
		return errors.New("request id is required")
	}
	if len(id) > MaxRequestID {
		return fmt.Errorf("request id is %d bytes, at most %d are allowed", len(id), MaxRequestID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !nameByte(c) || c == '/' {
			return fmt.Errorf("request id %q may contain only letters, digits and . _ : @ -", id)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '@' || c == '/' || c == '-'
}

// Escape maps a valid name to one key segment.
func Escape(name string) string { return strings.ReplaceAll(name, "/", "%2F") }

// Unescape reverses Escape.
func Unescape(seg string) string { return strings.ReplaceAll(seg, "%2F", "/") }

// NewRequestID returns a random request id (16 hex digits).
func NewRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
