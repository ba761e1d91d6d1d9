package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
)

// Member is one coordd process of a Cluster. Its peers reach it through
// Peer and clients through Client, proxies that can cut it off.
type Member struct {
	Name    string
	GRPC    string // direct gRPC address
	HTTP    string
	EtcdURL string // the embedded etcd's client URL (loopback)
	Peer    *tcpproxy.Proxy
	Client  *tcpproxy.Proxy

	bin, log string
	args     []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Cluster is a real coordd cluster of separate processes on loopback.
type Cluster struct {
	Members []*Member
}

// Quota is the members' database quota: small, so that the matrix can fill
// it (a full disk, as etcd sees one), large enough for every other fault.
const Quota = 32 << 20

// Timing is the members' raft timing.
type Timing struct {
	Heartbeat, Election time.Duration
}

// LogTail returns the last n lines of the member's log (the warnings and
// errors of every run of it), for a failed test to print: the log goes
// with the test's temporary directory.
func (m *Member) LogTail(n int) string {
	raw, err := os.ReadFile(m.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// StartCluster starts n coordd processes (the binary bin) that form one
// cluster, and stops them when the test ends. Each member's log goes to
// <dir>/<name>.log. extra, if given, adds flags to member i's (e.g.
// --wal-dir).
func StartCluster(t testing.TB, bin, dir string, n int, timing Timing, extra ...func(i int) []string) *Cluster {
	t.Helper()
	c := &Cluster{}
	var initial []string
	for i := range n {
		listen := freeport.Addr(t)
		m := &Member{
			Name: fmt.Sprintf("m%d", i), GRPC: freeport.Addr(t), HTTP: freeport.Addr(t),
			EtcdURL: "http://" + freeport.Addr(t), Peer: tcpproxy.Start(t, listen), bin: bin,
		}
		m.Client = tcpproxy.Start(t, m.GRPC)
		m.log = filepath.Join(dir, m.Name+".log")
		m.args = []string{
			"--name", m.Name, "--data-dir", filepath.Join(dir, m.Name),
			"--grpc-addr", m.GRPC, "--http-addr", m.HTTP, "--etcd-client-url", m.EtcdURL,
			"--listen-peer-urls", "http://" + listen, "--initial-advertise-peer-urls", "http://" + m.Peer.Addr(),
			"--etcd-heartbeat-interval", timing.Heartbeat.String(), "--etcd-election-timeout", timing.Election.String(),
			"--quota-backend-bytes", strconv.Itoa(Quota),
			"--log-level", "warn",
		}
		for _, e := range extra {
			m.args = append(m.args, e(i)...)
		}
		initial = append(initial, m.Name+"=http://"+m.Peer.Addr())
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.args = append(m.args, "--initial-cluster", strings.Join(initial, ","))
		if err := m.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stop)
	for _, m := range c.Members {
		if err := m.WaitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// ClientEndpoints are the members' gRPC addresses behind their client
// proxies.
func (c *Cluster) ClientEndpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Client.Addr())
	}
	return out
}

// EtcdURLs are the members' etcd client URLs.
func (c *Cluster) EtcdURLs() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.EtcdURL)
	}
	return out
}

// Leader returns the index of the member that is etcd's leader, asking
// each running member until ctx ends.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		for i, m := range c.Members {
			if !m.Running() {
				continue
			}
			if lead, err := m.isLeader(ctx); err == nil && lead {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no etcd leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MoveLeader hands etcd's leadership from its leader to the next running
// member (etcd's MoveLeader).
func (c *Cluster) MoveLeader(ctx context.Context) error {
	i, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	lead := c.Members[i]
	for k := 1; k < len(c.Members); k++ {
		next := c.Members[(i+k)%len(c.Members)]
		if !next.Running() {
			continue
		}
		id, err := next.memberID(ctx)
		if err != nil {
			return err
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{lead.EtcdURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = cli.MoveLeader(mctx, id)
		return err
	}
	return errors.New("no running member to hand etcd's leadership to")
}

func (m *Member) memberID(ctx context.Context) (uint64, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.EtcdURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer func() { _ = cli.Close() }()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := cli.Status(sctx, m.EtcdURL)
	if err != nil {
		return 0, err
	}
	return st.Header.MemberId, nil
}

func (m *Member) isLeader(ctx context.Context) (bool, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.EtcdURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return false, err
	}
	defer func() { _ = cli.Close() }()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := cli.Status(sctx, m.EtcdURL)
	if err != nil {
		return false, err
	}
	return st.Leader == st.Header.MemberId, nil
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", m.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(exited) }() // how it ended is in its log
	m.cmd, m.exited = cmd, exited
	return nil
}

// WaitReady waits until the member's /readyz answers 200.
func (m *Member) WaitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if resp, err := hc.Get("http://" + m.HTTP + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("member %s not ready after %s; its log: %s", m.Name, within, m.log)
}

// Running reports whether the member's process runs (it may be paused).
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// Kill kills the member's process (SIGKILL) and waits for it to be gone.
func (m *Member) Kill() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process dies only once it runs
	_ = cmd.Process.Kill()
	<-exited
}

// Stop stops the member gracefully (SIGTERM: coordd finishes the calls in
// flight and leaves), killing it if it has not stopped within 15s, and
// waits for it to be gone.
func (m *Member) Stop() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts a killed or stopped member again on its data.
func (m *Member) Restart() error { return m.start() }

// Pause stops the member's process (SIGSTOP); Resume continues it.
func (m *Member) Pause() { m.signal(syscall.SIGSTOP) }

// Resume continues a paused member.
func (m *Member) Resume() { m.signal(syscall.SIGCONT) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = m.cmd.Process.Signal(sig)
	}
}

// Partition cuts the member off from its peers and its clients: traffic
// through its proxies is dropped (connections stay open, as in a network
// partition). Heal forwards it again.
func (m *Member) Partition() { m.Peer.Freeze(); m.Client.Freeze() }

// Heal ends a partition.
func (m *Member) Heal() { m.Peer.Thaw(); m.Client.Thaw() }

// stop stops every member gracefully (SIGTERM), killing those that do not
// stop within 15s.
func (c *Cluster) stop() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Go(m.Stop)
	}
	wg.Wait()
}
