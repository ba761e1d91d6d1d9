package clientlib_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/testkit/daemontest"
	"github.com/coordd/coordd/internal/testkit/freeport"
	"github.com/coordd/coordd/internal/testkit/wait"
)

// endpoints are the gRPC addresses of the in-process daemon that the
// Examples run against, started by TestMain: a real single-member coordd
// with its embedded etcd in a temporary directory, on loopback.
var endpoints []string

func TestMain(m *testing.M) { goleak.VerifyTestMain(withDaemon{m}) }

// withDaemon runs the tests and Examples with a daemon up, and stops it
// before goleak looks for leftover goroutines.
type withDaemon struct{ m *testing.M }

func (w withDaemon) Run() int {
	dir, err := os.MkdirTemp("", "clientlib-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "removing the examples' directory:", err)
		}
	}()
	peer, err := freeport.Get()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait.Bound(30*time.Second))
	defer cancel()
	d, err := daemon.Start(ctx, daemontest.Config(filepath.Join(dir, "data"), "unix://"+filepath.Join(dir, "etcd-client.sock"),
		fmt.Sprintf("http://127.0.0.1:%d", peer), zap.NewNop()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' daemon:", err)
		return 1
	}
	endpoints = []string{d.GRPCAddr()}
	code := w.m.Run()
	if err := d.Stop(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the examples' daemon:", err)
		return 1
	}
	return code
}
