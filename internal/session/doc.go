// Package session owns coordd sessions: an etcd lease plus the metadata that
// says whose it is (owner, hostname, labels, creation time).
//
// A session is the liveness unit of coordd. Every lock holder, lock waiter and
// election candidate is a key bound to its session's lease, so ending the
// session (Close, or expiry after its TTL without a keep-alive) releases all
// of them in one etcd operation.
//
// A session's time is coordd's, not etcd's (Clock, docs/sessions.md): a
// renewal is a write every member sees, each member ends a session it has
// not seen renewed for its TTL, with a transaction that fails if any
// renewal was committed after what it saw, and the etcd lease is only a
// backstop (Clock.BackstopTTL). The daemon always uses a Clock; a Manager without
// one has etcd's lease semantics (for tests and tools).
//
// Guarantees:
//   - A session lives at least its TTL after the last keep-alive the server
//     answered, and is never ended by a member that missed a renewal (a
//     paused, partitioned or lagging member, an etcd leader resumed after
//     a pause).
//   - A session nobody renews ends within its TTL plus a transaction (plus
//     Clock.Stagger if the member that renewed it last is gone, plus the
//     time until etcd has a leader), however often etcd's leadership moves.
//
// Non-guarantees:
//   - A member that starts, or whose watch fell behind etcd's compaction,
//     counts every session as renewed at that moment: a dead session may
//     outlive its TTL by up to one TTL then.
//   - With no coordd member running, sessions end with their etcd lease,
//     Clock.BackstopTTL after their last renewal.
//   - Session ids are etcd lease ids. KeepAlive and Close act on any lease of
//     the etcd cluster; when coordd shares an external etcd cluster, leases
//     made by other programs are not protected from coordd callers.
package session
