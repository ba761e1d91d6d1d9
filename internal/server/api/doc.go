// Package api holds coordd's gRPC adapters: thin servers that validate a
// request, call a domain package and build the response. It also owns:
//
//   - the one table that maps domain errors to gRPC status codes
//     (errors.go), and the interceptors that apply it, log errors once,
//     recover panics and end calls on a member without an etcd leader
//     (interceptors.go);
//   - authentication, the table of RPCs and the actions they need, session
//     ownership, rate limits and the audit log (authn.go, authz.go,
//     owners.go);
//   - the adapters' metrics (metrics.go);
//   - the Calls stream (calls.go): the SDK's lock and election calls
//     pipelined on one stream per client, each run through the same
//     interceptors and handler as its unary RPC;
//   - keep-alive streams (session.go, follow.go): reading requests and
//     sending answers, handing batches of renewals to session.Batches
//     (which renews them in lots, side by side) and the holdings a stream
//     follows to a grantwatch.Set (which reports each one's end once), so
//     that a holder hears when its grant or term ends;
//   - paging tokens (pagetoken.go), the codec that marshals a message once
//     for many streams (codec.go), and per-principal limits on waiting
//     calls (waiters.go).
//
// It holds no coordination logic of its own: what a session, a lock, an
// election or a release does is in the domain packages.
package api
