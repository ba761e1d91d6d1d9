// Package errkind names the classes of failure that every layer of coordd
// agrees on: invalid input, a missing session, a held lock, a stale token,
// and so on.
//
// Domain packages (session, lock, election, configcenter) declare their
// sentinel errors with a Kind, so that the daemon maps each class to one gRPC
// code and one ErrorInfo reason in a single table (internal/server/api),
// however many packages return it:
//
//	var ErrHeld = errkind.Held.New("lock: held")
//
//	errors.Is(err, lock.ErrHeld)   // the package's own sentinel
//	errors.Is(err, errkind.Held)      // its class, for the status table
//
// The package has no dependencies: no gRPC, no proto, no etcd.
package errkind

// Kind is a class of failure. Kinds are compared by identity; use the
// variables of this package, never construct one.
type Kind struct{ name string }

// Error returns the kind's name, so that a Kind can be an errors.Is target.
func (k *Kind) Error() string { return k.name }

// New returns an error with message msg that matches k with errors.Is.
// Domain packages use it for their sentinels; adapters use it for a one-off
// error of a known class (a malformed request field).
func (k *Kind) New(msg string) error { return &classified{kind: k, msg: msg} }

type classified struct {
	kind *Kind
	msg  string
}

func (e *classified) Error() string        { return e.msg }
func (e *classified) Is(target error) bool { return target == e.kind }

// The kinds. Each maps to exactly one gRPC code and ErrorInfo reason in the
// daemon's status table; a test there fails when one is missing.
var (
	// Invalid: a malformed request or a value out of bounds; nothing changed.
	Invalid = &Kind{"invalid argument"}
	// TooLarge: a value over its size limit; nothing changed.
	TooLarge = &Kind{"value too large"}
	// SessionNotFound: the session does not exist (never created, closed or expired).
	SessionNotFound = &Kind{"session not found"}
	// KeyNotFound: the key does not exist.
	KeyNotFound = &Kind{"key not found"}
	// ReleaseNotFound: the config release does not exist or is older than the history kept.
	ReleaseNotFound = &Kind{"release not found"}
	// NoLeader: the election has no leader.
	NoLeader = &Kind{"no leader"}
	// Held: a lock is held by another session and the caller would not wait.
	Held = &Kind{"lock held"}
	// StaleToken: a fencing token or term is older than the newest one seen.
	StaleToken = &Kind{"stale token"}
	// NotHolder: the caller does not hold the lock.
	NotHolder = &Kind{"not the holder"}
	// NotLeader: the caller is not the leader.
	NotLeader = &Kind{"not the leader"}
	// LimitMismatch: a semaphore's limit differs from the one asked for.
	LimitMismatch = &Kind{"limit mismatch"}
	// AlreadyLeader: the session already leads the election under another campaign id.
	AlreadyLeader = &Kind{"already leader"}
	// ValidationFailed: a config write breaks the namespace's schema.
	ValidationFailed = &Kind{"validation failed"}
	// RevisionMismatch: a compare-and-set found another revision.
	RevisionMismatch = &Kind{"revision mismatch"}
	// Compacted: the requested revision is older than the history kept.
	Compacted = &Kind{"compacted"}
	// Unavailable: this member cannot serve the call now (stopping, cut off
	// from its peers, or behind); the caller retries, possibly elsewhere.
	Unavailable = &Kind{"unavailable"}
	// MemberNotFound: no etcd member has that name or id.
	MemberNotFound = &Kind{"member not found"}
	// MemberChangeRefused: a membership change would harm the cluster or
	// cannot be made yet; nothing changed.
	MemberChangeRefused = &Kind{"member change refused"}
	// Unauthenticated: the call has no identity, or one that does not check.
	Unauthenticated = &Kind{"unauthenticated"}
	// SecretsUnavailable: a secret value cannot be sealed or opened here
	// (no key file, or not the key that wrapped it).
	SecretsUnavailable = &Kind{"secrets unavailable"}
	// ApprovalRequired: the namespace changes only by approved proposals.
	ApprovalRequired = &Kind{"approval required"}
	// ProposalNotFound: no such proposal (or it was pruned).
	ProposalNotFound = &Kind{"proposal not found"}
	// ProposalClosed: the proposal was already approved, rejected or
	// withdrawn, or it expired.
	ProposalClosed = &Kind{"proposal closed"}
	// CandidateNotFound: the session named has no campaign waiting in the
	// election (a hand-over's successor).
	CandidateNotFound = &Kind{"candidate not found"}
	// PermissionDenied: the caller may not do this.
	PermissionDenied = &Kind{"permission denied"}
	// RateLimited: the caller or the namespace is over its rate; nothing changed.
	RateLimited = &Kind{"rate limited"}
	// QuotaExceeded: the caller holds as many sessions, or has as many
	// calls waiting, as it may; nothing changed.
	QuotaExceeded = &Kind{"quota exceeded"}
)

// All lists every kind, for tests that check each one is mapped.
var All = []*Kind{
	Invalid, TooLarge, SessionNotFound, KeyNotFound, ReleaseNotFound, NoLeader,
	Held, StaleToken, NotHolder, NotLeader, LimitMismatch, AlreadyLeader,
	ValidationFailed, RevisionMismatch, Compacted, Unavailable,
	MemberNotFound, MemberChangeRefused, Unauthenticated, PermissionDenied, RateLimited,
	QuotaExceeded, SecretsUnavailable, ApprovalRequired, ProposalNotFound, ProposalClosed,
	CandidateNotFound,
}
