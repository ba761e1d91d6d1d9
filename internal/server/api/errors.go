package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/internal/base/errkind"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ErrStopping is returned to callers whose call or stream is ended because
// the daemon is shutting down. Clients retry on another member.
var ErrStopping = errkind.Unavailable.New("coordd: daemon is stopping; retry on another member")

// ErrNoQuorum is returned to callers whose call is ended because this
// member cannot commit: its etcd has had no leader, or could not confirm a
// read through its leader, for too long (it is cut off from its peers).
// Clients retry on another member.
var ErrNoQuorum = errkind.Unavailable.New("coordd: this member cannot commit (no etcd leader, or cut off from a quorum of its peers); retry on another member")

// ErrLeaderChanged is returned to callers whose request to etcd was in
// flight when this member's etcd leader changed: a request forwarded to a
// leader that died would otherwise wait for etcd's request timeout. The
// request may or may not have taken effect; clients retry.
var ErrLeaderChanged = errkind.Unavailable.New("coordd: etcd's leader changed while the request was in flight; retry")

// Domain is the ErrorInfo domain of every coordd error.
const Domain = "coordd"

// errorTable is the only place where classes of failure become gRPC codes
// and ErrorInfo reasons. Domain sentinels carry their kind (package errkind);
// the first row whose kind the error matches (errors.Is) wins.
var errorTable = []struct {
	kind   *errkind.Kind
	code   codes.Code
	reason coorddv1.ErrorReason
}{
	{errkind.Invalid, codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
	{errkind.TooLarge, codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_VALUE_TOO_LARGE},
	{errkind.ValidationFailed, codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_VALIDATION_FAILED},
	{errkind.SessionNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND},
	{errkind.KeyNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_KEY_NOT_FOUND},
	{errkind.ReleaseNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_RELEASE_NOT_FOUND},
	{errkind.NoLeader, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_NO_LEADER},
	{errkind.Held, codes.Aborted, coorddv1.ErrorReason_ERROR_REASON_LOCK_HELD},
	{errkind.StaleToken, codes.Aborted, coorddv1.ErrorReason_ERROR_REASON_STALE_TOKEN},
	{errkind.NotHolder, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_NOT_HOLDER},
	{errkind.NotLeader, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_NOT_LEADER},
	{errkind.LimitMismatch, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH},
	{errkind.SecretsUnavailable, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_SECRETS_UNAVAILABLE},
	{errkind.ApprovalRequired, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_APPROVAL_REQUIRED},
	{errkind.ProposalNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_PROPOSAL_NOT_FOUND},
	{errkind.ProposalClosed, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_PROPOSAL_CLOSED},
	{errkind.CandidateNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_CANDIDATE_NOT_FOUND},
	{errkind.AlreadyLeader, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_ALREADY_LEADER},
	{errkind.RevisionMismatch, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_REVISION_MISMATCH},
	{errkind.Compacted, codes.OutOfRange, coorddv1.ErrorReason_ERROR_REASON_COMPACTED},
	{errkind.Unavailable, codes.Unavailable, coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE},
	{errkind.MemberNotFound, codes.NotFound, coorddv1.ErrorReason_ERROR_REASON_MEMBER_NOT_FOUND},
	{errkind.MemberChangeRefused, codes.FailedPrecondition, coorddv1.ErrorReason_ERROR_REASON_MEMBER_CHANGE_REFUSED},
	{errkind.Unauthenticated, codes.Unauthenticated, coorddv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED},
	{errkind.PermissionDenied, codes.PermissionDenied, coorddv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED},
	{errkind.RateLimited, codes.ResourceExhausted, coorddv1.ErrorReason_ERROR_REASON_RATE_LIMITED},
	{errkind.QuotaExceeded, codes.ResourceExhausted, coorddv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED},
}

// codeReasons are the reasons REST bodies give statuses that carry no coordd
// ErrorInfo: those raised before coordd saw the call (the transport's, a
// caller's cancel). The gateway's own routing errors give UNKNOWN_ROUTE.
var codeReasons = map[codes.Code]coorddv1.ErrorReason{
	codes.Canceled:          coorddv1.ErrorReason_ERROR_REASON_CANCELLED,
	codes.InvalidArgument:   coorddv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT,
	codes.DeadlineExceeded:  coorddv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED,
	codes.ResourceExhausted: coorddv1.ErrorReason_ERROR_REASON_REQUEST_TOO_LARGE, // gRPC's message size limit
	codes.Unimplemented:     coorddv1.ErrorReason_ERROR_REASON_UNIMPLEMENTED,
	codes.Unavailable:       coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE,
	codes.Unauthenticated:   coorddv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED,
	codes.PermissionDenied:  coorddv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED,
}

// Reason is st's coordd reason: its ErrorInfo's, or else the one its code
// stands for (codeReasons), or INTERNAL.
func Reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == Domain {
			return info.Reason
		}
	}
	if r, ok := codeReasons[st.Code()]; ok {
		return ReasonString(r)
	}
	return ReasonString(coorddv1.ErrorReason_ERROR_REASON_INTERNAL)
}

// ReasonString returns the ErrorInfo reason for r: its name without the
// ERROR_REASON_ prefix.
func ReasonString(r coorddv1.ErrorReason) string {
	const prefix = "ERROR_REASON_"
	return r.String()[len(prefix):]
}

// NewStatus returns a status with an ErrorInfo detail carrying reason.
func NewStatus(code codes.Code, reason coorddv1.ErrorReason, msg string) *status.Status {
	st := status.New(code, msg)
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonString(reason), Domain: Domain}); err == nil {
		return withInfo
	}
	return st
}

// ToStatus maps err to the status the caller sees. internal reports that the
// error was unexpected: the caller sees a generic message and the daemon
// must log err.
//
// Order: context errors first (a cancel passes through untouched; a
// deadline, the caller's own or a wait's, gets the DEADLINE_EXCEEDED
// reason); then the domain table; a status that already carries a coordd
// ErrorInfo is kept, as are CANCELLED and UNIMPLEMENTED; etcd's
// availability and capacity errors become Unavailable with a fixed message
// (the detail is only logged); anything else is Internal.
func ToStatus(err error) (st *status.Status, internal bool) {
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, err.Error()), false
	case errors.Is(err, context.DeadlineExceeded):
		msg := err.Error()
		if msg == context.DeadlineExceeded.Error() {
			msg = "deadline exceeded: the request's wait or the caller's deadline ran out before it completed"
		}
		return NewStatus(codes.DeadlineExceeded, coorddv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED, msg), false
	}
	for _, row := range errorTable {
		if errors.Is(err, row.kind) {
			return withRetryInfo(withFieldViolations(NewStatus(row.code, row.reason, err.Error()), err), err), false
		}
	}
	if s, ok := status.FromError(err); ok {
		for _, d := range s.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == Domain {
				return s, false // already mapped by an adapter
			}
		}
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			// etcd: no leader, no quorum, request timed out, member stopping.
			// The detail (which may name etcd's addresses) is only logged.
			return errEtcdUnavailable(), false
		case codes.ResourceExhausted:
			// etcd: database space exceeded, or too many requests in flight.
			if isNoSpace(s.Message()) {
				return errNoSpace(), false
			}
			return errEtcdOverloaded(), false
		case codes.FailedPrecondition:
			if strings.Contains(s.Message(), "not supported for learner") {
				return errLearner(), false
			}
		case codes.Unknown:
			// etcd's raft stopped under a request (the member is going
			// down), or dropped its proposal (the leader is handing its
			// leadership over, as a leader stopped gracefully does, or
			// there is none); etcd's error table maps neither, so they
			// arrive as Unknown with raft's message, possibly inside a
			// longer one (a set's acquisition that also failed to give
			// back the locks it took).
			if strings.Contains(s.Message(), raftStopped) || strings.Contains(s.Message(), raftProposalDropped) {
				return errEtcdUnavailable(), false
			}
		case codes.Canceled, codes.Unimplemented:
			// Unimplemented: a part this server does not serve (gRPC says
			// the same of a method it does not know).
			return s, false
		}
	}
	// etcd client errors that are not status errors but carry a code.
	var coded interface{ Code() codes.Code }
	if errors.As(err, &coded) && coded.Code() == codes.Unavailable {
		return errEtcdUnavailable(), false
	}
	if errors.As(err, &coded) && coded.Code() == codes.ResourceExhausted {
		if isNoSpace(err.Error()) {
			return errNoSpace(), false
		}
		return errEtcdOverloaded(), false
	}
	return errInternal(), true
}

// raftStopped is raft.ErrStopped's message: the same in every etcd release
// since v3.0.
const raftStopped = "raft: stopped"

// raftProposalDropped is raft.ErrProposalDropped's message, the same
// since etcd v3.3.
const raftProposalDropped = "raft proposal dropped"

// errEtcdOverloaded: etcd refused a request because too many are in
// flight (its applied index trails its committed one); a retry after a
// pause goes through.
func errEtcdOverloaded() *status.Status {
	return NewStatus(codes.Unavailable, coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE, "etcd is overloaded; retry later")
}

// withRetryInfo adds a google.rpc.RetryInfo detail to the status of an
// error that says when to retry (a rate limit's).
func withRetryInfo(st *status.Status, err error) *status.Status {
	var r interface{ RetryDelay() time.Duration }
	if !errors.As(err, &r) {
		return st
	}
	if with, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryDelay())}); err == nil {
		return with
	}
	return st
}

// withFieldViolations adds a google.rpc.BadRequest detail listing every
// problem of an error that carries several (a config release that fails
// validation), so clients can show them all at once.
func withFieldViolations(st *status.Status, err error) *status.Status {
	var fv interface{ FieldViolations() [][2]string }
	if !errors.As(err, &fv) {
		return st
	}
	br := &errdetails.BadRequest{}
	for _, v := range fv.FieldViolations() {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v[0], Description: v[1]})
	}
	if withBR, err := st.WithDetails(br); err == nil {
		return withBR
	}
	return st
}

// isNoSpace reports etcd's "database space exceeded" (its NOSPACE alarm),
// by etcd's message: the same on every etcd release since v3.0.
func isNoSpace(msg string) bool { return strings.Contains(msg, "database space exceeded") }

func errNoSpace() *status.Status {
	return NewStatus(codes.ResourceExhausted, coorddv1.ErrorReason_ERROR_REASON_NO_SPACE,
		"coordd's etcd database is full: it reached its quota (--quota-backend-bytes) and etcd raised the NOSPACE alarm. "+
			"Reads, releases, resignations and session closes still work; writes that add data fail until an operator makes room: "+
			"wait for compaction (or run it), defragment every member (coordctl cluster defrag), then clear the alarm (coordctl cluster alarms --disarm)")
}

// errLearner: this member's etcd is a learner (added, not yet promoted),
// which serves no client requests. Clients move to another member.
func errLearner() *status.Status {
	return NewStatus(codes.Unavailable, coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE,
		"this member is a learner (added but not yet promoted: coordctl member promote NAME) and serves no requests; retry on another member")
}

func errEtcdUnavailable() *status.Status {
	return NewStatus(codes.Unavailable, coorddv1.ErrorReason_ERROR_REASON_UNAVAILABLE,
		"etcd is unavailable (no leader, no quorum, or a timeout); retry, possibly on another member")
}

// HTTPStatus is the HTTP status the REST gateway sends for st. It follows
// grpc-gateway's mapping, except that a compacted watch revision is 410 Gone
// and a full database 507 Insufficient Storage.
func HTTPStatus(st *status.Status, fallback func(codes.Code) int) int {
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.Domain != Domain {
			continue
		}
		switch {
		case st.Code() == codes.OutOfRange && info.Reason == ReasonString(coorddv1.ErrorReason_ERROR_REASON_COMPACTED):
			return http.StatusGone
		case st.Code() == codes.ResourceExhausted && info.Reason == ReasonString(coorddv1.ErrorReason_ERROR_REASON_NO_SPACE):
			return http.StatusInsufficientStorage
		}
	}
	return fallback(st.Code())
}
