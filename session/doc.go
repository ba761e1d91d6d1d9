// Package session owns coordd sessions: an etcd lease plus the metadata that
// says whose it is (owner, hostname, labels, creation time).
//
// A session is the liveness unit of coordd. Every lock holder, lock waiter and
// election candidate is a key bound to its session's lease, so ending the
// session (Close, or expiry after its TTL without a keep-alive) releases all
// of them in one etcd operation.
//
// Guarantees:
//   - A session lives at least its TTL after the last keep-alive the server
//     answered: etcd expires a lease only after its TTL has run out.
//   - With lease checkpointing enabled (the daemon enables it for its
//     embedded etcd; an external cluster has its own setting), a session
//     with more than etcd's checkpoint interval (5 minutes) left keeps its
//     remaining TTL across an etcd leader change.
//
// Non-guarantees:
//   - A session may outlive its TTL: a new etcd leader extends every lease by
//     up to one election timeout, a session with less than 5 minutes left
//     may get its full TTL back on a leader change, and expiry is checked
//     periodically. Clients
//     must stop acting on a session at their own local deadline, which the Go
//     SDK computes conservatively.
//   - Session ids are etcd lease ids. KeepAlive and Close act on any lease of
//     the etcd cluster; when coordd shares an external etcd cluster, leases
//     made by other programs are not protected from coordd callers.
package session
