package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// TestMain doubles as the coordd binary when COORDD_TEST_RUN_MAIN is set, so
// tests can run the real command (flags, environment, signals) as a process.
func TestMain(m *testing.M) {
	if os.Getenv("COORDD_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"coordd"}, strings.Fields(os.Getenv("COORDD_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// The real command: configured through COORDD_* variables (a flag on the
// command line wins), ready on /readyz, and stopped gracefully by SIGTERM
// with exit code 0.
func TestCommandEnvAndSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon as a process")
	}
	httpAddr := freeport.Addr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"COORDD_TEST_RUN_MAIN=1",
		"COORDD_TEST_ARGS=--http-addr "+httpAddr+" --name envtest",
		"COORDD_DATA_DIR="+t.TempDir(),
		"COORDD_GRPC_ADDR="+freeport.Addr(t),
		"COORDD_HTTP_ADDR=127.0.0.1:1", // overridden by the flag above
		"COORDD_ETCD_CLIENT_URL=http://"+freeport.Addr(t),
		"COORDD_LISTEN_PEER_URLS=http://"+freeport.Addr(t),
		"COORDD_ETCD_ELECTION_TIMEOUT=100ms",
		"COORDD_ETCD_HEARTBEAT_INTERVAL=10ms",
		"COORDD_LOG_FORMAT=json",
	)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := probe.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("coordd exited before it was ready: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			err := kill(cmd, exited)
			t.Fatalf("coordd not ready on the --http-addr given as a flag (killed: %v):\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("coordd exited with %v after SIGTERM:\n%s", err, logs.String())
		}
	case <-time.After(wait.Bound(20 * time.Second)):
		err := kill(cmd, exited)
		t.Fatalf("coordd did not stop within 20s of SIGTERM (killed: %v):\n%s", err, logs.String())
	}
	for _, want := range []string{`"msg":"coordd is ready","pid":` + strconv.Itoa(cmd.Process.Pid), `"msg":"coordd stopped"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("JSON logs lack %s:\n%s", want, logs.String())
		}
	}
}

// kill kills coordd after a failed check and returns how it exited, from
// exited (cmd.Wait). It does not wait if the process could not be killed.
func kill(cmd *exec.Cmd, exited <-chan error) error {
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("could not kill it: %w", err)
	}
	return <-exited
}

// A malformed environment value is an error that names the variable.
func TestApplyEnvRejectsBadValue(t *testing.T) {
	cmd := newCommand()
	t.Setenv("COORDD_SHUTDOWN_TIMEOUT", "soon")
	err := applyEnv(cmd.Flags())
	if err == nil || !strings.Contains(err.Error(), "COORDD_SHUTDOWN_TIMEOUT") {
		t.Fatalf("applyEnv = %v, want an error naming COORDD_SHUTDOWN_TIMEOUT", err)
	}
}

// A bad command line is said once, in plain words, with exit code 2; a bad
// configuration value with exit code 1. Nothing is started.
func TestBadInvocationIsSaidOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the command as a process")
	}
	for _, tt := range []struct {
		args, want string
		code       int
	}{
		{"--bogus", "coordd: unknown flag: --bogus (see coordd --help)\n", 2},
		{"extra", `coordd: unexpected argument "extra": coordd takes flags only (see coordd --help)` + "\n", 2},
		{"--etcd-election-timeout soon", `coordd: invalid argument "soon" for "--etcd-election-timeout" flag: time: invalid duration "soon" (see coordd --help)` + "\n", 2},
		{"--key-root bad", `coordd: invalid configuration: --key-root "bad" must start and end with /` + "\n", 1},
		{"--key-root bad --max-request-bytes 1", "coordd: invalid configuration: \n  - --key-root \"bad\" must start and end with /\n", 1},
		{"--peer-cert-file peer.pem", "coordd: invalid configuration: \n  - peer TLS needs all of --peer-cert-file, --peer-key-file and --peer-ca-file", 1},
		{"--peer-cert-file p.pem --peer-key-file k.pem --peer-ca-file ca.pem", "coordd: invalid configuration: \n  - --listen-peer-urls \"http://", 1},
	} {
		// Own ports and a deadline: a case that wrongly starts the daemon
		// fails here instead of hanging or taking the default ports.
		ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(30*time.Second))
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "COORDD_TEST_RUN_MAIN=1", "COORDD_TEST_ARGS="+tt.args+" --data-dir "+t.TempDir(),
			"COORDD_GRPC_ADDR="+freeport.Addr(t), "COORDD_HTTP_ADDR="+freeport.Addr(t),
			"COORDD_ETCD_CLIENT_URL="+freeport.URL(t), "COORDD_LISTEN_PEER_URLS="+freeport.URL(t))
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != tt.code {
			t.Errorf("coordd %s: %v, want exit code %d", tt.args, err, tt.code)
		}
		if !strings.HasPrefix(string(out), tt.want) || strings.Count(string(out), "coordd: ") != 1 {
			t.Errorf("coordd %s printed\n%s\nwant once:\n%s", tt.args, out, tt.want)
		}
	}
}

// probe polls /readyz with a timeout of its own.
var probe = &http.Client{Timeout: 2 * time.Second}

// coordd keygen writes a key outside any git work tree: --out makes a new
// file of mode 600; into a work tree (through --out or a standard output
// redirected to a file there) it refuses, writing nothing, unless
// --force; an existing file is never overwritten.
func TestKeygenKeepsKeysOutOfWorkTrees(t *testing.T) {
	outside, repo := t.TempDir(), t.TempDir()
	if err := os.Mkdir(repo+"/.git", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(repo+"/deploy", 0o755); err != nil {
		t.Fatal(err)
	}
	keygen := func(out *os.File, args ...string) error {
		cmd := keygenCommand()
		if out != nil {
			cmd.SetOut(out)
		}
		cmd.SetArgs(args)
		return cmd.Execute()
	}
	if err := keygen(nil, "--out", outside+"/secret.keys"); err != nil {
		t.Fatalf("keygen --out outside a work tree: %v", err)
	}
	if st, err := os.Stat(outside + "/secret.keys"); err != nil || st.Mode().Perm() != 0o600 || st.Size() == 0 {
		t.Fatalf("the key file: %v, %v; want a key of mode 600", st, err)
	}
	if err := keygen(nil, "--out", outside+"/secret.keys"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("keygen --out over an existing file: %v; want a refusal", err)
	}
	inTree := repo + "/deploy/secret.keys"
	if err := keygen(nil, "--out", inTree); err == nil || !strings.Contains(err.Error(), "git work tree "+repo) {
		t.Fatalf("keygen --out into a work tree: %v; want a refusal naming it", err)
	}
	if _, err := os.Stat(inTree); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused key file exists: %v", err)
	}
	redirected, err := os.OpenFile(repo+"/coordd-secret.keys", os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = redirected.Close() }()
	if err := keygen(redirected); err == nil || !strings.Contains(err.Error(), "git work tree") {
		t.Fatalf("keygen > a file in a work tree: %v; want a refusal", err)
	}
	if st, _ := redirected.Stat(); st.Size() != 0 {
		t.Fatalf("a refused keygen wrote %d bytes", st.Size())
	}
	if err := keygen(nil, "--out", inTree, "--force"); err != nil {
		t.Fatalf("keygen --out into a work tree --force: %v", err)
	}
}
