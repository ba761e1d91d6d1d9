// Package election runs leader elections over etcd: candidates wait for
// the election's one seat, each bound to its session, and the leader holds
// a term that is a fencing token.
//
// Layout under root+"election/<escaped name>/":
//
//	q/<session>/<request id>/<priority>  a candidate (lease-bound), the
//	                                     leader's campaign included
//	lead/<session>/<request id>          the seat: the leader's record
//	                                     (lease-bound); its create revision
//	                                     is the term, its value the
//	                                     leader's proclaimed state
//	resigned                             the term that last resigned or
//	                                     handed over (bound to the
//	                                     resigner's session): tells Observe
//	                                     a resignation from an expiry
//	preempt                              a waiting candidate's request that
//	                                     the leader of a term step down
//	                                     (bound to the asker's session)
//	revoke/<term>                        a revocation in progress (Revoke):
//	                                     the seat's key, since and until,
//	                                     bound to the leader's session
//	revoked                              how the last revocation ended
//	                                     (bound to the leader's session)
//
// The seat is given (a) by the campaign itself when nobody leads or waits,
// (b) by Resign and (c) by Transfer in the same commit that ends the old
// term, or (d) by a promotion when a session's end freed it: every member
// with a waiting candidate sees that through its shared watch and tries;
// the compare that the seat is free lets one win. Waiting candidates take
// it in order of priority, then arrival (create revision).
//
// Guarantees:
//   - At most one seat exists at any etcd revision: every write that gives
//     it compares, in its transaction, that no seat exists (or that the
//     term handing over holds it, deleted in the same commit), and goes
//     through the group committer as a creating transaction (one per
//     election and batch, whose compares see the state before the batch).
//   - Terms are etcd revisions: strictly increasing from leader to leader
//     of one election. Terms of different elections (and lock tokens)
//     committed in one batch share a revision: a term names a leadership
//     only together with its election's name.
//   - A leader leads until its seat is deleted: it resigns or hands over,
//     its session ends, or its campaign is abandoned.
//   - Campaign reports leadership only for a seat that existed at the
//     reported revision; a candidate whose session ends while it waits
//     fails at once (ErrSessionNotFound), never "elected" holding nothing.
//   - Proclaim, Resign and Transfer act only for the term that holds the
//     seat; a late or retried call never touches a newer leader.
//   - A priority orders the waiting; it never unseats a leader. A
//     preemption request only asks: the leader ends its term itself.
//   - The leader knows first: Revoke (a resignation from outside) elects
//     the next leader only once the leader's client has stepped down (its
//     own resignation, sent after it ended the leadership), or once the
//     bound passed (Observe reports REVOKING meanwhile).
//   - Observe delivers every leadership change, proclamation and
//     preemption request, in revision order, each revision's events
//     together; it reports a vacant seat; a resume from a compacted
//     revision starts from the current state (events marked Current)
//     instead of failing.
//
// Non-guarantees: leadership is lease-based, so a leader can keep acting
// after its session ended (a pause, a partition). Only actions fenced by
// the term are protected: fenced writes (Holding), or a resource that
// checks the term itself (package fencing). A seat freed by a session's
// end stays free until a member with a waiting candidate gives it (one
// watch delivery and one commit; longer while etcd is unavailable).
package election
