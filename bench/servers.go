package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

type daemon struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	etcdURL  string
	bin      string   // coordd's binary, for restart
	args     []string // its flags, for restart
	startup  time.Duration
}

// freePort asks the kernel for a free port and frees it again for coordd
// to bind, so another process may take it first. coordd can neither be
// handed a bound listener nor report which ports it bound to (its etcd
// ports included), and restart needs the same ports again.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// startCluster starts n coordd processes that form one cluster of
// embedded members on fresh ports (data dirs under dir), and waits until
// every one is ready. extra flags go to every member.
func startCluster(bin, dir string, n int, extra ...string) ([]*daemon, error) {
	type member struct{ name, grpc, http, etcd, peer string }
	ms := make([]member, n)
	var initial []string
	for i := range ms {
		ms[i] = member{fmt.Sprintf("m%d", i), fmt.Sprintf("127.0.0.1:%d", freePort()), fmt.Sprintf("127.0.0.1:%d", freePort()),
			fmt.Sprintf("http://127.0.0.1:%d", freePort()), fmt.Sprintf("http://127.0.0.1:%d", freePort())}
		initial = append(initial, ms[i].name+"="+ms[i].peer)
	}
	t0 := time.Now()
	var ds []*daemon
	stopAll := func() {
		for _, d := range ds {
			d.stop()
		}
	}
	for _, m := range ms {
		cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, m.name), "--name", m.name, "--grpc-addr", m.grpc, "--http-addr", m.http,
			"--etcd-client-url", m.etcd, "--listen-peer-urls", m.peer, "--initial-cluster", strings.Join(initial, ","),
			"--log-level", "error", "--enable-pprof")
		cmd.Args = append(cmd.Args, extra...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			stopAll()
			return nil, err
		}
		ds = append(ds, &daemon{cmd: cmd, grpcAddr: m.grpc, httpAddr: m.http, etcdURL: m.etcd, bin: bin, args: cmd.Args[1:]})
	}
	for _, d := range ds {
		if err := waitReady(d, "http://"+d.httpAddr+"/readyz", t0); err != nil {
			stopAll()
			return nil, err
		}
	}
	return ds, nil
}

// startDaemon starts coordd on fresh ports and data dir, with extra flags,
// and waits for /readyz.
func startDaemon(bin, dir string, extra ...string) (*daemon, error) {
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	cmd := exec.Command(bin, "--data-dir", dir, "--name", "bench", "--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--etcd-client-url", etcdURL, "--listen-peer-urls", peerURL, "--log-level", "error", "--enable-pprof")
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd, grpcAddr: grpcAddr, httpAddr: httpAddr, etcdURL: etcdURL, bin: bin, args: cmd.Args[1:]}
	scheme := "http"
	if slices.Contains(extra, "--tls-cert-file") {
		scheme = "https"
	}
	if err := waitReady(d, scheme+"://"+httpAddr+"/readyz", t0); err != nil {
		return nil, err
	}
	return d, nil
}

// cpuSeconds is the daemon's CPU time so far (user + system), or -1.
func (d *daemon) cpuSeconds() float64 { return procCPUSeconds(d.cmd.Process.Pid) }

// procCPUSeconds is process pid's CPU time so far (user + system), or -1.
func procCPUSeconds(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// After the command name in parentheses: fields 14 and 15 (utime,
	// stime) in clock ticks, 100 a second on Linux.
	_, rest, ok := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

func (d *daemon) rssKiB() int { return procRSSKiB(d.cmd.Process.Pid) }

// restart stops coordd and starts it again on the same ports and data,
// and returns when it is ready.
func (d *daemon) restart() error {
	d.stop()
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := d.cmd.Start(); err != nil {
		return err
	}
	return waitReady(d, "http://"+d.httpAddr+"/readyz", t0)
}

// stop stops the server (SIGTERM) and waits for it to exit. One that does
// not exit cleanly gets a warning: the figures already taken still hold.
func (d *daemon) stop() {
	// Signal fails only when the process has exited already; Wait then
	// says how.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		what := "coordd"
		if d.grpcAddr == "" {
			what = "raw etcd member"
		}
		fmt.Fprintf(os.Stderr, "bench: warning: %s (pid %d) did not stop cleanly: %v\n", what, d.cmd.Process.Pid, err)
	}
}

// startRawMember starts this binary as a bare etcd member and waits until a
// linearizable read succeeds, the same check coordd's /readyz makes. The
// member binds port 0 and prints the client URL it got, so no port is
// picked here and freed for another process to take first. (Its etcd's
// JSON gateway, unused here, dials the configured :0 and fails.)
func startRawMember(self, dir string) (*daemon, error) {
	cmd := exec.Command(self, "-raw-member", dir+",http://127.0.0.1:0,http://127.0.0.1:0")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		d.stop()
		return nil, fmt.Errorf("raw etcd member: no client URL: %q, %w", line, err)
	}
	d.etcdURL = strings.TrimSpace(line)
	if err := waitReady(d, d.etcdURL+"/health", t0); err != nil {
		return nil, err
	}
	return d, nil
}

// waitReady polls url every 2ms until it answers 200, and records the time
// since t0 as the start-up time.
// readyTLS is the client TLS configuration of readiness probes to a
// daemon serving TLS (set by benchmarks that start one).
var readyTLS *tls.Config

func waitReady(d *daemon, url string, t0 time.Time) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: readyTLS}}
	defer hc.CloseIdleConnections()
	for {
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				d.startup = time.Since(t0)
				return nil
			}
		}
		if time.Since(t0) > 30*time.Second {
			d.stop()
			return fmt.Errorf("%s not ready after 30s", url)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func runRawMember(spec string) {
	parts := strings.Split(spec, ",")
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = parts[0]
	cu, _ := url.Parse(parts[1])
	pu, _ := url.Parse(parts[2])
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = "bench=" + pu.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: raw etcd:", err)
		os.Exit(1)
	}
	fmt.Println("http://" + e.Clients[0].Addr().String()) // the bound client URL, for startRawMember
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	e.Close()
}

// procRSSKiB is process pid's resident set in KiB, or -1.
func procRSSKiB(pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return -1
}
