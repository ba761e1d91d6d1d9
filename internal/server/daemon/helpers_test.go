package daemon_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
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

// testConfig is a single-member daemon on free loopback ports with fast
// raft ticks and fsync off.
func testConfig(t *testing.T) daemon.Config {
	t.Helper()
	return daemontest.Config(t.TempDir(), freeport.Socket(t), freeport.URL(t), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
}

// start starts a daemon and stops it when the test ends.
func start(t *testing.T, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and the daemon")
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(30*time.Second))
	defer cancel()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("daemon.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return d
}

func newClient(t *testing.T, endpoints ...string) *clientlib.Client {
	t.Helper()
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatalf("clientlib.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
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
