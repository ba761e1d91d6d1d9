// Package api holds coordd's gRPC adapters: thin servers that validate a
// request, call a domain package and build the response. It also owns the
// one table that maps domain errors to gRPC status codes and the
// interceptors that apply that table, log errors once and recover panics.
package api
