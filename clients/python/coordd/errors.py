"""The client's exceptions: one hierarchy, rooted at :class:`CoorddError`.

Every error coordd returns carries a machine-readable reason (a
``google.rpc.ErrorInfo`` detail with domain ``"coordd"``, in the gRPC
status details). :func:`from_rpc_error` turns a failed call into the
subclass of that reason; branch on the class (or on ``.reason``), never on
the message. The reasons are the values of ``coordd.v1.ErrorReason``
(errors.proto) without their ``ERROR_REASON_`` prefix; a test checks that
every value has its class here.

A few exceptions are the client's own and carry no server reason
(``reason`` is the empty string, ``code`` is None): :class:`SessionExpired`,
:class:`SessionClosed`, :class:`LockLost`, :class:`LeadershipLost` and
:class:`ClientClosed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from coordd.rpc import status_pb2

__all__ = [
    "CoorddError",
    "InvalidArgument",
    "ValueTooLarge",
    "RequestTooLarge",
    "SessionNotFound",
    "KeyNotFound",
    "NoLeader",
    "LockHeld",
    "StaleToken",
    "NotHolder",
    "NotLeader",
    "RevisionMismatch",
    "Compacted",
    "Unavailable",
    "Internal",
    "LimitMismatch",
    "AlreadyLeader",
    "ValidationFailed",
    "ReleaseNotFound",
    "DeadlineExceeded",
    "NoSpace",
    "MemberNotFound",
    "MemberChangeRefused",
    "Unauthenticated",
    "PermissionDenied",
    "RateLimited",
    "QuotaExceeded",
    "Cancelled",
    "UnknownRoute",
    "Unimplemented",
    "SecretsUnavailable",
    "ApprovalRequired",
    "ProposalNotFound",
    "ProposalClosed",
    "CandidateNotFound",
    "SessionEnded",
    "SessionExpired",
    "SessionClosed",
    "LockLost",
    "LeadershipLost",
    "ClientClosed",
    "REASONS",
    "from_rpc_error",
]

DOMAIN = "coordd"
_TYPE_PREFIX = "type.googleapis.com/"


@dataclass(frozen=True)
class Problem:
    """One problem of a refused write (a google.rpc.BadRequest field
    violation): the key (empty for the write as a whole) and what is wrong."""

    key: str
    description: str


class CoorddError(Exception):
    """Base of every error the client raises.

    Attributes:
        reason: the server's ErrorInfo reason, e.g. ``"LOCK_HELD"``. When the
            server sent none (a transport error, the client's own deadline),
            the reason of the class the status code maps to (``"UNAVAILABLE"``,
            ``"DEADLINE_EXCEEDED"``, ...); empty for a plain CoorddError and
            for the client's own errors.
        code: the gRPC status code, or None for client-side errors.
        message: the server's (or the client's) message.
        problems: for a refused config write, every problem found.
        retry_after: seconds to wait before retrying, when the server said
            (google.rpc.RetryInfo, sent with RATE_LIMITED); else None.
    """

    REASON: str = ""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        code: grpc.StatusCode | None = None,
        problems: tuple[Problem, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.REASON
        self.code = code
        self.problems = problems
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"coordd: {self.message}" if self.message else f"coordd: {self.reason or type(self).__name__}"


# --- Errors with a server reason (errors.proto), in enum order. ---


class InvalidArgument(CoorddError):
    """A field is missing, malformed or out of bounds; nothing changed."""

    REASON = "INVALID_ARGUMENT"


class ValueTooLarge(InvalidArgument):
    """A value is larger than its documented limit; nothing changed."""

    REASON = "VALUE_TOO_LARGE"


class RequestTooLarge(CoorddError):
    """The request exceeds the daemon's request size limit."""

    REASON = "REQUEST_TOO_LARGE"


class SessionNotFound(CoorddError):
    """The session does not exist: never created, closed, or expired on the server."""

    REASON = "SESSION_NOT_FOUND"


class KeyNotFound(CoorddError):
    """The key does not exist."""

    REASON = "KEY_NOT_FOUND"


class NoLeader(CoorddError):
    """The election has no leader."""

    REASON = "NO_LEADER"


class LockHeld(CoorddError):
    """A try-lock found the lock held; nothing was queued."""

    REASON = "LOCK_HELD"


class StaleToken(CoorddError):
    """The fencing token no longer holds the lock (or the term no longer
    leads); a fenced write was refused and wrote nothing."""

    REASON = "STALE_TOKEN"


class NotHolder(CoorddError):
    """The caller does not hold the lock it tried to release (or a fenced
    write needs a write grant)."""

    REASON = "NOT_HOLDER"


class NotLeader(CoorddError):
    """The term does not lead the election (proclaim, resign)."""

    REASON = "NOT_LEADER"


class RevisionMismatch(CoorddError):
    """A compare-and-set (expected_revision) found another revision."""

    REASON = "REVISION_MISMATCH"


class Compacted(CoorddError):
    """A read or watch asked for a revision compacted out of etcd's history."""

    REASON = "COMPACTED"


class Unavailable(CoorddError):
    """No endpoint or no etcd quorum could serve the call, or the daemon is
    stopping. A call that changes state may or may not have taken effect."""

    REASON = "UNAVAILABLE"


class Internal(CoorddError):
    """The daemon failed unexpectedly and logged the details."""

    REASON = "INTERNAL"


class LimitMismatch(CoorddError):
    """The lock has another holder limit than the one asked for."""

    REASON = "LIMIT_MISMATCH"


class AlreadyLeader(CoorddError):
    """The session already leads the election under another campaign id."""

    REASON = "ALREADY_LEADER"


class ValidationFailed(InvalidArgument):
    """A config write does not match the namespace's JSON Schema;
    ``problems`` lists every violation."""

    REASON = "VALIDATION_FAILED"


class ReleaseNotFound(CoorddError):
    """The config release (or gray release) does not exist or is older
    than the history kept."""

    REASON = "RELEASE_NOT_FOUND"


class DeadlineExceeded(CoorddError):
    """A wait or the call ran out of time (the request's wait, or the
    client's timeout). A wait that ends so leaves nothing queued."""

    REASON = "DEADLINE_EXCEEDED"


class NoSpace(CoorddError):
    """etcd's database is full (NOSPACE alarm): writes that add data fail
    until an operator makes room. Retrying at once does not help."""

    REASON = "NO_SPACE"


class MemberNotFound(CoorddError):
    """No etcd member has the given name or id."""

    REASON = "MEMBER_NOT_FOUND"


class MemberChangeRefused(CoorddError):
    """A membership change was refused; the message says why."""

    REASON = "MEMBER_CHANGE_REFUSED"


class Unauthenticated(CoorddError):
    """coordd requires an identity and the call had none, or an unknown token."""

    REASON = "UNAUTHENTICATED"


class PermissionDenied(CoorddError):
    """The caller's principal may not do this; the message names the missing rule."""

    REASON = "PERMISSION_DENIED"


class RateLimited(CoorddError):
    """The principal or namespace is over its rate limit; nothing changed.
    ``retry_after`` says when to retry."""

    REASON = "RATE_LIMITED"


class QuotaExceeded(CoorddError):
    """The principal holds as many sessions, or has as many waits, as allowed."""

    REASON = "QUOTA_EXCEEDED"


class Cancelled(CoorddError):
    """The call was cancelled; whether it took effect is unknown."""

    REASON = "CANCELLED"


class UnknownRoute(CoorddError):
    """No REST route has this path (REST only; seen through proxies)."""

    REASON = "UNKNOWN_ROUTE"


class Unimplemented(CoorddError):
    """The server does not offer the call (an older server, a feature off)."""

    REASON = "UNIMPLEMENTED"


class SecretsUnavailable(CoorddError):
    """The member cannot seal or open a secret config value (no
    --secret-key-file, or not the key that wrapped the namespace's data
    key); nothing changed."""

    REASON = "SECRETS_UNAVAILABLE"


class ApprovalRequired(CoorddError):
    """The config namespace changes only by approved proposals; nothing
    changed."""

    REASON = "APPROVAL_REQUIRED"


class ProposalNotFound(CoorddError):
    """No such proposal (the last 100 of a namespace are kept)."""

    REASON = "PROPOSAL_NOT_FOUND"


class ProposalClosed(CoorddError):
    """The proposal was approved, rejected or withdrawn, or expired."""

    REASON = "PROPOSAL_CLOSED"


class CandidateNotFound(CoorddError):
    """The session named as a leadership's successor has no campaign waiting."""

    REASON = "CANDIDATE_NOT_FOUND"


# --- The client's own errors (no server reason). ---


class SessionEnded(CoorddError):
    """Base of the reasons a session ends on the client's side."""


class SessionExpired(SessionEnded):
    """The session's local deadline passed without an acknowledged
    keep-alive. The server may still hold the session (and its locks) for
    the rest of its TTL, but nothing held under it may be acted on."""


class SessionClosed(SessionEnded):
    """The session was closed with close(), or its client was closed."""


class LockLost(CoorddError):
    """The lock was lost while held (its session ended, or the server no
    longer has the grant). ``cause`` says why, when known."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class LeadershipLost(CoorddError):
    """The leadership was lost while held (its session ended, or the server
    answered NOT_LEADER). ``cause`` says why, when known."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class ClientClosed(CoorddError):
    """The client was closed."""


#: Every server reason's exception class, by reason.
REASONS: dict[str, type[CoorddError]] = {
    cls.REASON: cls
    for cls in (
        InvalidArgument, ValueTooLarge, RequestTooLarge, SessionNotFound, KeyNotFound,
        NoLeader, LockHeld, StaleToken, NotHolder, NotLeader, RevisionMismatch, Compacted,
        Unavailable, Internal, LimitMismatch, AlreadyLeader, ValidationFailed, ReleaseNotFound,
        DeadlineExceeded, NoSpace, MemberNotFound, MemberChangeRefused, Unauthenticated,
        PermissionDenied, RateLimited, QuotaExceeded, Cancelled, UnknownRoute, Unimplemented,
        SecretsUnavailable, ApprovalRequired, ProposalNotFound, ProposalClosed,
        CandidateNotFound,
    )
}

# Errors without a reason (transport errors, the client's own deadline, a
# cancel) are classed by their code.
_BY_CODE: dict[grpc.StatusCode, type[CoorddError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RequestTooLarge,
}


def _status_details(err: grpc.RpcError) -> status_pb2.Status | None:
    """Decodes the google.rpc.Status in the call's trailing metadata."""
    trailers = getattr(err, "trailing_metadata", None)
    if trailers is None:
        return None
    try:
        md = trailers() or ()
    except Exception:  # noqa: BLE001 - a call without trailers
        return None
    for key, value in md:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            st = status_pb2.Status()
            try:
                st.ParseFromString(value)
            except Exception:  # noqa: BLE001 - malformed details: ignore them
                return None
            return st
    return None


def from_rpc_error(err: grpc.RpcError) -> CoorddError:
    """Returns the CoorddError subclass instance for a failed gRPC call:
    the class of its coordd ErrorInfo reason, else of its status code."""
    code = err.code() if hasattr(err, "code") else None
    message = err.details() if hasattr(err, "details") else str(err)
    message = message or ""
    reason = ""
    problems: list[Problem] = []
    retry_after = None
    st = _status_details(err)
    if st is not None:
        for any_msg in st.details:
            name = any_msg.type_url[len(_TYPE_PREFIX):] if any_msg.type_url.startswith(_TYPE_PREFIX) else any_msg.type_url
            if name == "google.rpc.ErrorInfo":
                info = status_pb2.ErrorInfo()
                info.ParseFromString(any_msg.value)
                if info.domain == DOMAIN:
                    reason = info.reason
            elif name == "google.rpc.BadRequest":
                br = status_pb2.BadRequest()
                br.ParseFromString(any_msg.value)
                problems.extend(Problem(v.field, v.description) for v in br.field_violations)
            elif name == "google.rpc.RetryInfo":
                ri = status_pb2.RetryInfo()
                ri.ParseFromString(any_msg.value)
                retry_after = ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9
    cls = REASONS.get(reason) or (_BY_CODE.get(code) if code is not None else None) or CoorddError
    return cls(message, reason=reason, code=code, problems=tuple(problems), retry_after=retry_after)
