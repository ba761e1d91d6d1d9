package clientlib

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Sentinel errors for the server's reasons. Errors returned by the SDK match
// them with errors.Is; the server's ErrorInfo reason (the proto enum
// coordd.v1.ErrorReason) decides which one. Each sentinel is declared by its
// enum value, so no reason string is typed twice.
var (
	// ErrInvalidArgument: the request was malformed or out of bounds; nothing changed.
	ErrInvalidArgument = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, "invalid argument")
	// ErrValueTooLarge: a value exceeded its size limit; nothing changed.
	ErrValueTooLarge = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_VALUE_TOO_LARGE, "value too large")
	// ErrRequestTooLarge: the whole request exceeded the daemon's size limit.
	ErrRequestTooLarge = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_REQUEST_TOO_LARGE, "request too large")
	// ErrSessionNotFound: the session does not exist (never created, closed or expired).
	ErrSessionNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session not found")
	// ErrKeyNotFound: the key does not exist.
	ErrKeyNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_KEY_NOT_FOUND, "key not found")
	// ErrNoLeader: the election has no leader.
	ErrNoLeader = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_NO_LEADER, "no leader")
	// ErrLockHeld: a try-lock found the lock held by another session.
	ErrLockHeld = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_LOCK_HELD, "lock held")
	// ErrStaleToken: the fencing token is no longer current.
	ErrStaleToken = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_STALE_TOKEN, "stale fencing token")
	// ErrNotHolder: the caller does not hold the lock.
	ErrNotHolder = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_NOT_HOLDER, "not the lock holder")
	// ErrNotLeader: the caller is not the leader.
	ErrNotLeader = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_NOT_LEADER, "not the leader")
	// ErrRevisionMismatch: a compare-and-set found another revision.
	ErrRevisionMismatch = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_REVISION_MISMATCH, "revision mismatch")
	// ErrCompacted: the requested revision was compacted away.
	ErrCompacted = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_COMPACTED, "revision compacted")
	// ErrUnavailable: no coordd endpoint or no etcd quorum could serve the
	// call. A call that changes state may or may not have taken effect.
	ErrUnavailable = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE, "unavailable")
	// ErrInternal: the daemon failed unexpectedly and logged the details.
	ErrInternal = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_INTERNAL, "internal error")
	// ErrLimitMismatch: the lock allows another number of holders than asked.
	ErrLimitMismatch = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH, "lock limit mismatch")
	// ErrAlreadyLeader: Campaign by a session that already leads the
	// election under another campaign id.
	ErrAlreadyLeader = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_ALREADY_LEADER, "this session already leads the election")
	// ErrValidationFailed: a config write breaks the namespace's JSON
	// Schema; Problems lists every problem.
	ErrValidationFailed = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_VALIDATION_FAILED, "config validation failed")
	// ErrReleaseNotFound: the config release does not exist or is older
	// than the history kept.
	ErrReleaseNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_RELEASE_NOT_FOUND, "release not found")
	// ErrDeadlineExceeded: the server ran out of time first (a REST-style
	// wait, or the deadline it was sent); such an error also matches
	// context.DeadlineExceeded.
	ErrDeadlineExceeded = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED, "deadline exceeded")
	// ErrNoSpace: coordd's etcd database is full (its NOSPACE alarm).
	// Writes that add data (new sessions, locks, campaigns, publishes)
	// fail until an operator makes room; reads, releases, resignations
	// and session closes still work. Retrying at once does not help.
	ErrNoSpace = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_NO_SPACE, "database full")
	// ErrMemberNotFound: no etcd member has the given name or id.
	ErrMemberNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_MEMBER_NOT_FOUND, "member not found")
	// ErrMemberChangeRefused: a membership change was refused and nothing
	// changed (the last voting member, the leader while a learner is
	// unpromoted, a lost quorum, a learner not caught up yet); the message
	// says which.
	ErrMemberChangeRefused = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_MEMBER_CHANGE_REFUSED, "member change refused")
	// ErrUnauthenticated: coordd requires an identity (a client
	// certificate or a bearer token) and the call had none, or an unknown
	// token.
	ErrUnauthenticated = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "unauthenticated")
	// ErrPermissionDenied: the caller's principal may not do this (the
	// policy, or another principal's session or grant); the message says
	// which rule is missing.
	ErrPermissionDenied = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, "permission denied")
	// ErrRateLimited: the caller's principal, or the config namespace, is
	// over its rate limit; nothing changed. The message says when to retry.
	ErrRateLimited = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_RATE_LIMITED, "rate limited")
	// ErrQuotaExceeded: the caller's principal holds as many live
	// sessions, or has as many acquisitions and campaigns waiting, as the
	// daemon allows; nothing changed. Close sessions or let waits end.
	ErrQuotaExceeded = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED, "quota exceeded")
	// ErrCancelled: the call was cancelled before coordd answered it, by
	// the caller (over REST, the connection closed) or by the daemon
	// stopping. A call that changes state may or may not have taken effect.
	ErrCancelled = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_CANCELLED, "cancelled")
	// ErrUnknownRoute: a REST request named no route coordd serves (a
	// wrong path or method). Go callers meet it only through a proxy.
	ErrUnknownRoute = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_UNKNOWN_ROUTE, "unknown route")
	// ErrUnimplemented: the daemon does not serve this call (an older
	// daemon, or one started without the feature).
	ErrUnimplemented = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_UNIMPLEMENTED, "not implemented by this daemon")
	// ErrSecretsUnavailable: the member cannot seal or open a secret
	// config value (it has no --secret-key-file, or not the key that
	// wrapped the namespace's data key); nothing changed.
	ErrSecretsUnavailable = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_SECRETS_UNAVAILABLE, "secrets unavailable")
	// ErrApprovalRequired: the namespace changes only by approved
	// proposals (ConfigCenter.Propose); nothing changed.
	ErrApprovalRequired = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_APPROVAL_REQUIRED, "approval required")
	// ErrProposalNotFound: no such proposal (the last 100 are kept).
	ErrProposalNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_PROPOSAL_NOT_FOUND, "proposal not found")
	// ErrProposalClosed: the proposal was approved, rejected or withdrawn,
	// or expired; nothing changed.
	ErrProposalClosed = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_PROPOSAL_CLOSED, "proposal closed")
	// ErrCandidateNotFound: a leadership's hand-over named a session with
	// no campaign waiting in the election.
	ErrCandidateNotFound = reasonSentinel(coorddv1.ErrorReason_ERROR_REASON_CANDIDATE_NOT_FOUND, "candidate not found")
)

// Sentinel errors the SDK raises itself, without a server reason.
var (
	// ErrSessionExpired: the session's local deadline passed before a
	// keep-alive was acknowledged. The server may still hold the session
	// for the rest of its TTL.
	ErrSessionExpired = errors.New("coordd: session expired: no keep-alive acknowledged before the local deadline")
	// ErrSessionClosed: the session was closed with Close, or its Client was closed.
	ErrSessionClosed = errors.New("coordd: session closed")
	// ErrSecretHidden: Get read a secret without revealing secrets (see
	// ConfigCenter.RevealSecrets).
	ErrSecretHidden = errors.New("coordd: the key is a secret; read it with ConfigCenter().RevealSecrets(), which needs config.read-secret")
)

// reasonError is the sentinel of one server reason.
type reasonError struct {
	reason string // the ErrorInfo reason: the enum value's name without ERROR_REASON_
	msg    string
}

func (e *reasonError) Error() string { return "coordd: " + e.msg }

// reasonSentinels lists every reason sentinel; a test checks that each
// value of the proto enum has one.
var reasonSentinels []*reasonError

func reasonSentinel(r coorddv1.ErrorReason, msg string) error {
	e := &reasonError{reason: strings.TrimPrefix(r.String(), "ERROR_REASON_"), msg: msg}
	reasonSentinels = append(reasonSentinels, e)
	return e
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

func (e *Error) Error() string {
	if strings.HasPrefix(e.Message, "coordd: ") {
		return e.Message // the server named itself already
	}
	return "coordd: " + e.Message
}

// Is reports whether target is the sentinel of e's reason (or of its code,
// for errors without a reason); a DeadlineExceeded error also matches
// context.DeadlineExceeded.
func (e *Error) Is(target error) bool {
	if target == context.DeadlineExceeded && e.Code == codes.DeadlineExceeded {
		return true
	}
	for _, r := range reasonSentinels {
		if r.reason == e.Reason {
			return target == r
		}
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
