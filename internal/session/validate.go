package session

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Metadata limits. They keep one session's metadata well under 16 KiB.
const (
	MaxOwnerBytes      = 256
	MaxHostnameBytes   = 255
	MaxLabels          = 32
	MaxLabelKeyBytes   = 63
	MaxLabelValueBytes = 256
)

// ValidateSpec checks spec against the documented limits and returns the TTL
// that will be granted: spec.TTL rounded up to a whole second. Errors wrap
// ErrInvalid or ErrTooLarge and name the offending field.
func ValidateSpec(spec Spec) (time.Duration, error) {
	if spec.TTL <= 0 {
		return 0, fmt.Errorf("%w: ttl is required and must be positive (between %s and %s)", ErrInvalid, MinTTL, MaxTTL)
	}
	if spec.TTL < MinTTL || spec.TTL > MaxTTL {
		return 0, fmt.Errorf("%w: ttl %s is outside %s..%s", ErrInvalid, spec.TTL, MinTTL, MaxTTL)
	}
	ttl := (spec.TTL + time.Second - 1).Truncate(time.Second)
	if err := checkText("owner", spec.Owner, MaxOwnerBytes); err != nil {
		return 0, err
	}
	if err := checkText("hostname", spec.Hostname, MaxHostnameBytes); err != nil {
		return 0, err
	}
	if len(spec.Labels) > MaxLabels {
		return 0, fmt.Errorf("%w: %d labels, at most %d are allowed", ErrTooLarge, len(spec.Labels), MaxLabels)
	}
	for k, v := range spec.Labels {
		if err := checkLabelKey(k); err != nil {
			return 0, err
		}
		if err := checkText(fmt.Sprintf("label %q", k), v, MaxLabelValueBytes); err != nil {
			return 0, err
		}
	}
	return ttl, nil
}

func checkText(field, s string, maxBytes int) error {
	if len(s) > maxBytes {
		return fmt.Errorf("%w: %s is %d bytes, at most %d are allowed", ErrTooLarge, field, len(s), maxBytes)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s contains a control character", ErrInvalid, field)
		}
	}
	return nil
}

func checkLabelKey(k string) error {
	if k == "" {
		return fmt.Errorf("%w: label keys must not be empty", ErrInvalid)
	}
	if len(k) > MaxLabelKeyBytes {
		return fmt.Errorf("%w: label key %.70q is %d bytes, at most %d are allowed", ErrTooLarge, k, len(k), MaxLabelKeyBytes)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/'
		if !ok {
			return fmt.Errorf("%w: label key %q may contain only letters, digits and . _ - /", ErrInvalid, k)
		}
	}
	return nil
}
