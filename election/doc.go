// Package election runs leader elections over etcd: candidates queue FIFO
// behind the leader, each bound to its session, and the leader holds a
// term that is a fencing token.
//
// Layout under root+"election/<escaped name>/":
//
//	q/<session>/<request id>   a candidate (lease-bound); the one with the
//	                           lowest create revision leads, and that
//	                           create revision is its term
//	resigned                   the term that last resigned (bound to the
//	                           resigner's session): tells Observe a
//	                           resignation from an expiry
//
// Guarantees:
//   - At most one candidate leads an election at any etcd revision, and a
//     leader leads until its entry is deleted (it resigns, its session
//     ends, or its campaign is abandoned).
//   - Terms are etcd revisions: strictly increasing from leader to leader
//     of one election. Terms of different elections (and lock tokens)
//     committed in one batch share a revision: a term names a leadership
//     only together with its election's name.
//   - Campaign reports leadership only while the candidate's entry is alive
//     at the reported revision; a candidate whose session ends while it
//     waits fails at once (ErrSessionNotFound), never "elected" holding
//     nothing.
//   - Proclaim and Resign act only for the term that leads; a late or
//     retried call never touches a newer leader.
//   - Observe delivers every leadership change and every proclamation, in
//     revision order, each revision's events together; it reports a vacant
//     seat; a resume from a compacted revision starts from the current
//     state (events marked Current) instead of failing.
//
// Non-guarantees: leadership is lease-based, so a leader can keep acting
// after its session ended (a pause, a partition). Only actions fenced by
// the term are protected: fenced writes (Holding), or a resource that
// checks the term itself (package fencing).
package election
