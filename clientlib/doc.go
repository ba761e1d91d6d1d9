// Package clientlib is the Go SDK of coordd. It speaks coordd's gRPC API
// only, never etcd.
//
// A Client connects to one or more coordd endpoints and fails over between
// them. A Session is the liveness unit every lock and candidacy hangs off:
// the SDK keeps it alive in the background and tells the program, through
// Done and Err, when it can no longer be sure the session is alive. A Lock
// (Session.Lock, TryLock, WithLock) is held by a session and carries a
// fencing token; its Context ends when the lock is released or lost, no
// later than the session's local deadline.
//
// Guarantees:
//   - A session's local deadline (Deadline) is computed from the send time of
//     the last acknowledged keep-alive: sent + TTL - margin, on the
//     monotonic clock, with margin = max(1s, TTL/10). The server cannot
//     expire the session before sent + TTL, so the local deadline always
//     falls first, as long as the two clocks' rates differ by less than the
//     margin over one TTL.
//   - Done is closed no later than the local deadline (and at once when the
//     server reports the session gone). Everything a program does on behalf
//     of a session must stop when Done closes.
//
// Non-guarantees:
//   - A session that the SDK gave up on may still be alive on the server for
//     up to the rest of its TTL; use fencing tokens where that matters.
//   - CreateSession is not retried after it may have reached the server: a
//     failure there is indeterminate. Lock acquisition and release are
//     retried, because they are idempotent (request id, token).
//   - A lock protects a resource only if the resource checks the token
//     (see package fencing): a paused holder can act after its session
//     ended, whatever the SDK does.
package clientlib
