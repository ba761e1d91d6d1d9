// Package coorddtest runs the real coordd binary for tests of programs that
// live outside cmd/coordd (coordctl, the examples): built from this module,
// on free loopback ports, with its data in a temp dir, fast raft ticks, and
// stopped with SIGTERM when the test ends. It is for tests only.
package coorddtest

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/freeport"
)

// Daemon is a running coordd process.
type Daemon struct {
	GRPCAddr string
	HTTPAddr string
	bin      string
	args     []string
	cmd      *exec.Cmd
	exited   chan struct{}
	logs     *strings.Builder
}

// Build compiles coordd into a temp dir of tb and returns its path.
func Build(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "coordd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/coordd/coordd/cmd/coordd").CombinedOutput()
	if err != nil {
		tb.Fatalf("coorddtest: build coordd: %v\n%s", err, out)
	}
	return bin
}

// Start builds and starts coordd; extra flags are appended. It stops the
// daemon when the test ends.
func Start(tb testing.TB, extra ...string) *Daemon {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds and runs the coordd binary")
	}
	d := &Daemon{GRPCAddr: freeport.Addr(tb), HTTPAddr: freeport.Addr(tb), bin: Build(tb)}
	d.args = append([]string{
		"--data-dir", tb.TempDir(), "--grpc-addr", d.GRPCAddr, "--http-addr", d.HTTPAddr,
		"--etcd-client-url", "http://" + freeport.Addr(tb), "--listen-peer-urls", "http://" + freeport.Addr(tb),
		"--etcd-heartbeat-interval", "10ms", "--etcd-election-timeout", "100ms", "--log-level", "warn",
	}, extra...)
	d.start(tb)
	tb.Cleanup(d.Stop)
	return d
}

func (d *Daemon) start(tb testing.TB) {
	tb.Helper()
	d.logs = &strings.Builder{}
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		tb.Fatalf("coorddtest: start: %v", err)
	}
	d.exited = make(chan struct{})
	// Only that it is gone counts, not how: a test that cares reads the logs.
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := d.probe().Get(d.scheme() + "://" + d.HTTPAddr + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-d.exited:
			tb.Fatalf("coorddtest: coordd exited before it was ready:\n%s", d.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("coorddtest: coordd not ready after 30s:\n%s", d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the daemon gracefully (SIGTERM) and waits for it. Calling it
// again does nothing.
func (d *Daemon) Stop() {
	if d.cmd == nil {
		return
	}
	// Either fails only when the process has exited already, and then
	// exited is closed (or about to be).
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}

// Restart stops the daemon and starts it again on the same ports and data.
func (d *Daemon) Restart(tb testing.TB) {
	tb.Helper()
	d.Stop()
	d.start(tb)
}

// String describes the daemon for test messages.
func (d *Daemon) String() string {
	return fmt.Sprintf("coordd grpc=%s http=%s", d.GRPCAddr, d.HTTPAddr)
}

// Env returns the environment for a child process that should talk to d.
func (d *Daemon) Env() []string { return append(os.Environ(), "COORDD_ENDPOINTS="+d.GRPCAddr) }

// probe polls /readyz; its timeout keeps a daemon that hangs from hanging
// the poll past its own deadline.
var probe = &http.Client{Timeout: 2 * time.Second}

// tlsProbe is probe for a daemon serving TLS: it asks only whether the
// daemon is ready, so it does not check the test's certificate.
var tlsProbe = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a readiness poll of the test's own daemon
}}

// serveTLS reports whether the daemon was started with --tls-cert-file.
func (d *Daemon) serveTLS() bool { return slices.Contains(d.args, "--tls-cert-file") }

func (d *Daemon) scheme() string {
	if d.serveTLS() {
		return "https"
	}
	return "http"
}

func (d *Daemon) probe() *http.Client {
	if d.serveTLS() {
		return tlsProbe
	}
	return probe
}
