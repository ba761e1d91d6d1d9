// Package clients_test runs the test suites of the clients beyond Go
// (clients/python, clients/typescript) against a real coordd, as part of
// make test. Each suite gets the daemon's gRPC address in COORDD_ENDPOINT
// and its HTTP address in COORDD_HTTP.
//
// A suite whose tools are missing (Debian's python3-grpcio and
// python3-protobuf; Node.js and npm) is skipped, unless COORDD_REQUIRE_TOOLS
// is set, as in CI, where it fails instead.
package clients_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testkit/coorddtest"
)

// need skips (or, in CI, fails) the test when a tool is missing.
func need(t *testing.T, why string, ok bool) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("COORDD_REQUIRE_TOOLS") != "" {
		t.Fatalf("%s, and COORDD_REQUIRE_TOOLS is set", why)
	}
	t.Skip(why)
}

// run runs a command in dir with the daemon's addresses, for at most
// 5 minutes, and fails the test with its output if it fails.
func run(t *testing.T, d *coorddtest.Daemon, dir string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "COORDD_ENDPOINT="+d.GRPCAddr, "COORDD_HTTP="+d.HTTPAddr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out)
	}
	t.Logf("%s %v:\n%s", name, args, out)
}

// The TypeScript client's node:test suite: npm ci when its packages are
// not installed yet, then its build and its tests (npm test does both).
func TestTypeScriptClient(t *testing.T) {
	t.Parallel()
	_, nodeErr := exec.LookPath("node")
	_, npmErr := exec.LookPath("npm")
	need(t, "Node.js and npm are not installed", nodeErr == nil && npmErr == nil)
	d := coorddtest.Start(t)
	dir := "typescript"
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		run(t, d, dir, "npm", "ci", "--no-audit", "--no-fund")
	}
	run(t, d, dir, "npm", "test") // it builds first
}

// The Python client's unittest suite, with Debian's python3.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := "/usr/bin/python3"
	err := exec.Command(python, "-c", "import grpc, google.protobuf").Run()
	need(t, "Debian's python3 with python3-grpcio and python3-protobuf is not installed (apt-get install python3-grpcio python3-protobuf)", err == nil)
	d := coorddtest.Start(t)
	run(t, d, "python", python, "-m", "unittest", "discover", "-s", "tests", "-v")
}
