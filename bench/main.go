// Command bench measures coordd beside raw etcd in the same run and prints
// the ratios: session create+close against a raw lease grant+revoke, and a
// keep-alive round trip against a raw etcd lease keep-alive round trip, both
// on the same embedded etcd of one coordd process. It also measures the
// daemon's cold start to /readyz and its idle memory.
//
// Run it from the repository root: go run ./bench
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coordd/coordd/clientlib"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	rounds         = flag.Int("rounds", 5, "rounds per workload; peers alternate order each round")
	ops            = flag.Int("ops", 300, "operations per peer per round")
	starts         = flag.Int("starts", 5, "cold starts to measure")
	only           = flag.String("only", "all", "which part to run: all, sessions, locks, elections, config or config-sdk")
	lockD          = flag.Duration("lock-duration", 3*time.Second, "how long each lock workload runs per peer and round")
	lockRounds     = flag.Int("lock-rounds", 2, "rounds of the lock workloads; peers rotate order each round")
	electionRounds = flag.Int("election-rounds", 3, "rounds of the election workloads; peers alternate order each round")
	electionOps    = flag.Int("election-ops", 100, "hand-overs and proclamations per peer per round")
	failovers      = flag.Int("failovers", 3, "crash fail-overs per peer")
	configK        = flag.String("config-subscribers", "100,1000", "subscriber counts of the config fan-out benchmark")
	sdkSubs        = flag.Int("sdk-subscriptions", 1000, "subscriptions (each its own client) of the config SDK benchmark")
	configPubs     = flag.Int("config-publishes", 50, "publishes per subscriber count and peer")
	failoverTTL    = flag.Int("failover-ttl", 2, "session TTL in seconds for the crash fail-overs")
	// campaignChild makes this binary a process that leads an election until
	// killed: -campaign-child kind,endpoint,name,ttl.
	campaignChild = flag.String("campaign-child", "", "internal: lead an election until killed")
	// rawMember makes this binary a bare embedded etcd member (the peer of
	// the cold-start and memory figures): -raw-member dir,clientURL,peerURL.
	rawMember = flag.String("raw-member", "", "internal: run a bare embedded etcd member")
)

func main() {
	flag.Parse()
	if *rawMember != "" {
		runRawMember(*rawMember)
		return
	}
	if *campaignChild != "" {
		runCampaignChild(*campaignChild)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	tmp, err := os.MkdirTemp("", "coordd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "coordd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/coordd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build coordd: %w", err)
	}
	fmt.Printf("coordd bench  %s  cpus=%d  rounds=%d ops=%d\n\n", time.Now().Format(time.RFC3339), runtime.NumCPU(), *rounds, *ops)

	if *only == "all" || *only == "sessions" {
		if err := benchSessions(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "locks" {
		d, err := startDaemon(bin, filepath.Join(tmp, "locks"))
		if err != nil {
			return err
		}
		defer d.stop()
		if err := benchLocks(d.grpcAddr, d.etcdURL, *lockD); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "config" {
		if err := benchConfig(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "config-sdk" {
		if err := benchConfigSDK(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "elections" {
		d, err := startDaemon(bin, filepath.Join(tmp, "elections"))
		if err != nil {
			return err
		}
		defer d.stop()
		if err := benchElections(d.grpcAddr, d.etcdURL); err != nil {
			return err
		}
	}
	return nil
}

// benchSessions measures cold start, idle memory and session operations.
func benchSessions(bin, tmp string) error {
	// Cold start and idle memory, coordd and a bare etcd member alternating.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var startC, startE, rssC, rssE []float64
	for i := range *starts {
		for _, peer := range []int{i % 2, 1 - i%2} {
			dir := filepath.Join(tmp, fmt.Sprintf("cold-%d-%d", i, peer))
			var d *daemon
			if peer == 0 {
				d, err = startDaemon(bin, dir)
			} else {
				d, err = startRawMember(self, dir)
			}
			if err != nil {
				return err
			}
			time.Sleep(2 * time.Second) // let it settle before reading idle RSS
			ms, mib := d.startup.Seconds()*1000, float64(d.rssKiB())/1024
			d.stop()
			if peer == 0 {
				startC, rssC = append(startC, ms), append(rssC, mib)
			} else {
				startE, rssE = append(startE, ms), append(rssE, mib)
			}
		}
	}
	fmt.Printf("%-48s %10s %10s %8s\n", "process (median of starts)", "coordd", "etcd", "x")
	fmt.Printf("%-48s %8.0fms %8.0fms %8.2f   (coordd min %.0f max %.0f; etcd min %.0f max %.0f; n=%d)\n", "cold start to ready",
		median(startC), median(startE), median(startC)/median(startE), slices.Min(startC), slices.Max(startC), slices.Min(startE), slices.Max(startE), len(startC))
	fmt.Printf("%-48s %7.1fMiB %7.1fMiB %8.2f\n\n", "idle RSS 2s after ready", median(rssC), median(rssE), median(rssC)/median(rssE))

	d, err := startDaemon(bin, filepath.Join(tmp, "ops"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	sdk, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer sdk.Close()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{d.etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer raw.Close()
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()

	fmt.Printf("%-48s %10s %10s %10s %10s %8s %8s\n", "workload", "coordd p50", "coordd p99", "etcd p50", "etcd p99", "p50 x", "p99 x")
	createClose, err := compare(
		func() error {
			s, err := sdk.NewSession(ctx, clientlib.WithTTL(10*time.Second))
			if err != nil {
				return err
			}
			return s.Close(ctx)
		},
		func() error {
			l, err := raw.Grant(ctx, 10)
			if err != nil {
				return err
			}
			_, err = raw.Revoke(ctx, l.ID)
			return err
		})
	if err != nil {
		return err
	}
	printRow("session create+close (SDK | lease grant+revoke)", createClose)

	// Keep-alive round trips on one stream each, as the SDK and clientv3 do.
	s, err := sdk.NewSession(ctx, clientlib.WithTTL(60*time.Second))
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	kst, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(ctx)
	if err != nil {
		return err
	}
	lease, err := raw.Grant(ctx, 60)
	if err != nil {
		return err
	}
	lst, err := pb.NewLeaseClient(raw.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		return err
	}
	keepAlive, err := compare(
		func() error {
			if err := kst.Send(&coorddv1.KeepAliveStreamRequest{SessionId: s.ID()}); err != nil {
				return err
			}
			_, err := kst.Recv()
			return err
		},
		func() error {
			if err := lst.Send(&pb.LeaseKeepAliveRequest{ID: int64(lease.ID)}); err != nil {
				return err
			}
			_, err := lst.Recv()
			return err
		})
	if err != nil {
		return err
	}
	printRow("keep-alive round trip (stream | lease stream)", keepAlive)

	unary := coorddv1.NewSessionServiceClient(conn)
	keepAliveUnary, err := compare(
		func() error {
			_, err := unary.KeepAlive(ctx, &coorddv1.KeepAliveRequest{SessionId: s.ID()})
			return err
		},
		func() error {
			_, err := raw.KeepAliveOnce(ctx, lease.ID)
			return err
		})
	if err != nil {
		return err
	}
	printRow("keep-alive unary (KeepAlive | KeepAliveOnce)", keepAliveUnary)
	fmt.Println("\nx = coordd / etcd (lower is better; target <= 1.3). Each figure is the median over rounds.")
	return nil
}

type result struct{ coorddP50, coorddP99, etcdP50, etcdP99 []float64 }

// compare runs both peers for rounds, alternating which goes first, and
// returns per-round p50/p99 in microseconds.
func compare(coordd, etcd func() error) (result, error) {
	var r result
	for round := range *rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, peer := range order {
			fn := coordd
			if peer == 1 {
				fn = etcd
			}
			lat, err := measure(fn)
			if err != nil {
				return r, err
			}
			p50, p99 := percentile(lat, 50), percentile(lat, 99)
			if peer == 0 {
				r.coorddP50, r.coorddP99 = append(r.coorddP50, p50), append(r.coorddP99, p99)
			} else {
				r.etcdP50, r.etcdP99 = append(r.etcdP50, p50), append(r.etcdP99, p99)
			}
		}
	}
	return r, nil
}

func measure(fn func() error) ([]float64, error) {
	for range 20 { // warm up
		if err := fn(); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	lat := make([]float64, 0, *ops)
	for range *ops {
		t0 := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds()))
	}
	return lat, nil
}

func printRow(name string, r result) {
	c50, c99, e50, e99 := median(r.coorddP50), median(r.coorddP99), median(r.etcdP50), median(r.etcdP99)
	fmt.Printf("%-48s %8.0fus %8.0fus %8.0fus %8.0fus %8.2f %8.2f\n", name, c50, c99, e50, e99, c50/e50, c99/e99)
}

func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

func median(xs []float64) float64 { return percentile(xs, 50) }

type daemon struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	etcdURL  string
	bin      string   // coordd's binary, for restart
	args     []string // its flags, for restart
	startup  time.Duration
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startDaemon starts coordd on fresh ports and data dir and waits for /readyz.
func startDaemon(bin, dir string) (*daemon, error) {
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	cmd := exec.Command(bin, "--data-dir", dir, "--name", "bench", "--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--etcd-client-url", etcdURL, "--listen-peer-urls", peerURL, "--log-level", "error", "--enable-pprof")
	cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd, grpcAddr: grpcAddr, httpAddr: httpAddr, etcdURL: etcdURL, bin: bin, args: cmd.Args[1:]}
	if err := waitReady(d, "http://"+httpAddr+"/readyz", t0); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *daemon) rssKiB() int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
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

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
}

// startRawMember starts this binary as a bare etcd member and waits until a
// linearizable read succeeds, the same check coordd's /readyz makes.
func startRawMember(self, dir string) (*daemon, error) {
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	cmd := exec.Command(self, "-raw-member", dir+","+etcdURL+","+peerURL)
	cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd, etcdURL: etcdURL}
	if err := waitReady(d, etcdURL+"/health", t0); err != nil {
		return nil, err
	}
	return d, nil
}

// waitReady polls url every 2ms until it answers 200, and records the time
// since t0 as the start-up time.
func waitReady(d *daemon, url string, t0 time.Time) error {
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
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
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	e.Close()
}
