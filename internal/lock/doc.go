// Package lock implements coordd's locks and semaphores over etcd, with a
// fencing token on every grant.
//
// Model: a lock is a FIFO queue of waiter keys under one prefix, each bound
// to its session's lease. The first Limit keys by create revision hold the
// lock (Limit 1 is a mutex, more is a semaphore); the rest wait. A waiter's
// token is its key's create revision.
//
// Keys, under the root given to NewManager (coordd uses "/coordd/"), with
// <lock> the escaped lock name (see package names):
//
//	lock/<lock>/q/<session>/<request-id>  a waiter or holder, bound to its
//	                                      session's lease (16 hex digits);
//	                                      JSON: limit, lock-delay, request
//	                                      id, metadata, enqueue/grant time
//	lock/<lock>/held/<token>              a holder that asked for a
//	                                      lock-delay (no lease); removed with
//	                                      its waiter key on Release
//	lock/<lock>/delay                     a running lock-delay: token and
//	                                      until, bound to the next grantee's
//	                                      lease
//	lock/<lock>/revoke/<token>            a revocation in progress (Revoke):
//	                                      the holder's entry key, since and
//	                                      until, bound to the holder's lease
//	lock/<lock>/revoked                   how the last revocation that the
//	                                      holder did not simply answer ended
//	                                      (or, written by the holder's
//	                                      answering release, that it did),
//	                                      bound to the holder's lease
//	kv/<key>                              coordd's KV, written by FencedPut
//	                                      and FencedDelete
//
// Guarantees:
//   - Lock state is linearizable: at any etcd revision at most Limit keys
//     hold a lock, and grants happen in queue (create revision) order.
//   - Tokens of one lock strictly increase from grant to grant (they are
//     etcd revisions). Grants of different locks committed in one batch
//     (internal/base/groupcommit) share a revision: a token names a grant only
//     together with its lock's name.
//   - A grant is reported only while the waiter's own key is alive; a waiter
//     whose session ends while it waits fails at once with
//     ErrSessionNotFound, not when its wait runs out.
//   - Release removes exactly the grant its token names: a late or retried
//     release never removes a newer holder.
//   - The holder knows first: Revoke (a release from outside) grants the
//     next waiter only once the holder's client has let go (its own
//     Release, sent after it ended the holding), or once the bound passed;
//     a holder asked through a stream on this member is asked before the
//     mark commits, any other through the mark (package revoke).
//   - A wait that ends (deadline, cancel, TryAcquire finding the lock held)
//     removes its waiter key, so nothing is left behind in etcd (if etcd
//     does not answer, the removal is retried for 30s; the session's end
//     removes the key at the latest). An enqueue whose outcome is unknown
//     (etcd did not answer) is watched for 30s and removed if it lands
//     late, so a proposal held up in a paused leader cannot leave an entry
//     nobody waits for. An idempotent retry of the same request takes the
//     entry over, so the call it replaces cannot remove it. Only an entry
//     written before the call began (in the daemon: before it reached the
//     member, see groupcommit.Committer.Arrived) is taken over: an attempt
//     that reaches etcd after a later acquisition under the same request
//     id wrote its entry (the attempt was stuck while its caller retried,
//     was granted, released and used the id again) fails with Unavailable
//     instead of taking that acquisition's place. A retry that reaches a
//     member before that member has seen its earlier attempt's entry is
//     refused so once (on each such member); retried there, it takes the
//     entry over. Not covered: a request delayed on the network so long
//     that it reaches the member after the later acquisition wrote.
//   - A lock may ask for a lock-delay: after a holder's session ends without
//     a Release, the next grant (to a waiter, or to whoever acquires later)
//     comes only once the delay has passed, counted from when that grant
//     noticed the end (the exact expiry time is not recorded, so the delay
//     errs long).
//   - Lock names are escaped: "a" and "a/b" are independent locks.
//
// Non-guarantees:
//   - A holder that does not answer a revocation (frozen, cut off, a REST
//     client with no stream) loses its grant at the bound while it may
//     still believe it holds; only fencing protects then (a lock-delay it
//     asked for applies, as after a session's end).
//   - Holding a lock does not by itself give mutual exclusion: a holder's
//     session can end while the holder still acts. Only actions fenced by
//     the token (FencedPut, ValidateFence, or a resource that checks the
//     token) are protected.
//   - The semaphore limit is checked against the queue's head when a waiter
//     enqueues; two first acquirers racing with different limits may both
//     enqueue.
//   - A holder that asks for a lock-delay leaves a small record that
//     outlives its session until a clean Release or the next grant removes
//     it; a lock abandoned by an expired holder and never acquired again
//     keeps that record.
package lock
