// Package fencing is the resource side of coordd's locks: the Token every
// grant carries and the checks a protected resource makes with it. It uses
// the standard library only, so any Go service can import it.
//
// Why: a lock's lease can run out while its holder is paused (GC, swap, a
// slow disk) or partitioned. The holder does not know yet and keeps writing;
// meanwhile coordd hands the lock to someone else. No lease-based lock can
// prevent that overlap. What prevents damage is the resource refusing the
// old holder: every grant carries a token that is strictly greater than the
// tokens of all earlier grants of the same lock, and the resource remembers
// the highest token it has accepted and rejects anything lower.
//
// Guarantees, given that the resource checks every access:
//   - A write carrying a token lower than one already accepted is rejected
//     (Guard.Check returns ErrStale), so a holder whose lock was given to
//     someone else can no longer change the resource once the new holder has
//     touched it.
//
// Non-guarantees:
//   - A resource that does not check tokens is not protected, whatever the
//     lock says. Leases alone never give mutual exclusion.
//   - Guard keeps its high-water marks in memory: a resource that restarts
//     must persist them (the SQL pattern below does), or it accepts an old
//     token once after a restart.
//   - Tokens order grants of one lock name. Tokens of different locks are
//     unrelated; use one Guard key per lock name (or resource).
//
// SQL: store the token with the row and make the write conditional, so the
// check and the write are one atomic statement:
//
//	UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//
// Zero rows updated means a newer holder has written: treat it as ErrStale.
// (Use `fence < $2` instead if the same grant may not write twice.)
//
// HTTP: the client sends the token in the Coordd-Fence-Token header
// (SetHeader); the server wraps its handler in Middleware, which answers
// 409 Conflict to stale or missing tokens.
package fencing
