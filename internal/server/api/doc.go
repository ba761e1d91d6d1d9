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
//   - keep-alive streams: renewals in batches, and the holdings a stream
//     follows so that a holder hears when its grant or term ends
//     (session.go, follow.go).
package api
