package sdk_test

// Per-test daemons for the SDK's end-to-end tests: each test that needs a
// daemon has its own (its own configuration, a restart, etcd compacted
// under it, a cluster with a member stopped).

import (
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

// testConfig, start and newClient are daemontest's, which the daemon's
// own tests share.
func testConfig(t *testing.T) daemon.Config { return daemontest.TestConfig(t) }

func start(t *testing.T, cfg daemon.Config) *daemon.Daemon { return daemontest.Start(t, cfg) }

func newClient(t *testing.T, endpoints ...string) *clientlib.Client {
	return daemontest.Client(t, endpoints...)
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
