// Package auth decides who may do what in coordd: principals (who is
// calling), bearer tokens (stored as hashes), and the policy (which
// principal may take which action on which lock, election, namespace or
// key). The daemon's interceptors consult it for every call; domain
// packages never do.
//
// Guarantees:
//   - With a policy, everything not allowed by a rule is denied (deny by
//     default), including to callers without an identity.
//   - A policy or token file that does not parse or validate is refused
//     whole: Load returns an error and a running Authorizer keeps the
//     policy it had.
//   - Token files hold only SHA-256 hashes of tokens; a token is never
//     stored, logged or compared in the clear.
//
// Not guaranteed: the policy says what a principal may do to a name, not
// what it may do to another principal's session or grants; ownership is
// enforced by the daemon on top of the policy.
package auth
