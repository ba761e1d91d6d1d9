// Package sdk_test holds the Go SDK's end-to-end tests that start daemons
// in this process (one member, or a cluster of three): they live in the
// server's module so that the SDK's module (clientlib/go.mod) requires
// nothing of the server's. The SDK's other tests are in clientlib.
package sdk_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind, but etcd's own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's peer health probes keep idle HTTP connections between
		// members that embed.Etcd.Close does not close; they show up only in
		// multi-member tests and belong to etcd, not to coordd.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}
