// Package chaos is coordd's fault matrix: a real cluster of coordd
// processes, clients as separate processes, faults injected from outside,
// and checkers over what everyone recorded. It is for tests (TestFaultMatrix
// and make chaos), never for production.
//
// Parts:
//   - Cluster: n coordd processes (the built binary) on loopback. Peers
//     reach a member through its Peer proxy and clients through its Client
//     proxy (package tcpproxy), so a member can be cut off (Partition: its
//     traffic is dropped, connections stay open) as well as killed (kill -9)
//     or paused (SIGSTOP).
//   - RunWorker: one client process. It takes a lock (or leads an election)
//     over and over, writes its token to a fenced key a few times while it
//     holds it (also after its grant may have ended: a paused holder does
//     not know, and fencing must refuse the late writes), and records every
//     operation with its call and return times in a history file: grants,
//     fenced writes with their outcome (ok, stale, unknown), and its own
//     view of each grant (until its release, the end of its context, or its
//     session's local deadline, whichever comes first). Two set workers
//     take two locks at once (AcquireAll), naming them in opposite orders,
//     and record each lock's grants as a lock of its own. A barrier worker
//     takes two participants through barriers of two, one after another,
//     and records each opening.
//   - Check (fencing/histcheck's checkers, which coordctl verify runs against
//     live clusters too): porcupine (github.com/anishathalye/porcupine) checks that the
//     grants and fenced writes are linearizable under a model in which
//     tokens strictly increase and a write is accepted only with the token
//     of a grant already made and not older than the last accepted write;
//     CheckWriteOrder reads etcd's history of the fenced key (every applied
//     write, in revision order) and checks its tokens never go back and were
//     all granted; CheckViews checks that no two holders' own views overlap
//     (for an election: never two leaders). CheckConfig checks each config
//     subscriber's snapshots: whole releases only, never going back, in a
//     plain namespace, in one that requires approval (where the publisher
//     proposes each release as one author and approves it as another; the
//     matrix also checks that every release kept there names that proposer
//     and approver), and in an heir of the plain one (which gets each of
//     its releases as one release of its own).
//
// Sabotage modes switch a mechanism off to show that the checkers catch
// what it prevents: SabotageUnfenced writes straight to etcd (late writes
// of paused holders land: write order and porcupine fail), SabotageDeadline
// has holders trust their grant a TTL past the SDK's local deadline (views
// overlap), SabotageTorn has the config publisher write each release's two
// keys in two releases, also as two approved proposals (subscribers see
// half releases: CheckConfig fails, for all three namespaces).
//
// Non-guarantees: the checkers see only what the workers recorded. A
// worker killed mid-operation leaves no record of it, and a write with no
// answer may or may not have been applied, so the checks can miss a
// violation there, never invent one. Views are compared on the host's wall
// clock, which every process shares.
package chaos
