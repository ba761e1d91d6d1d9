package daemon_test

import (
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

func TestMain(m *testing.M) {
	dialUnixProbe()
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

// The daemons and clients of these tests come from daemontest, which
// tests/sdk shares; the short names read as the tests always have.

// testConfig is a single-member daemon on free loopback ports with fast
// raft ticks and fsync off.
func testConfig(t *testing.T) daemon.Config { return daemontest.TestConfig(t) }

// start starts a daemon and stops it when the test ends.
func start(t *testing.T, cfg daemon.Config) *daemon.Daemon { return daemontest.Start(t, cfg) }

// newClient is a client of endpoints, closed when the test ends.
func newClient(t *testing.T, endpoints ...string) *clientlib.Client {
	return daemontest.Client(t, endpoints...)
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// dialRaw is a plain gRPC connection to addr (no SDK, no credentials),
// closed when the test ends: for tests that speak the API's messages
// themselves.
func dialRaw(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
