// Package clientlib is the Go SDK of coordd. It speaks coordd's gRPC API
// only, never etcd, and covers coordd's three uses: sessions and fenced
// locks, leader elections, and configuration.
//
// A [Client] connects to one or more coordd endpoints and fails over
// between them; [New] waits up to Config.DialTimeout (5s by default) for a
// first endpoint to answer. It uses one endpoint at a time, picked at
// random, and moves to the member whose etcd member leads as soon as that
// member's health service says it leads (every write goes through etcd's
// leader, so there a lock cycle costs a network hop less, and every client
// of a cluster waits the same; Config.AnyMember turns this off). It moves
// on when the endpoint in use cannot be reached, when a keep-alive
// or a config watch through it goes unanswered (at least 1s), or at once
// when a keep-alive unanswered for 200ms is followed by a health check
// left unanswered for 300ms (the member is paused, cut off or gone; a live
// member answers that check from memory, even during an etcd election),
// if it has another endpoint to move to: a client whose other endpoints
// are all left out, or that has one, waits for the answer until the next
// keep-alive is due (at least 1s) or the local deadline, since a member
// that is merely slow (a starved CPU, a long link) answers late. An
// endpoint left out is probed (gRPC health, from 100ms to every second)
// and used again as soon as it serves, which a member does only while its
// etcd has a leader. With every endpoint left out, all are tried. The
// endpoints must be members of one cluster: every answer names its
// cluster (a random id the cluster keeps), New asks every endpoint (for up
// to 300ms) and fails with ErrInvalidArgument when two clusters answer,
// and a client that meets a second cluster later refuses every call from
// then on (a lock taken on one cluster would not exclude a holder on the
// other). When the
// client leaves an endpoint, the idempotent calls it has in flight (Lock,
// TryLock, Campaign, Release, Resign, Proclaim) are cancelled and retried
// at once on the next one; when it leaves a silent member, every other
// call in flight (a fenced Put, a Publish) ends at once with
// ErrUnavailable, its outcome unknown, rather than wait for the member to
// come back. So a paused or partitioned member holds nothing up for longer
// than one keep-alive interval plus half a second. Reads (config Get,
// Snapshot and Poll, Leader, DescribeLock, the listings, history, ...)
// that fail with ErrUnavailable, as they do while etcd elects a leader,
// are made again after a short backoff for up to 5s (or until ctx ends),
// then return their last error; the cluster status calls are not
// repeated, so that a cluster without quorum says so at once. One Client
// serves all three uses, is safe for concurrent use, and is closed once,
// when the program is done with it.
//
// A Client's lock and election calls (Lock, TryLock, Release, Campaign,
// Proclaim, Resign, Validate and the fenced Put and Delete) are pipelined
// on one stream (SessionService.Calls) to the endpoint in use: many in
// flight at once, each answered as it finishes. The server runs each as
// the unary RPC of its name, so outcomes, errors and the retries above are
// the same; a call in flight when the stream breaks ends with
// ErrUnavailable (outcome unknown) and is retried as after a lost answer.
// The stream follows the client when it moves: new calls go to the new
// endpoint at once, calls in flight finish where they began (or end with
// ErrUnavailable when that member went silent). Against a server without
// the stream (coordd --no-call-stream, or one that predates it), or with
// Config.UnaryCalls, calls are unary RPCs.
//
//	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{"127.0.0.1:7420"}})
//	if err != nil { ... }
//	defer c.Close()
//
// Errors from the server match sentinels through errors.Is, chosen by the
// server's reason: errors.Is(err, clientlib.ErrSessionNotFound).
//
// The Client's own methods are what programs use: sessions, locks,
// elections. [Client.ConfigCenter] holds the config center's calls, and
// [Client.Admin] the raw calls by session id, token and term that tools
// such as coordctl need; they keep nothing alive.
//
// # Sessions and fenced locks
//
// A [Session] is the liveness unit every lock and candidacy hangs off: the
// SDK renews it in the background (every TTL/3, jittered) and tells the
// program, through Done, Context and Err, when it can no longer be sure
// the session is alive. A [Lock] ([Session.Lock], [Session.TryLock],
// [RunLocked]) is held by a session and carries a fencing token (package
// fencing); its Context ends when the lock is released or lost, no later
// than the session's local deadline.
//
//	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("billing"))
//	if err != nil { ... }
//	defer s.Close(context.Background())
//
//	err = clientlib.RunLocked(ctx, s, "reports/daily", func(ctx context.Context, l *clientlib.Lock) error {
//		return db.Write(ctx, row, l.Token()) // stop when ctx ends; the resource checks the token
//	})
//
// Guarantees: a session's local deadline ([Session.Deadline]) is the send
// time of the last acknowledged keep-alive + TTL - margin, on the
// monotonic clock, with margin = max(250ms, TTL/10); the server cannot
// expire the session before send time + TTL, so the local deadline falls
// first as long as the two clocks' rates differ by less than the margin
// over one TTL. The SDK renews every TTL/3 (TTL/6 under 6s), so a session
// outlives an etcd leader election that ends within TTL - margin - one
// renewal period of the last acknowledged keep-alive: a 3s session rides
// out an election with etcd's default 1s election timeout (2.2s of room;
// followers notice a dead leader after 1-2s), a 10s one has 5.4s. Done
// closes no later than the local deadline (at once when the server reports
// the session gone), and every lock's Context ends with it: everything done
// on a session's behalf must stop then. A lock's Context also ends, and
// Lost closes, when the server reports the grant gone although this
// process did not release it (an admin or coordctl released it by its
// token): the keep-alive stream asks the server to watch every held lock
// and leadership, and the server pushes their end within one round trip
// (p99 2.9ms on loopback, BenchmarkOutsideReleaseNotice); a holder that
// reconnects names its holdings again and hears at once of those that
// ended meanwhile. A session the SDK gives up on (its local deadline
// passed) is closed on the server in the background as soon as any member
// answers, so what it held or waited for is released then rather than
// when its lease runs out (after an etcd outage, etcd gives every lease
// its whole TTL again); [Client.Close] closes the client's live sessions.
// A grant's token is
// strictly greater than the token of every earlier grant of the same lock.
// Lock acquisition is retried while coordd is unavailable with the same
// request id, so a retry never takes the lock twice; Release is retried
// with the grant's token, so it never removes a newer holder. NewSession is
// retried while coordd is unavailable, for up to 5s or until ctx ends: a
// create whose answer was lost leaves at worst an orphan session, which
// holds nothing and ends with its TTL. Not guaranteed: while no member answers, a
// session the SDK gave up on stays on the server (for at most its TTL once
// etcd has a leader); and a paused holder can act after its session
// ended, whatever the SDK does. A release from outside (Admin.Release, an
// operator's coordctl) is put to the holder first: the server asks on the
// keep-alive stream, the SDK ends the lock's Context and then releases it
// itself, and only then is the next waiter granted (a holder that cannot
// answer, frozen or cut off, loses the grant at the revocation's bound,
// its session TTL at most). The holder's own Release, Resign and Transfer
// end the Context before the request leaves. The local deadline
// holds also when etcd's leadership moves or its leader member is paused:
// the server keeps the sessions' time itself (docs/sessions.md). The
// fault matrix (internal/testkit/chaos) checks it, and fencing still refuses an old
// holder's late writes. A lock protects a resource only if the
// resource checks the token (fencing.Guard, fencing.Middleware, or the
// lock's own [Lock.Put]).
//
// # Leader elections
//
// [Client.RunAsLeader] campaigns for an election, runs a callback while
// this process leads, and heals itself: it replaces a session that ended
// and campaigns again, with backoff, after failures. For custom loops,
// [Session.Campaign] returns a [Leadership] with a Term, a Context, Proclaim
// and Resign; [Client.Leader], [Client.Candidates] and [Client.Observe]
// show who leads and who waits.
//
//	err := c.RunAsLeader(ctx, "reports/nightly", "host-1:8080",
//		func(ctx context.Context, lead *clientlib.Leadership) error {
//			return runBatch(ctx, lead.Term()) // stop when ctx ends; pass the term to every write
//		},
//		clientlib.WithElectionSession(clientlib.WithTTL(10*time.Second)),
//		clientlib.OnElected(func(term fencing.Token) { log.Printf("leading, term %d", term) }),
//		clientlib.OnDemoted(func(term fencing.Token, why error) { log.Printf("term %d over: %v", term, why) })) // why: nil when done
//
// Guarantees: a term is a fencing token, strictly greater than every
// earlier leader's term of the election. The callback's context ends when
// leadership ends: at the latest at the session's local deadline, before
// the server can elect anyone else (under the clock condition above).
// A term resigned from outside (an admin, coordctl) ends the callback's
// context before the next leader is elected: the server asks first and
// the SDK resigns once the context has ended (see Sessions). RunAsLeader
// never runs two callbacks at once, and campaigns again only after the
// callback returned, so a callback's context is always cancelled before
// the same RunAsLeader can be elected again; when a callback returns it resigns, so the next candidate leads at
// once; a callback that returns nil while still leading ends RunAsLeader
// with nil; when ctx ends, RunAsLeader cancels the callback, waits for it,
// resigns on a fresh bounded context, closes its session and returns ctx's
// error. OnElected and OnDemoted run on RunAsLeader's goroutine. Not
// guaranteed: a callback that ignores its context keeps running after its
// term ended, and a deposed leader can still act while paused, so fence
// what the leader writes by its term ([Leadership.Put],
// [Leadership.Validate], or a resource that checks the term).
//
// # Configuration
//
// [ConfigCenter.Subscribe] follows namespaces and keeps an immutable, consistent
// [ConfigSnapshot] of them current; [Bind] decodes one namespace into a Go
// type and hot-reloads it. [Subscription.OnKey], OnNamespace and OnPrefix
// call back on changes; [Subscription.Status] says whether the
// subscription is live, stale or syncing.
// Writes go through [ConfigCenter.Publish], [ConfigCenter.Put] and
// [ConfigCenter.Rollback].
//
//	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"payments/prod"},
//		clientlib.WithCacheFile("/var/lib/myapp/config.json")) // start even while coordd is down
//	if err != nil { ... }
//	defer sub.Close()
//
//	type Payments struct {
//		Timeout string `json:"timeout"`
//		Retries int    `json:"retries"`
//	}
//	cfg, err := clientlib.Bind(sub, "payments/prod", clientlib.JSON,
//		clientlib.BindDefaults(Payments{Timeout: "5s", Retries: 3}),
//		clientlib.BindValidate(func(p Payments) error { ... })) // a bad release is refused
//	if err != nil { ... }
//	p := cfg.Load() // lock-free, never blocks
//
// Guarantees: Subscribe returns once it has the current snapshot (or,
// past its start timeout, the cache file's, marked stale; with neither, it
// fails with ErrUnavailable). A snapshot is consistent at one revision,
// with every namespace at a complete release, and is never replaced by an
// older state of the same cluster: after a disconnect the subscription
// resumes from its revision, and takes the server's fresh snapshot
// whenever the stream was reset. Callbacks run one at a time, in
// registration order, on the subscription's goroutine, outside any lock; a
// panic is recovered and reported to OnError. A Binding's Load returns a
// value decoded from one complete release that passed BindValidate; a
// release that does not decode or validate is refused, the last good value
// stays, and the refusal is reported to OnError and (unless
// WithoutStatusReports) to the server's applied-status
// ([ConfigCenter.AppliedStatus]). Not guaranteed: that callbacks see every
// release (releases that arrive while a callback runs coalesce into one
// change), or that the configuration is current: while the subscription
// is stale (disconnected, or started from the cache file) it serves the
// last one it knew, and Status says for how long.
package clientlib
