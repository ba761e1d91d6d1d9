// Package history keeps the grant history of locks and elections: every
// grant and every end of a grant (release, expiry, a closed session), every
// election and every end of a leadership (resignation, expiry), with the
// token or term, the session and its owner, principal and host, and when.
// It answers "who held this lock at 03:00, with which token, and who took
// it next?" long after etcd has compacted the revisions that said so.
//
// A Recorder derives the events from etcd's watch of the lock, election
// and session keys, off the grant path: it adds nothing to an acquisition,
// a release or a campaign. Beside an embedded member it watches the
// member's store in place and drains what came every few milliseconds
// (Options.Local), so that etcd's send of a revision wakes no goroutine
// while the grant that made it answers. One member records at a time (a claim on an
// etcd lease); it resumes from a cursor stored in etcd with the events, so
// a restart or a move to another member loses nothing that etcd has not
// compacted meanwhile.
//
// Layout under root+"timeline/":
//
//	cursor                           the revision (and how many of its
//	                                 events) recorded last, its time, and
//	                                 how many events the history holds
//	writer/                          the recording member's claim (lease-bound)
//	t/<time>-<rev>-<seq>             a batch of events, in time order (a
//	                                 JSON array, compressed: codec.go)
//	n/<kind>/<name>/<time>-<rev>-<seq>  the batch's events of one lock or
//	                                 election
//	f/<kind>/<name>/                 the name's floor: its newest events
//	                                 kept under n/ past MaxRecords, and the
//	                                 principal they count against
//	floors                           how many floors each principal holds
//
// The suffix is the batch's first event's: <time> is 16 hex digits of Unix
// nanoseconds, <rev> 16 of the etcd revision, <seq> 4 of the event's place
// within its revision. Events wait up to 250 ms to share a batch, so under
// load one transaction writes thousands of them with one key per batch
// and one per lock or election in it; a batch is bounded in events (4,000),
// names (120) and stored bytes (1 MiB, under etcd's request limit,
// whatever its events' names, owners and hosts hold).
//
// Guarantees:
//   - Every event of an etcd revision is recorded exactly once, together
//     with the cursor that covers it (one transaction that compares the
//     cursor), however recorders start, stop, restart or move.
//   - Events are derived from the state etcd committed: a grant is
//     recorded at the revision its entry came to hold the lock (or lead),
//     with its token (the entry's create revision); an end at the
//     revision its entry was deleted, with the reason that revision shows.
//   - A recorder that cannot resume (its cursor's revision was compacted:
//     no member recorded for longer than etcd's compaction window) records
//     a GAP event that names the revisions it could not see.
//   - Events are kept for Options.Retention and at most
//     Options.MaxRecords of them; the oldest batches go first, whole (a
//     batch is at most a quarter of MaxRecords, so at least three
//     quarters of it are kept).
//   - Past MaxRecords, each lock and election keeps its newest
//     Options.Floor events (its floor), listed by name though the
//     timeline of all names no longer has them, for up to
//     Options.FloorNames names per principal (the principal of a name's
//     newest event): one principal's flood of events cannot erase another
//     principal's last grants, nor grow the floors past its share. A floor
//     goes once the name's newest event is older than the retention.
//
// Non-guarantees:
//   - Times are the recording member's clock when it saw the revision,
//     usually milliseconds after the commit; they never go backwards
//     across recorders, but they are not etcd's.
//   - A grant held back by a lock-delay is recorded when its entry reached
//     the head of the queue, not when the delay ended.
//   - Mutual exclusion is not checked here (see coordctl verify); the
//     history states what etcd committed, and is as correct as that.
package history
