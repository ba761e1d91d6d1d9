// Package configcenter keeps configuration in etcd as namespaces of keys,
// changed only by releases, and serves it as consistent snapshots and as
// ordered, gap-free change sets. It is domain logic over an etcd client:
// it knows nothing of gRPC or proto, and the daemon adapts it to its API.
//
// [Store] reads and writes namespaces; [Cache] is a member's watch cache,
// which serves every subscriber from one etcd watch; [Subscription] is one
// subscriber; [WatchMux] serves many subscriptions from one goroutine (the
// daemon's WatchMany stream).
//
// # Guarantees
//
// Releases. Every write (Publish, Put, Delete, Rollback) is a release,
// committed in one etcd transaction that holds the key changes, the
// namespace's meta key and the release's record (author, time, message,
// every change with its old and new value). A reader never sees half of a
// release. The transaction is guarded by the mod revisions of the
// namespace's meta and schema keys, so a namespace's releases are
// serialized and numbered 1, 2, 3, … without gaps; a writer that loses the
// race plans again on the new state. A write that changes nothing makes no
// release: it returns the release in effect with no changes. A rollback is
// a new release with an older release's content; history is never
// rewritten.
//
// Compare-and-set. With an expected revision (PublishRequest.ExpectedRevision
// and the expected argument of Put, Delete and Rollback), a write fails
// with ErrRevisionMismatch, and changes nothing, if the namespace had a
// release after that revision.
//
// Validation. Every problem of a write (bad keys, sizes, schema
// violations) is reported at once in a *ValidationError, and nothing is
// written. With a JSON Schema, a namespace's whole content must match it
// after every release, and SetSchema refuses a schema its current content
// does not match.
//
// Snapshots. Store.Snapshot and Store.Get read at one etcd revision,
// linearizably for the current state; a Snapshot is a namespace's whole
// content at its Revision. Cache.Snapshot answers from the cache at a
// revision of at least the one asked for, or fails with ErrBehind.
//
// History. Release records outlive etcd's compaction: the last
// Limits.HistoryReleases releases of each namespace (default 100) can be
// listed, diffed and rolled back to at any time.
//
// Watches. One Cache per member follows the whole config tree with one
// etcd watch. A subscriber receives, for its namespaces, a SNAPSHOT and
// then exactly one CHANGE per release, in revision order, each complete;
// and a BOOKMARK (the revision it has been told everything up to) at once
// when it resumes with nothing to replay, then every CacheOptions.Bookmark
// while idle, only while the cache's etcd watch is healthy. A subscriber
// never gets an older state after a newer one: whenever it cannot be given
// every release since its revision, it gets a fresh SNAPSHOT instead. That
// happens when its queue of pending events overflows CacheOptions.QueueLimit
// (the cache never waits for a subscriber: the queue is dropped), when the
// cache reloads after its etcd watch was compacted away, when a release's
// record cannot be decoded, and when a resume point is older than the
// history the cache holds. To resume, a subscriber
// asks for the last revision it received plus one: it gets the releases at
// and after it from the cache's history (rebuilt from the release records
// when the daemon restarts), or a SNAPSHOT. A resume point beyond the
// cache's revision waits up to three seconds for the cache and then fails
// with ErrBehind, since the member lags what the subscriber has seen. A
// subscriber that starts without a resume point gets a first SNAPSHOT that
// includes every release finished before it subscribed, unless the cache
// lags etcd by more than a second.
//
// Gray releases. A namespace may run one gray (canary) release: overrides
// that only the subscribers its selector picks see (see Gray for its
// guarantees). A subscriber that does not name itself, or is not picked,
// is never sent an overridden value; create, update, promote and abandon
// are each one transaction.
//
// # Non-guarantees
//
//   - The cache lags etcd by the time a watch event takes to arrive. Reads
//     that must be current wait for it (briefly) or fail with ErrBehind;
//     a Poll or a subscriber may learn of a release a little after a
//     linearizable read could.
//   - Store.Get and Store.Snapshot at a past revision fail with
//     ErrCompacted once etcd has compacted it; only release records are
//     kept beyond compaction. Releases older than Limits.HistoryReleases
//     are pruned: Diff and Rollback to them fail with ErrReleaseNotFound.
//   - The cache's history holds the last CacheOptions.History releases of
//     all namespaces (default 10,000; after a restart, only those whose
//     records are still kept): a resume point older than that gets a
//     SNAPSHOT, not the releases since.
//   - Revisions compare only within one etcd cluster (a SNAPSHOT carries
//     the cluster id). A release's Time is the writing member's clock.
//   - A schema change is not a release: it gets no number, no record and
//     no watch event.
//   - Reported apply status (ReportStatus) is what instances say, kept for
//     StatusTTL; nothing checks it.
package configcenter
