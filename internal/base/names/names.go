// Package names validates and escapes the names of locks, elections and
// config namespaces, config keys and request ids, so all keep one set of
// rules.
//
// A name (Check) is 1 to MaxName bytes: segments of ASCII letters, digits
// and . _ : @ - joined by single slashes, such as "payments/prod". No
// segment is empty, "." or "..", so a name never starts or ends with a
// slash and reads the same in a URL path (/v1/locks/{name}) as in a request
// body: nothing a client or proxy normalises. A config key (CheckKey) takes
// the same characters without the segment rule.
//
// Escape maps a name to one etcd key segment ("/" becomes "%2F"), so "a"
// and "a/b" never share a subtree. "%" is not allowed, which keeps Escape
// reversible.
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

// Check validates the name of a lock, an election or a namespace; what
// names it in the error ("lock name"). Callers wrap the error in their own
// package's sentinel.
func Check(what, name string) error {
	if err := CheckKey(what, name); err != nil {
		return err
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf(`%s %q must be segments joined by single slashes, such as "payments/prod": no empty, "." or ".." segment, no slash at the start or end`, what, name)
		}
	}
	return nil
}

// CheckKey validates a config key: 1 to MaxName bytes of ASCII letters,
// digits and . _ : @ / -.
func CheckKey(what, key string) error {
	if key == "" {
		return fmt.Errorf("%s is required", what)
	}
	if len(key) > MaxName {
		return fmt.Errorf("%s is %d bytes, at most %d are allowed", what, len(key), MaxName)
	}
	for i := 0; i < len(key); i++ {
		if !nameByte(key[i]) {
			return fmt.Errorf("%s %q may contain only ASCII letters, digits and . _ : @ / -", what, key)
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
			return fmt.Errorf("request id %q may contain only ASCII letters, digits and . _ : @ -", id)
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
