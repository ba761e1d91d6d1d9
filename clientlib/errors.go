package clientlib

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Errors returned by the SDK match them with errors.Is; the
// server's reason (google.rpc.ErrorInfo) decides which one.
var (
	// ErrInvalidArgument: the request was malformed or out of bounds; nothing changed.
	ErrInvalidArgument = errors.New("coordd: invalid argument")
	// ErrValueTooLarge: a value exceeded its size limit; nothing changed.
	ErrValueTooLarge = errors.New("coordd: value too large")
	// ErrRequestTooLarge: the whole request exceeded the daemon's size limit.
	ErrRequestTooLarge = errors.New("coordd: request too large")
	// ErrSessionNotFound: the session does not exist (never created, closed or expired).
	ErrSessionNotFound = errors.New("coordd: session not found")
	// ErrKeyNotFound: the key does not exist.
	ErrKeyNotFound = errors.New("coordd: key not found")
	// ErrNoLeader: the election has no leader.
	ErrNoLeader = errors.New("coordd: no leader")
	// ErrLockHeld: a try-lock found the lock held by another session.
	ErrLockHeld = errors.New("coordd: lock held")
	// ErrStaleToken: the fencing token is no longer current.
	ErrStaleToken = errors.New("coordd: stale fencing token")
	// ErrNotHolder: the caller does not hold the lock.
	ErrNotHolder = errors.New("coordd: not the lock holder")
	// ErrNotLeader: the caller is not the leader.
	ErrNotLeader = errors.New("coordd: not the leader")
	// ErrRevisionMismatch: a compare-and-set found another revision.
	ErrRevisionMismatch = errors.New("coordd: revision mismatch")
	// ErrLimitMismatch: the lock allows another number of holders than asked.
	ErrLimitMismatch = errors.New("coordd: lock limit mismatch")
	// ErrAlreadyLeader: Campaign by a session that already leads the
	// election under another campaign id.
	ErrAlreadyLeader = errors.New("coordd: this session already leads the election")
	// ErrValidationFailed: a config write breaks the namespace's JSON
	// Schema; Problems lists every problem.
	ErrValidationFailed = errors.New("coordd: config validation failed")
	// ErrReleaseNotFound: the config release does not exist or is older
	// than the history kept.
	ErrReleaseNotFound = errors.New("coordd: release not found")
	// ErrCompacted: the requested revision was compacted away.
	ErrCompacted = errors.New("coordd: revision compacted")
	// ErrUnavailable: no coordd endpoint or no etcd quorum could serve the
	// call. A call that changes state may or may not have taken effect.
	ErrUnavailable = errors.New("coordd: unavailable")
	// ErrInternal: the daemon failed unexpectedly and logged the details.
	ErrInternal = errors.New("coordd: internal error")

	// ErrSessionExpired: the session's local deadline passed before a
	// keep-alive was acknowledged. The server may still hold the session
	// for the rest of its TTL.
	ErrSessionExpired = errors.New("coordd: session expired: no keep-alive acknowledged before the local deadline")
	// ErrSessionClosed: the session was closed with Close, or its Client was closed.
	ErrSessionClosed = errors.New("coordd: session closed")
)

var reasons = map[string]error{
	"INVALID_ARGUMENT":  ErrInvalidArgument,
	"VALUE_TOO_LARGE":   ErrValueTooLarge,
	"REQUEST_TOO_LARGE": ErrRequestTooLarge,
	"SESSION_NOT_FOUND": ErrSessionNotFound,
	"KEY_NOT_FOUND":     ErrKeyNotFound,
	"NO_LEADER":         ErrNoLeader,
	"LOCK_HELD":         ErrLockHeld,
	"STALE_TOKEN":       ErrStaleToken,
	"NOT_HOLDER":        ErrNotHolder,
	"NOT_LEADER":        ErrNotLeader,
	"REVISION_MISMATCH": ErrRevisionMismatch,
	"COMPACTED":         ErrCompacted,
	"LIMIT_MISMATCH":    ErrLimitMismatch,
	"ALREADY_LEADER":    ErrAlreadyLeader,
	"VALIDATION_FAILED": ErrValidationFailed,
	"RELEASE_NOT_FOUND": ErrReleaseNotFound,
	"UNAVAILABLE":       ErrUnavailable,
	"INTERNAL":          ErrInternal,
}

// Error is an error returned by the coordd server. It matches the sentinel
// of its Reason with errors.Is.
type Error struct {
	Code    codes.Code // gRPC status code
	Reason  string     // ErrorInfo reason, e.g. "SESSION_NOT_FOUND"; empty if the server sent none
	Message string     // the server's message
	// Problems lists every problem of a refused config write (key and
	// description; the key is empty for the write as a whole).
	Problems []Problem
}

// Problem is one problem of a refused write.
type Problem struct {
	Key         string
	Description string
}

func (e *Error) Error() string { return "coordd: " + e.Message }

// Is reports whether target is the sentinel of e's reason (or of its code,
// for errors without a reason).
func (e *Error) Is(target error) bool {
	if s, ok := reasons[e.Reason]; ok {
		return s == target
	}
	switch e.Code {
	case codes.Unavailable:
		return target == ErrUnavailable
	case codes.InvalidArgument:
		return target == ErrInvalidArgument
	case codes.ResourceExhausted:
		return target == ErrRequestTooLarge
	}
	return false
}

// GRPCStatus lets status.FromError see the original status.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// convert turns a gRPC error into an *Error, or into ctx's own error when
// the caller's context ended the call.
func convert(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
		if err := ctx.Err(); err != nil {
			return err
		}
		// The server may notice the caller's deadline first: it ends the
		// stream (RST_STREAM CANCEL) before the caller's own timer has
		// fired on a busy machine. A deadline is a deadline whichever side
		// sees it first.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
	}
	e := &Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.Domain == "coordd" {
				e.Reason = d.Reason
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Problems = append(e.Problems, Problem{Key: v.GetField(), Description: v.GetDescription()})
			}
		}
	}
	return e
}
