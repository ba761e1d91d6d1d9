package daemon_test

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/server/tlsfiles"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/testkit/testcerts"
)

// dialUnixEnv makes the test binary a probe instead of a test run: it
// dials the unix socket the variable names and exits 0 if it connected,
// 3 if the kernel refused it for want of permission, 4 otherwise. The
// etcd port test runs it as another user.
const dialUnixEnv = "COORDD_TEST_DIAL_UNIX"

func dialUnixProbe() {
	path := os.Getenv(dialUnixEnv)
	if path == "" {
		return
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	switch {
	case err == nil:
		_ = c.Close()
		os.Exit(0)
	case errors.Is(err, syscall.EACCES):
		os.Exit(3)
	default:
		_, _ = io.WriteString(os.Stderr, err.Error())
		os.Exit(4)
	}
}

// The embedded etcd's client listener bypasses every coordd check, so by
// default it is a unix socket that only the daemon's user can reach: in a
// 0700 directory of the data dir, itself 0600. The daemon's user reaches
// etcd there (operators' etcdctl, the tests' compactions); another local
// user is refused by the kernel, while a socket open to everyone in the
// same place is reachable by that user (so the refusal is the
// permissions'). Under authentication a TCP etcd port is refused at start.
func TestEtcdClientPortIsTheDaemonUsersAlone(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	cfg.EtcdClientURL = "" // the default
	start(t, cfg)
	runDir := filepath.Join(cfg.DataDir, "run")
	socket := filepath.Join(runDir, "etcd.sock")
	for path, want := range map[string]os.FileMode{runDir: 0o700, socket: 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("the etcd client socket: %v", err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", path, got, want)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + socket}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	if _, err := cli.Get(t.Context(), "/coordd/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatalf("the daemon's own user reading etcd over the socket: %v", err)
	}

	// Another user: only root can act as one.
	if os.Geteuid() != 0 {
		t.Log("not root: the other-user check is skipped (the modes above are what it relies on)")
	} else {
		probe := asNobody(t)
		// A data dir others may enter (as one made by hand often is):
		// the run directory and the socket alone must keep them out.
		for _, p := range []string{filepath.Dir(cfg.DataDir), cfg.DataDir} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if code := probe(socket); code != 3 {
			t.Errorf("another local user dialing the etcd client socket: exit %d, want 3 (permission denied)", code)
		}
		open := filepath.Join(t.TempDir(), "open.sock")
		l, err := net.Listen("unix", open)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		for _, p := range []string{filepath.Dir(filepath.Dir(open)), filepath.Dir(open)} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(open, 0o777); err != nil {
			t.Fatal(err)
		}
		if code := probe(open); code != 0 {
			t.Errorf("another local user dialing a socket open to all: exit %d, want 0 (the probe works)", code)
		}
	}

	// A TCP port for etcd under authentication is refused, saying why.
	cfg = authConfig(t, testPolicy)
	cfg.EtcdClientURL = freeport.URL(t)
	if _, err := daemon.Start(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "must be a unix:// socket") {
		t.Errorf("a TCP etcd client URL under a policy: %v; want it refused", err)
	}
}

// asNobody copies the test binary where user nobody may run it and
// returns a function that runs it as the dialUnixEnv probe as nobody.
func asNobody(t *testing.T) func(socket string) int {
	t.Helper()
	dir, err := os.MkdirTemp("", "cdd-probe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probe")
	if err := os.WriteFile(bin, self, 0o755); err != nil { //nolint:gosec // the probe must be executable by nobody
		t.Fatal(err)
	}
	return func(socket string) int {
		cmd := exec.CommandContext(t.Context(), bin, "-test.run=^$")
		cmd.Env = []string{dialUnixEnv + "=" + socket}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if exit.ExitCode() == 4 {
				t.Logf("probe: %s", out)
			}
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatalf("running the probe as nobody: %v %s", err, out)
		}
		return 0
	}
}

// When the peer CA is also the API's client CA, every API client
// certificate would be a member's on the peer port: refused at start
// unless the members' certificates are named with PeerTLS.AllowedCNs.
func TestPeerCAThatSignsClientsNeedsAllowedNames(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "one CA for all")
	dir := t.TempDir()
	caFile := writeFile(t, dir, "ca.pem", ca.PEM)
	srvCert, srvKey := issue(t, ca, testcerts.Options{CommonName: "coordd", Server: true})
	peerCert, peerKey := issue(t, ca, testcerts.Options{CommonName: "member-1", Peer: true})
	cfg := authConfig(t, testPolicy)
	files, err := tlsfiles.Load(writeFile(t, dir, "server.pem", srvCert), writeFile(t, dir, "server-key.pem", srvKey), caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSFiles = files
	cfg.PeerTLS = daemon.PeerTLS{CertFile: writeFile(t, dir, "peer.pem", peerCert), KeyFile: writeFile(t, dir, "peer-key.pem", peerKey),
		CAFile: writeFile(t, dir, "copy-of-ca.pem", ca.PEM)}
	cfg.ListenPeerURLs = []string{strings.Replace(cfg.ListenPeerURLs[0], "http://", "https://", 1)}
	if _, err := daemon.Start(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "--peer-allowed-cn") {
		t.Fatalf("a peer CA that is the client CA, no allowed names: %v; want it refused", err)
	}
}
