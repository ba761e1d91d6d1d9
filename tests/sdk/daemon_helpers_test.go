package sdk_test

// Per-test daemons for the SDK's end-to-end tests (configcenter_e2e_test.go),
// for a test that needs a daemon of its own (its own configuration, a
// restart, etcd compacted under it); the Examples share TestMain's.
// Copied from internal/server/daemon's tests, which keep theirs.

import (
	"context"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

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

// newClient is a client of endpoints, closed when the test ends.
func newClient(t *testing.T, endpoints ...string) *clientlib.Client {
	t.Helper()
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatalf("clientlib.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// compact compacts the etcd at url up to revision rev.
func compact(t *testing.T, url, rev string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	r, err := strconv.ParseInt(rev, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(t.Context(), r); err != nil {
		t.Fatal(err)
	}
}
