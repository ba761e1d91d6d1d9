package clientlib_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// endpoints are the gRPC addresses of the daemon that the Examples run
// against, started by TestMain: a real single-member coordd, as a process
// with its embedded etcd in a temporary directory, on loopback.
//
// It is a process, not a daemon in this test binary, because the SDK's
// module must not require the server's (github.com/coordd/coordd): the
// SDK's end-to-end tests that need a daemon of their own live in the
// server's module (tests/sdk). COORDD_BINARY names a coordd to run;
// without it TestMain builds one from this repository (cmd/coordd).
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
	stop, err := startDaemon(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' daemon:", err)
		return 1
	}
	code := w.m.Run()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the examples' daemon:", err)
		return 1
	}
	return code
}

// startDaemon runs coordd with its data in dir, sets endpoints once it
// answers, and returns how to stop it (SIGTERM, then its exit status).
func startDaemon(dir string) (stop func() error, err error) {
	bin := os.Getenv("COORDD_BINARY")
	if bin == "" {
		bin = filepath.Join(dir, "coordd")
		build := exec.Command("go", "build", "-o", bin, "./cmd/coordd")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/coordd: %w\n%s", err, out)
		}
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freeport.Get(); err != nil {
			return nil, err
		}
	}
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(bin,
		"--data-dir", filepath.Join(dir, "data"),
		"--grpc-addr", grpcAddr,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		"--etcd-client-url", "unix://"+filepath.Join(dir, "etcd.sock"))
	log, err := os.Create(filepath.Join(dir, "coordd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(err, log.Close())
	}
	exited := make(chan struct{}) // closed once cmd.Wait returned waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop = func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		return errors.Join(waitErr, log.Close())
	}
	if err := ready(grpcAddr, exited); err != nil {
		logged, _ := os.ReadFile(log.Name())
		return nil, errors.Join(fmt.Errorf("%w; its log:\n%s", err, logged), stop())
	}
	endpoints = []string{grpcAddr}
	return stop, nil
}

// ready waits until the daemon at addr grants a session, or it exits.
func ready(addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait.Bound(60*time.Second))
	defer cancel()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{addr}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	for {
		s, err := c.NewSession(ctx)
		if err == nil {
			return s.Close(ctx)
		}
		select {
		case <-exited:
			return errors.New("coordd exited before it answered")
		case <-ctx.Done():
			return fmt.Errorf("coordd did not grant a session within %v: %w", wait.Bound(60*time.Second), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
