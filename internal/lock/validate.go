package lock

import (
	"fmt"
	"unicode/utf8"

	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/kv"
)

func validateName(name string) error {
	if err := names.Check("lock name", name); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
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
	if req.Read && req.Limit != 1 {
		return fmt.Errorf("%w: read grants are for locks of limit 1 (a read/write lock), not semaphores (limit %d)", ErrInvalid, req.Limit)
	}
	if req.RequestID == "" {
		req.RequestID = names.NewRequestID()
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
	if err := names.CheckRequestID(id); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
}

// validateKey accepts 1 to MaxKeyBytes of UTF-8 without control characters.
func validateKey(key string) error {
	if err := kv.CheckKey(key); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
}

func escape(name string) string { return names.Escape(name) }

func unescape(seg string) string { return names.Unescape(seg) }
