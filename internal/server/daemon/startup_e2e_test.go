package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	zapobserver "go.uber.org/zap/zaptest/observer"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/daemontest"
)

// A second daemon on a data dir in use fails at once and says so, instead
// of blocking inside etcd while it holds its ports.
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	first := testConfig(t)
	start(t, first)

	second := testConfig(t)
	second.DataDir = first.DataDir
	second.GRPCAddr = freeport.Addr(t)
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
	defer cancel()
	d, err := daemon.Start(ctx, second)
	if err == nil {
		_ = d.Stop(context.Background())
		t.Fatal("a second daemon started on a data dir in use")
	}
	if !errors.Is(err, daemon.ErrDataDirInUse) {
		t.Fatalf("Start = %v, want ErrDataDirInUse (not a wait or an etcd error)", err)
	}
	t.Logf("refused: %v", err)
	// It holds none of its ports.
	l, lerr := net.Listen("tcp", second.GRPCAddr)
	if lerr != nil {
		t.Fatalf("the refused daemon holds its gRPC address: %v", lerr)
	}
	_ = l.Close()
}

// A taken port fails the start before etcd has created anything in the
// data dir, so fixing the port and starting again is a first start.
func TestTakenPortLeavesTheDataDirUntouched(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", freeport.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taken.Close() })
	for _, which := range []string{"grpc", "http"} {
		cfg := testConfig(t)
		if which == "grpc" {
			cfg.GRPCAddr = taken.Addr().String()
		} else {
			cfg.HTTPAddr = taken.Addr().String()
		}
		d, err := daemon.Start(t.Context(), cfg)
		if err == nil {
			_ = d.Stop(context.Background())
			t.Fatalf("%s: started on a taken port", which)
		}
		if _, serr := os.Stat(filepath.Join(cfg.DataDir, "etcd")); !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("%s port taken (%v), yet etcd's data dir exists: %v", which, err, serr)
		}
		// The lock is released: a start with a free port succeeds.
		cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
		start(t, cfg)
	}
}

// A leader stopped alone hands leadership to another member; members
// stopped together stop quickly: the etcd leader does not wait out etcd's
// request timeout (5 s + two election timeouts) for a leadership hand-off
// that members which are stopping themselves cannot take.
func TestClusterStopsTogetherQuickly(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	ds := startCluster(t, 3)

	// The leader stopped alone hands leadership over: another member leads
	// at once, without waiting an election timeout.
	leader := -1
	for i, d := range ds {
		if d.Etcd().Server.Leader() == d.Etcd().Server.MemberID() {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no member leads")
	}
	old := ds[leader].Etcd().Server.MemberID()
	if err := ds[leader].Stop(context.Background()); err != nil {
		t.Fatalf("stopping the leader: %v", err)
	}
	ds = append(ds[:leader], ds[leader+1:]...)
	if l := ds[0].Etcd().Server.Leader(); l == 0 || l == old {
		t.Errorf("right after the leader's stop, the leader is %s: no hand-off", l)
	}

	var wg sync.WaitGroup
	took := make([]time.Duration, len(ds))
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			if err := d.Stop(context.Background()); err != nil {
				t.Errorf("member %d: Stop: %v", i, err)
			}
			took[i] = time.Since(begin)
		}()
	}
	wg.Wait()
	for i, d := range took {
		// etcd's own hand-off would wait its request timeout, 5.2 s with
		// these 100 ms election timeouts; coordd's is bounded at 200 ms,
		// plus up to 1 s closing etcd's peer connections (up to 4 s seen
		// once in many runs under -race on 2 cores).
		if d >= wait.Bound(5*time.Second) {
			t.Errorf("member %d took %s to stop", i, d)
		}
	}
	t.Logf("stop times: %v", took)
}

// The daemon's log speaks to an operator: the ready line says where
// everything is, and neither etcd's warnings about coordd's deliberate
// choices nor a client's unknown session id fill it with etcd dumps.
func TestLogIsQuietAndSaysWhereThingsAre(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	core, logs := zapobserver.New(zap.InfoLevel)
	cfg.Logger = zap.New(core)
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())

	ready := logs.FilterMessage("coordd is ready").All()
	if len(ready) != 1 {
		t.Fatalf("%d ready lines, want 1", len(ready))
	}
	fields := ready[0].ContextMap()
	for _, k := range []string{"grpc", "http", "data-dir", "etcd-client", "etcd-peers", "stop"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("ready line lacks %q: %v", k, fields)
		}
	}

	for _, e := range logs.All() {
		for _, noise := range []string{"single port", "simple token"} {
			if strings.Contains(e.Message, noise) {
				t.Errorf("etcd's warning about coordd's deliberate choice was logged: %s", e.Message)
			}
		}
	}

	// Calls naming a session that does not exist: a client error, answered
	// SESSION_NOT_FOUND, nothing for the daemon's log.
	before := logs.Len()
	base := "http://" + d.HTTPAddr()
	for _, c := range []struct{ path, body string }{
		{"/v1/locks:acquire", `{"name":"x","sessionId":"00000000000000ff"}`},
		{"/v1/elections:campaign", `{"name":"x","sessionId":"00000000000000ff","value":"v"}`},
	} {
		if r := call(t, "POST", base+c.path, c.body); reason(r) != "SESSION_NOT_FOUND" {
			t.Fatalf("%s = %d %v, want SESSION_NOT_FOUND", c.path, r.status, r.body)
		}
	}
	if _, err := c.Admin().GetSession(t.Context(), "00000000000000fe"); err == nil {
		t.Fatal("GetSession of an unknown id succeeded")
	}
	// Other warnings may come from a busy machine (a slow read); none may
	// be about these requests.
	for _, e := range logs.All()[before:] {
		if e.Message == "apply request took too long" {
			continue // etcd's note of a slow apply: the machine, not these requests
		}
		if _, dump := e.ContextMap()["request"]; dump || strings.Contains(fmt.Sprint(e.ContextMap()), "lease not found") {
			t.Errorf("log entry for a client's unknown session: %s %v", e.Message, e.ContextMap())
		}
	}
}

// While a member waits for its cluster's quorum, its bound ports turn
// connections away at once (so clients try another member instead of
// hanging), and cancelling the start (SIGTERM) ends it promptly.
func TestStartingMemberRefusesAndCancels(t *testing.T) {
	// Not parallel: it bounds how long something takes (fail-over, a stop,
	// a start), which tests running beside it would stretch.
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cfg := testConfig(t)
	cfg.GRPCAddr, cfg.HTTPAddr = freeport.Addr(t), freeport.Addr(t)
	// Two peers that never start: no quorum, so Start waits.
	cfg.InitialCluster = "n1=" + cfg.ListenPeerURLs[0] + ",n2=" + freeport.URL(t) + ",n3=" + freeport.URL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan error, 1)
	go func() {
		d, err := daemon.Start(ctx, cfg)
		if err == nil {
			_ = d.Stop(context.Background()) // the test fails: Start should not have returned
		}
		started <- err
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	var refused int
	for refused < 3 {
		select {
		case err := <-started:
			t.Fatalf("Start returned without a quorum: %v", err)
		default:
		}
		begin := time.Now()
		resp, err := client.Get("http://" + cfg.HTTPAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			t.Fatalf("a starting member answered /readyz: %s", resp.Status)
		}
		if took := time.Since(begin); took > wait.Bound(2*time.Second) {
			t.Fatalf("a connection to a starting member hung for %s: %v", took, err)
		}
		if c, err := net.DialTimeout("tcp", cfg.HTTPAddr, time.Second); err == nil {
			// Bound (or refused): either way nothing serves it.
			if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if n, rerr := c.Read(make([]byte, 1)); rerr == nil || n > 0 {
				t.Fatal("a starting member sent data")
			}
			_ = c.Close()
			refused++
		} else {
			refused++ // not bound yet: refused by the kernel
		}
	}
	begin := time.Now()
	cancel()
	select {
	case err := <-started:
		if err == nil {
			t.Fatal("Start succeeded without a quorum")
		}
		t.Logf("start cancelled after %s: %v", time.Since(begin).Round(time.Millisecond), err)
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("a cancelled start did not return within 10s")
	}
}

// An etcd port that is taken names its flag, as the gRPC and HTTP ports
// do, and a start that fails leaves no data dir behind that it made
// itself (only its lock file would be in it).
func TestTakenEtcdPortNamesItsFlag(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", freeport.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taken.Close() })
	url := "http://" + taken.Addr().String()
	for _, c := range []struct {
		flag             string
		clientURL, peers string
	}{
		{"--listen-peer-urls", freeport.Socket(t), url},
		{"--etcd-client-url", url, freeport.URL(t)},
	} {
		dir := filepath.Join(t.TempDir(), "fresh")
		cfg := daemontest.Config(dir, c.clientURL, c.peers, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
		d, err := daemon.Start(t.Context(), cfg)
		if err == nil {
			_ = d.Stop(context.Background())
			t.Fatalf("%s: started on a taken port", c.flag)
		}
		if !strings.Contains(err.Error(), c.flag) || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("%s taken: %v; want the flag named", c.flag, err)
		}
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			entries, _ := os.ReadDir(dir)
			t.Errorf("%s taken: the data dir the failed start made is left behind (%v): %v", c.flag, serr, entries)
		}
	}
	// A data dir that was there before the failed start stays.
	dir := t.TempDir()
	cfg := daemontest.Config(dir, freeport.Socket(t), url, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if d, err := daemon.Start(t.Context(), cfg); err == nil {
		_ = d.Stop(context.Background())
		t.Fatal("started on a taken peer port")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("a data dir that existed before the failed start: %v", err)
	}
}

// A start that fails late (here on a secret key file it cannot read, after
// etcd, the group committer and the lock and election managers are up)
// stops what it built, by the steps Stop takes: the data dir and the etcd
// member it started are free for the next start. (Goroutines it left
// behind would fail the package's goleak check.)
func TestALateFailedStartStopsWhatItBuilt(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.SecretKeyFile = filepath.Join(t.TempDir(), "coordd-secret.keys")
	if err := os.WriteFile(cfg.SecretKeyFile, []byte("not a key line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(t.Context(), cfg)
	if err == nil {
		_ = d.Stop(context.Background())
		t.Fatal("started with an unreadable secret key file")
	}
	if !strings.Contains(err.Error(), "--secret-key-file") {
		t.Fatalf("Start = %v, want the secret key file's error", err)
	}
	t.Logf("Start: %v", err)
	cfg.SecretKeyFile = ""
	start(t, cfg)
}
