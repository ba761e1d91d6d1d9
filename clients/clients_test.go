// Package clients_test runs the test suites of the clients beyond Go
// (clients/python, clients/typescript) against a real coordd, as part of
// make test. Each suite gets the daemon's gRPC address in COORDD_ENDPOINT
// and its HTTP address in COORDD_HTTP. The clients are tested as users
// install them: the Python suite imports the wheel built from the sdist,
// installed into a fresh virtual environment; the TypeScript scenarios
// after the node:test suite import npm pack's tarball, installed into an
// empty project.
//
// A suite whose tools are missing (Debian's python3-grpcio and
// python3-protobuf; Node.js and npm) is skipped, unless COORDD_REQUIRE_TOOLS
// is set, as in CI, where it fails instead.
package clients_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/chaos"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
	"github.com/coordd/coordd/internal/testkit/testcerts"
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

// run runs a command in dir with the daemon's addresses (and in
// COORDD_OTHER_ENDPOINT other's, a daemon of another cluster, when set),
// for at most 5 minutes, and fails the test with its output if it fails.
func run(t *testing.T, d, other *coorddtest.Daemon, dir string, name string, args ...string) {
	t.Helper()
	runEnv(t, d, other, dir, nil, name, args...)
}

// runEnv is run with env added to the command's environment.
func runEnv(t *testing.T, d, other *coorddtest.Daemon, dir string, env []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(5*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "COORDD_ENDPOINT="+d.GRPCAddr, "COORDD_HTTP="+d.HTTPAddr)
	cmd.Env = append(cmd.Env, env...)
	if other != nil {
		cmd.Env = append(cmd.Env, "COORDD_OTHER_ENDPOINT="+other.GRPCAddr)
	}
	if os.Getenv("COORDD_HANDOVERS") == "" {
		// The told-first tests' hand-overs per path: 300 in the suite (the
		// Go test runs 1,000); COORDD_HANDOVERS=1000 for the full count.
		cmd.Env = append(cmd.Env, "COORDD_HANDOVERS=300")
	}
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
		run(t, d, nil, dir, "npm", "ci", "--no-audit", "--no-fund")
	}
	run(t, d, coorddtest.Start(t), dir, "npm", "test") // it builds first
	// The scenarios below run against the package as a user installs it:
	// npm pack's tarball, installed into an empty project.
	app := installedTypeScript(t, d, dir)
	t.Run("TLS with a CA bundle", func(t *testing.T) {
		tlsDir := t.TempDir()
		caFile, certFile, keyFile := serverCerts(t, tlsDir)
		td := coorddtest.Start(t, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Minute))
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", "--input-type=module", "-e", `
import { readFileSync } from "node:fs";
import { Client } from "@coordd/client";
const client = new Client({ endpoints: [process.env.COORDD_TLS_ENDPOINT], tls: { ca: readFileSync(process.env.COORDD_CA_FILE) } });
const session = await client.session({ ttl: 5 });
const lock = await session.lock("tls/ts");
console.log(lock.token > 0n ? "locked over TLS" : "no token");
await client.close();
`)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "COORDD_TLS_ENDPOINT="+td.GRPCAddr, "COORDD_CA_FILE="+caFile)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "locked over TLS") {
			t.Fatalf("the TypeScript client over TLS: %v\n%s", err, out)
		}
	})
	t.Run("waiting calls leave a member cut from its peers", func(t *testing.T) {
		waitThroughCut(t, app, "node", "--input-type=module", "-e", `
import { Client } from "@coordd/client";
const client = new Client({ endpoints: process.env.COORDD_ENDPOINTS.split(",") });
const session = await client.session({ ttl: 3 });
const lock = await session.lock(process.env.COORDD_LOCK, { timeoutMs: 60000 });
console.log(String(lock.token));
await client.close();
`)
	})
}

// The Python client's unittest suite, with Debian's python3.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := "/usr/bin/python3"
	err := exec.Command(python, "-c", "import grpc, google.protobuf").Run()
	need(t, "Debian's python3 with python3-grpcio and python3-protobuf is not installed (apt-get install python3-grpcio python3-protobuf)", err == nil)
	err = exec.Command(python, "-c", "import setuptools, wheel, pip, venv").Run()
	need(t, "Debian's python3 cannot build and install a wheel (apt-get install python3-pip python3-setuptools python3-wheel python3-venv)", err == nil)
	d := coorddtest.Start(t)
	// The suite runs against the package as a user installs it: the wheel
	// built from the sdist, in a fresh virtual environment, from outside
	// the source tree (support.py refuses the source tree's package when
	// COORDD_TEST_INSTALLED is set).
	py, home := installedPython(t, python)
	tests, err := filepath.Abs(filepath.Join("python", "tests"))
	if err != nil {
		t.Fatal(err)
	}
	runEnv(t, d, coorddtest.Start(t), home, []string{"COORDD_TEST_INSTALLED=1"}, py, "-m", "unittest", "discover", "-s", tests, "-t", tests, "-v")
	t.Run("waiting calls leave a member cut from its peers", func(t *testing.T) {
		waitThroughCut(t, home, py, "-c", `
import os, coordd
with coordd.Client(os.environ["COORDD_ENDPOINTS"].split(",")) as client:
    with client.session(ttl=3) as session:
        with session.lock(os.environ["COORDD_LOCK"], timeout=60) as held:
            print(held.token)
`)
	})
}

// installedPython builds the Python client's sdist and, from it, its wheel
// (offline, with python's own setuptools: no build isolation), installs the
// wheel into a fresh virtual environment that sees the system's grpcio and
// protobuf, and returns that environment's python and a directory outside
// the source tree to run it in.
func installedPython(t *testing.T, python string) (py, home string) {
	t.Helper()
	tmp := t.TempDir()
	src, dist := filepath.Join(tmp, "src"), filepath.Join(tmp, "dist")
	if err := os.CopyFS(src, os.DirFS("python")); err != nil {
		t.Fatal(err)
	}
	quiet(t, src, python, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])", dist)
	quiet(t, tmp, python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "--wheel-dir", dist, only(t, dist, "coordd-*.tar.gz"))
	venv := filepath.Join(tmp, "venv")
	quiet(t, tmp, python, "-m", "venv", "--system-site-packages", "--without-pip", venv)
	py = filepath.Join(venv, "bin", "python")
	quiet(t, tmp, py, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", only(t, dist, "coordd-*-py3-none-any.whl"))
	return py, tmp
}

// installedTypeScript packs the TypeScript client (built in dir) with npm
// pack and installs the tarball into an empty project, and returns that
// project's directory, where "@coordd/client" imports the installed copy.
// Its dependencies come from npm's cache when npm ci filled it.
func installedTypeScript(t *testing.T, d *coorddtest.Daemon, dir string) string {
	t.Helper()
	tmp := t.TempDir()
	run(t, d, nil, dir, "npm", "pack", "--pack-destination", tmp)
	app := filepath.Join(tmp, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name": "app", "private": true, "type": "module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, d, nil, app, "npm", "install", "--no-audit", "--no-fund", "--prefer-offline", only(t, tmp, "coordd-client-*.tgz"))
	return app
}

// only returns the one file of dir that matches pattern, or fails.
func only(t *testing.T, dir, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil || len(m) != 1 {
		t.Fatalf("%s in %s: %v, %v; want one file", pattern, dir, m, err)
	}
	return m[0]
}

// quiet runs a command in dir, and fails the test with its output if it
// fails.
func quiet(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out)
	}
}

// waitThroughCut runs a client program (in dir) whose lock acquire waits on
// the member that leads etcd in a three-member cluster when that member's
// peer port is frozen (its clients still reach it: it hears its peers and
// is not heard). The program gets the endpoints in COORDD_ENDPOINTS, that
// member's first (the clients start on their first endpoint), and the
// lock's name in COORDD_LOCK, and prints its token once granted. The
// holder, a Go client of the other two members, releases after the cut:
// the member must end the waiting call (UNAVAILABLE) and the client retry
// it elsewhere, while the cut lasts.
func waitThroughCut(t *testing.T, dir, name string, args ...string) {
	c := chaos.StartCluster(t, coorddtest.Build(t), t.TempDir(), 3, chaos.Timing{Heartbeat: 10 * time.Millisecond, Election: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(2*time.Minute))
	defer cancel()
	cut, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all := c.ClientEndpoints()
	endpoints := []string{all[cut]}
	for i, ep := range all {
		if i != cut {
			endpoints = append(endpoints, ep)
		}
	}
	holder, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints[1:]})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close() }()
	s, err := holder.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const lock = "gray/cut"
	held, err := s.Lock(ctx, lock)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "COORDD_ENDPOINTS="+strings.Join(endpoints, ","), "COORDD_LOCK="+lock)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	wait.Within(t, time.Minute, "the program's acquire to wait", func() bool {
		st, err := holder.Admin().DescribeLock(ctx, lock)
		return err == nil && len(st.Waiters) == 1
	})
	c.Members[cut].Peer.Freeze()
	defer c.Members[cut].Peer.Thaw()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("%s: %v\n%s%s", name, err, out.String(), errs.String())
	}
	token, err := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
	if err != nil || token <= int64(held.Token()) {
		t.Fatalf("%s printed %q, want a token above the holder's %d\n%s", name, out.String(), held.Token(), errs.String())
	}
}

// serverCerts writes a CA and a server certificate for localhost and
// 127.0.0.1 it signed, and returns their files.
func serverCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	ca, err := testcerts.NewCA("coordd-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(testcerts.Options{CommonName: "coordd", Server: true})
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string][]byte{caFile: ca.PEM, certFile: cert, keyFile: key} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}
