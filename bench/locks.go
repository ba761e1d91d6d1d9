package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/clientlib"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// locker is one benchmark client's view of one lock implementation.
type locker interface {
	acquire(ctx context.Context) (release func(context.Context) error, err error)
	// close ends the client after a workload. Its errors are not the
	// workload's, and are dropped: what is left expires with its session
	// or lease.
	close()
}

// lockPeer makes clients of one implementation.
type lockPeer struct {
	name      string
	newClient func(ctx context.Context, lockName string) (locker, error)
	// floor marks a peer that excludes nobody: two calls per cycle that
	// touch no lock, to show the most any lock of two calls per cycle
	// could reach over the same transport. It runs only where every lock
	// has one client.
	floor bool
	// serverCPU, when set, is the CPU time its server has used so far, in
	// seconds (an outsider's); else the coordd processes', whose etcd
	// serves etcd's recipes too.
	serverCPU func() float64
}

// The peers the targets compare.
const (
	coorddSDK   = "coordd SDK"
	coorddUnary = "coordd SDK, unary calls"
	etcdMutex   = "etcd concurrency.Mutex"
	zkLock      = "ZooKeeper lock recipe"
	redisLock   = "Redis redsync"
)

func lockPeers(grpcAddr, etcdURL string) []lockPeer {
	newEtcd := func() (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: strings.Split(etcdURL, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	}
	peers := []lockPeer{
		coorddPeer(coorddSDK, grpcAddr, nil, false),
		coorddPeer(coorddUnary, grpcAddr, nil, true),
		{name: etcdMutex, newClient: func(_ context.Context, name string) (locker, error) {
			cli, err := newEtcd()
			if err != nil {
				return nil, err
			}
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				_ = cli.Close()
				return nil, err
			}
			return &mutexLocker{cli: cli, s: s, m: concurrency.NewMutex(s, "/bench/mutex/"+name)}, nil
		}},
		{name: "etcd v3lock gRPC", newClient: func(ctx context.Context, name string) (locker, error) {
			cli, err := newEtcd()
			if err != nil {
				return nil, err
			}
			l, err := cli.Grant(ctx, 30)
			if err != nil {
				_ = cli.Close()
				return nil, err
			}
			kctx, cancel := context.WithCancel(context.Background())
			if _, err := cli.KeepAlive(kctx, l.ID); err != nil {
				cancel()
				_ = cli.Close()
				return nil, err
			}
			return &v3lockLocker{cli: cli, lc: v3lockpb.NewLockClient(cli.ActiveConnection()), lease: int64(l.ID), name: "/bench/v3lock/" + name, stop: cancel}, nil
		}},
	}
	if outsiders.zk != nil {
		peers = append(peers, zkLockPeer(outsiders.zk))
	}
	if outsiders.redis != nil {
		peers = append(peers, redisLockPeer(outsiders.redis))
	}
	return append(peers, []lockPeer{
		{name: "coordd floor: 2 no-ops", floor: true, newClient: func(ctx context.Context, _ string) (locker, error) {
			c, err := clientlib.New(ctx, clientlib.Config{Endpoints: strings.Split(grpcAddr, ",")})
			if err != nil {
				return nil, err
			}
			return &noopLocker{call: func(ctx context.Context) error { _, err := c.Admin().WhoAmI(ctx); return err }, stop: func() { _ = c.Close() }}, nil
		}},
		{name: "etcd floor: 2 reads", floor: true, newClient: func(context.Context, string) (locker, error) {
			cli, err := newEtcd()
			if err != nil {
				return nil, err
			}
			return &noopLocker{call: func(ctx context.Context) error {
				_, err := cli.Get(ctx, "/bench/floor", clientv3.WithSerializable())
				return err
			}, stop: func() { _ = cli.Close() }}, nil
		}},
	}...)
}

// peerNamed is the peer of that name among peers.
func peerNamed(peers []lockPeer, name string) lockPeer {
	for _, p := range peers {
		if p.name == name {
			return p
		}
	}
	panic("bench: no lock peer " + name)
}

// noopLocker is a floor peer's client: acquire and release are one call
// each that changes nothing (coordd: WhoAmI, which touches no etcd; etcd:
// a serializable read).
type noopLocker struct {
	call func(context.Context) error
	stop func()
}

func (l *noopLocker) acquire(ctx context.Context) (func(context.Context) error, error) {
	if err := l.call(ctx); err != nil {
		return nil, err
	}
	return l.call, nil
}

func (l *noopLocker) close() { l.stop() }

// runs says whether p takes part in a workload of clients on locks: a
// floor, which excludes nobody, only where every lock has one client.
func (p lockPeer) runs(clients, locks int) bool { return !p.floor || clients == locks }

// coorddPeer makes SDK clients of the coordd at addr (comma-separated
// for several members; over TLS with tc, if set), each with its own
// session; with unary, each sends its calls as unary RPCs instead of
// pipelining them on its Calls stream.
func coorddPeer(name, addr string, tc *tls.Config, unary bool) lockPeer {
	return lockPeer{name: name, newClient: func(ctx context.Context, lockName string) (locker, error) {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: strings.Split(addr, ","), TLS: tc, UnaryCalls: unary})
		if err != nil {
			return nil, err
		}
		s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		return &coorddLocker{c: c, s: s, name: lockName}, nil
	}}
}

type coorddLocker struct {
	c        *clientlib.Client
	s        *clientlib.Session
	name     string
	freshIDs bool // a new request id per acquisition (see benchSustained)
}

func (l *coorddLocker) acquire(ctx context.Context) (func(context.Context) error, error) {
	lk, err := l.s.Lock(ctx, l.name, l.lockOpts()...)
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

func (l *coorddLocker) close() {
	_ = l.s.Close(context.Background())
	_ = l.c.Close()
}

type mutexLocker struct {
	cli *clientv3.Client
	s   *concurrency.Session
	m   *concurrency.Mutex
}

func (l *mutexLocker) acquire(ctx context.Context) (func(context.Context) error, error) {
	if err := l.m.Lock(ctx); err != nil {
		return nil, err
	}
	return l.m.Unlock, nil
}

func (l *mutexLocker) close() {
	_ = l.s.Close()
	_ = l.cli.Close()
}

type v3lockLocker struct {
	cli   *clientv3.Client
	lc    v3lockpb.LockClient
	lease int64
	name  string
	stop  context.CancelFunc
}

func (l *v3lockLocker) acquire(ctx context.Context) (func(context.Context) error, error) {
	resp, err := l.lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte(l.name), Lease: l.lease})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := l.lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: resp.Key})
		return err
	}, nil
}

func (l *v3lockLocker) close() {
	l.stop()
	_, _ = l.cli.Revoke(context.Background(), clientv3.LeaseID(l.lease))
	_ = l.cli.Close()
}

// lockRun is what one workload measured for one peer.
type lockRun struct {
	cycleUs   []float64 // acquire+release, uncontended
	handoffUs []float64 // release start -> acquire return in another client
	acqPerSec float64
	jain      float64
	overlaps  int64
	// CPU per acquisition (one acquire and one release): the servers'
	// (every coordd process, whose embedded etcd also serves etcd's
	// recipes) and this process's (the clients'), in microseconds; and how
	// busy the machine's CPUs were and how much of their time was stolen
	// by the hypervisor, in percent.
	serverUs, clientUs, busy, steal float64
}

// runLocks has `clients` clients, spread evenly over `locks` lock names,
// loop acquire -> release for d with zero hold and think time. serverCPU
// (see benchLocks) times the servers' CPU during the loop.
func runLocks(p lockPeer, clients, locks int, d time.Duration, tag string, serverCPU func() float64) (lockRun, error) {
	ctx := context.Background()
	if p.serverCPU != nil {
		serverCPU = p.serverCPU
	}
	ls := make([]locker, clients)
	for i := range ls {
		l, err := p.newClient(ctx, fmt.Sprintf("%s-%d", tag, i%locks))
		if err != nil {
			return lockRun{}, err
		}
		defer l.close()
		ls[i] = l
	}
	type slot struct {
		mu       sync.Mutex
		relAt    time.Time
		relBy    int
		inside   atomic.Int32
		handoffs []float64
	}
	slots := make([]*slot, locks)
	for i := range slots {
		slots[i] = &slot{relBy: -1}
	}
	var (
		overlaps atomic.Int64
		counts   = make([]int64, clients)
		cycles   []float64
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	cpu0 := takeCPU(serverCPU)
	end := time.Now().Add(d)
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl := slots[i%locks]
			for time.Now().Before(end) {
				t0 := time.Now()
				release, err := l.acquire(ctx)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				got := time.Now()
				if sl.inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				sl.mu.Lock()
				if sl.relBy >= 0 && sl.relBy != i {
					sl.handoffs = append(sl.handoffs, float64(got.Sub(sl.relAt).Microseconds()))
				}
				sl.mu.Unlock()
				counts[i]++
				sl.inside.Add(-1)
				sl.mu.Lock()
				sl.relAt, sl.relBy = time.Now(), i
				sl.mu.Unlock()
				if err := release(ctx); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				if clients == 1 {
					mu.Lock()
					cycles = append(cycles, float64(time.Since(t0).Microseconds()))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	cpu1 := takeCPU(serverCPU)
	if firstErr != nil {
		return lockRun{}, firstErr
	}
	r := lockRun{cycleUs: cycles, overlaps: overlaps.Load()}
	var total, sumSq float64
	for _, c := range counts {
		total += float64(c)
		sumSq += float64(c) * float64(c)
	}
	r.acqPerSec = total / d.Seconds()
	r.serverUs, r.clientUs, r.busy = cpu1.since(cpu0, total)
	r.steal = cpu1.stealPct(cpu0)
	if sumSq > 0 {
		r.jain = total * total / (float64(len(counts)) * sumSq)
	}
	for _, s := range slots {
		r.handoffUs = append(r.handoffUs, s.handoffs...)
	}
	return r, nil
}

// benchLocks runs the lock workloads for every peer on the same etcd and
// prints them with the ratios the targets use. serverCPU is the CPU time
// the servers (the coordd processes) have used so far, in seconds.
func benchLocks(grpcAddr string, httpAddrs []string, etcdURL string, serverCPU func() float64, d time.Duration) error {
	httpAddr := httpAddrs[0]
	raw, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(etcdURL, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	ctx := context.Background()
	putLat, err := rawPuts(ctx, raw, 500)
	if err != nil {
		return err
	}
	put50 := percentile(putLat, 50)
	// The ratios' raw put: puts timed just before each peer's uncontended
	// cycles in every round, so that the machine's drift over the run (its
	// disk's fsync time moves by a third between runs here) weighs on both
	// sides of a ratio alike.
	var beside []float64
	fmt.Printf("\nlocks (%d rounds, each workload %s per peer per round, zero hold and think time; raw etcd put p50 %.0fus)\n", *lockRounds, d, put50)
	fmt.Printf("%-24s %-26s %10s %10s %10s %8s %6s %8s\n", "peer", "workload", "p50", "p99", "acq/s", "jain", "n", "overlap")

	peers := lockPeers(grpcAddr, etcdURL)
	type key struct{ peer, workload string }
	results := map[key]lockRun{}
	batchSize := map[string][]float64{} // coordd's mean group-commit batch, per workload and round
	workloads := []struct {
		name           string
		clients, locks int
	}{
		{"1 client (cycle)", 1, 1},
		{"2 clients, 1 lock", 2, 1},
		{"8 clients, 1 lock", 8, 1},
		{"64 clients, 64 locks", 64, 64},
	}
	// Each round runs every peer once per workload, rotating which peer goes
	// first; samples are pooled over rounds.
	for round := range *lockRounds {
		for wi, w := range workloads {
			for i := range peers {
				p := peers[(i+round)%len(peers)]
				if !p.runs(w.clients, w.locks) {
					continue
				}
				var profiled chan error
				if *lockProfile != "" && round == 0 && w.locks == 64 && p.name == coorddSDK {
					profiled = make(chan error, 1)
					// Of the member the clients use: the one that leads etcd.
					at := httpAddrs[max(leaderIndex(strings.Split(grpcAddr, ",")), 0)]
					go func() { profiled <- cpuProfile(at, d, *lockProfile) }()
				}
				if w.clients == 1 {
					puts, err := rawPuts(ctx, raw, 300)
					if err != nil {
						return err
					}
					beside = append(beside, puts...)
				}
				coordd := p.name == coorddSDK
				var b0, n0 float64
				if coordd {
					b0, n0 = sumMetric(httpAddrs, "coordd_group_commit_batches_total"), sumMetric(httpAddrs, "coordd_group_commit_changes_total")
				}
				var clientProfile *os.File
				if profiled != nil {
					// The clients' side: this process, over the same run.
					if clientProfile, err = os.Create(*lockProfile + ".clients"); err != nil {
						return err
					}
					if err := pprof.StartCPUProfile(clientProfile); err != nil {
						return err
					}
				}
				r, err := runLocks(p, w.clients, w.locks, d, fmt.Sprintf("r%d-w%d", round, wi), serverCPU)
				if clientProfile != nil {
					pprof.StopCPUProfile()
					if err := clientProfile.Close(); err != nil {
						return err
					}
				}
				if coordd && err == nil {
					b1, n1 := sumMetric(httpAddrs, "coordd_group_commit_batches_total"), sumMetric(httpAddrs, "coordd_group_commit_changes_total")
					batchSize[w.name] = append(batchSize[w.name], (n1-n0)/max(b1-b0, 1))
				}
				if profiled != nil {
					if perr := <-profiled; perr != nil {
						return fmt.Errorf("CPU profile: %w", perr)
					}
					fmt.Printf("(CPU profile of coordd during %s: %s; of the clients: %[2]s.clients)\n", w.name, *lockProfile)
				}
				if err != nil {
					return fmt.Errorf("%s, %s: %w", p.name, w.name, err)
				}
				k := key{p.name, w.name}
				acc := results[k]
				acc.cycleUs = append(acc.cycleUs, r.cycleUs...)
				acc.handoffUs = append(acc.handoffUs, r.handoffUs...)
				acc.acqPerSec += r.acqPerSec / float64(*lockRounds)
				if acc.jain == 0 || r.jain < acc.jain {
					acc.jain = r.jain // the worst round
				}
				acc.overlaps += r.overlaps
				n := float64(*lockRounds)
				acc.serverUs, acc.clientUs, acc.busy = acc.serverUs+r.serverUs/n, acc.clientUs+r.clientUs/n, acc.busy+r.busy/n
				acc.steal += r.steal / n
				results[k] = acc
			}
		}
	}
	for _, w := range workloads {
		for _, p := range peers {
			if !p.runs(w.clients, w.locks) {
				continue
			}
			r := results[key{p.name, w.name}]
			lat := r.handoffUs
			if w.clients == 1 {
				lat = r.cycleUs
			}
			p50, p99 := "-", "-" // one client per lock: no hand-offs
			if len(lat) > 0 {
				p50, p99 = fmt.Sprintf("%.0fus", percentile(lat, 50)), fmt.Sprintf("%.0fus", percentile(lat, 99))
			}
			fmt.Printf("%-24s %-26s %10s %10s %10.0f %8.3f %6d %8d\n", p.name, w.name, p50, p99, r.acqPerSec, r.jain, len(lat), r.overlaps)
		}
	}

	fmt.Printf("CPU per acquisition (acquire + release) under 64 clients on 64 locks, mean of rounds: servers (coordd processes, whose etcd serves etcd's recipes too; ZooKeeper's and Redis's own processes) + clients (this process):\n")
	for _, p := range peers {
		r := results[key{p.name, "64 clients, 64 locks"}]
		fmt.Printf("  %-24s %6.0fus + %4.0fus = %6.0fus; machine's CPUs %3.0f%% busy, %3.0f%% stolen\n", p.name, r.serverUs, r.clientUs, r.serverUs+r.clientUs, r.busy, r.steal)
	}
	fmt.Printf("coordd's mean group-commit batch (lock changes per etcd transaction, per round, over every member):")
	for _, w := range workloads {
		fmt.Printf(" %s:", w.name)
		for _, b := range batchSize[w.name] {
			fmt.Printf(" %.1f", b)
		}
	}
	fmt.Println()

	c := func(p, w string) lockRun { return results[key{p, w}] }
	ratio := func(a, b float64) float64 { return a / b }
	co := coorddSDK
	put50 = percentile(beside, 50)
	fmt.Printf("\ntargets (raw put p50 %.0fus, timed before each peer's uncontended cycles, %d puts):\n", put50, len(beside))
	fmt.Printf("  uncontended cycle p50 / two raw puts:              %.2f (target <= 1.3)\n", ratio(percentile(c(co, "1 client (cycle)").cycleUs, 50), 2*put50))
	for _, w := range []string{"2 clients, 1 lock", "8 clients, 1 lock"} {
		h := c(co, w).handoffUs
		m := c("etcd concurrency.Mutex", w).handoffUs
		if len(h) == 0 || len(m) == 0 {
			continue
		}
		fmt.Printf("  %s: hand-off p50 / raw put:            %.2f (target <= 2)\n", w, ratio(percentile(h, 50), put50))
		fmt.Printf("  %s: Mutex hand-off p99 / coordd p99:   %.1f (target >= 20)\n", w, ratio(percentile(m, 99), percentile(h, 99)))
	}
	// The performance issue's (#16) targets, each as coordd's figure
	// against its line.
	cyc, mcyc := percentile(c(co, "1 client (cycle)").cycleUs, 50), percentile(c("etcd concurrency.Mutex", "1 client (cycle)").cycleUs, 50)
	fmt.Printf("  1 client: cycle p50 / raw put p50:                  %.2f (target <= 2.2)\n", ratio(cyc, put50))
	fmt.Printf("  1 client: cycle p50 coordd / Mutex:                 %.2f (target <= 1)\n", ratio(cyc, mcyc))
	for _, w := range []string{"2 clients, 1 lock", "8 clients, 1 lock"} {
		fmt.Printf("  %s: acquisitions/s x raw put p50:      %.2f (target >= 0.9: one grant per commit time)\n", w, c(co, w).acqPerSec*put50/1e6)
	}
	fmt.Printf("  64 clients, 64 locks: coordd / Mutex cycles per second: %.2f (target >= 2)\n",
		ratio(c(co, "64 clients, 64 locks").acqPerSec, c("etcd concurrency.Mutex", "64 clients, 64 locks").acqPerSec))
	fmt.Printf("  64 clients, 64 locks: coordd's floor / Mutex cycles per second: %.2f (2 calls that touch no etcd per cycle: the most a lock of 2 calls could reach here)\n",
		ratio(c("coordd floor: 2 no-ops", "64 clients, 64 locks").acqPerSec, c("etcd concurrency.Mutex", "64 clients, 64 locks").acqPerSec))
	fmt.Printf("  64 clients, 64 locks: coordd / coordd's floor:      %.2f; Mutex / etcd's floor (2 serializable reads): %.2f\n",
		ratio(c(co, "64 clients, 64 locks").acqPerSec, c("coordd floor: 2 no-ops", "64 clients, 64 locks").acqPerSec),
		ratio(c("etcd concurrency.Mutex", "64 clients, 64 locks").acqPerSec, c("etcd floor: 2 reads", "64 clients, 64 locks").acqPerSec))
	cr, mr := c(co, "64 clients, 64 locks"), c("etcd concurrency.Mutex", "64 clients, 64 locks")
	fmt.Printf("  64 clients, 64 locks: CPU per acquisition, Mutex / coordd: %.2f (on a machine whose CPUs are saturated, the most cycles/s coordd / Mutex can reach; busy: coordd %.0f%%, Mutex %.0f%%)\n",
		ratio(mr.serverUs+mr.clientUs, cr.serverUs+cr.clientUs), cr.busy, mr.busy)
	fmt.Printf("  64 clients, 64 locks: Jain's fairness index, worst round: %.3f (target >= 0.99)\n", c(co, "64 clients, 64 locks").jain)
	printOutsiderTargets(c, func(name string) bool {
		return slices.ContainsFunc(peers, func(p lockPeer) bool { return p.name == name })
	})
	if strings.Contains(grpcAddr, ",") {
		return nil // the watcher gauge is per member: counted on one member only
	}
	return benchWatches(grpcAddr, httpAddr, raw)
}

// printOutsiderTargets prints the targets of issue #34: coordd beside
// ZooKeeper, Redis and its own unary calls (has says which peers ran).
func printOutsiderTargets(c func(peer, workload string) lockRun, has func(string) bool) {
	const many = "64 clients, 64 locks"
	cpu := func(p string) float64 { r := c(p, many); return r.serverUs + r.clientUs }
	fmt.Printf("  64 clients, 64 locks: CPU per acquisition, pipelined / unary calls: %.2f (target <= 0.6; %.0fus against %.0fus)\n",
		cpu(coorddSDK)/cpu(coorddUnary), cpu(coorddSDK), cpu(coorddUnary))
	fmt.Printf("  64 clients, 64 locks: coordd / Mutex cycles per second: %.2f (target >= 1.5)\n", c(coorddSDK, many).acqPerSec/c(etcdMutex, many).acqPerSec)
	for _, o := range []struct{ peer, short string }{{zkLock, "ZooKeeper"}, {redisLock, "Redis"}} {
		if !has(o.peer) {
			continue
		}
		target := func(s string) string {
			if o.peer == zkLock {
				return " (target " + s + ")"
			}
			return ""
		}
		fmt.Printf("  64 clients, 64 locks: coordd / %s cycles per second: %.2f%s; CPU per acquisition %s / coordd: %.2f\n",
			o.short, c(coorddSDK, many).acqPerSec/c(o.peer, many).acqPerSec, target(">= 1.0"), o.short, cpu(o.peer)/cpu(coorddSDK))
		for _, w := range []string{"2 clients, 1 lock", "8 clients, 1 lock"} {
			fmt.Printf("  %s: acquisitions/s coordd / %s: %.2f%s; hand-off p99 %.1fms against %.1fms\n", w, o.short,
				c(coorddSDK, w).acqPerSec/c(o.peer, w).acqPerSec, target(">= 1.0"), percentile(c(coorddSDK, w).handoffUs, 99)/1000, percentile(c(o.peer, w).handoffUs, 99)/1000)
		}
		fmt.Printf("  1 client: cycle p50 coordd / %s: %.2f\n", o.short, percentile(c(coorddSDK, "1 client (cycle)").cycleUs, 50)/percentile(c(o.peer, "1 client (cycle)").cycleUs, 50))
	}
}

// benchWatches counts the etcd watches opened for n lock waiters on one
// lock and n observers of one election: coordd's (its member's watchers,
// from its /metrics) beside etcd's recipes (concurrency.Mutex waiters and
// concurrency.Election observers), in one run.
func benchWatches(grpcAddr, httpAddr string, raw *clientv3.Client) error {
	const n = 100
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before, err := etcdWatchers(httpAddr)
	if err != nil {
		return err
	}
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	var sessions []*clientlib.Session
	for range n + 2 {
		s, err := c.NewSession(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close(context.Background()) }()
		sessions = append(sessions, s)
	}
	if _, err := sessions[0].Lock(ctx, "bench/watches"); err != nil {
		return err
	}
	if _, err := sessions[1].Campaign(ctx, "bench/watches", "leader"); err != nil {
		return err
	}
	for _, s := range sessions[2:] {
		go func() { _, _ = s.Lock(ctx, "bench/watches") }()
	}
	for range n {
		obs := c.Observe(ctx, "bench/watches")
		<-obs.Events() // its first event: it follows
	}
	for {
		d, err := c.Admin().DescribeLock(ctx, "bench/watches")
		if err != nil {
			return err
		}
		if len(d.Waiters) == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, err := etcdWatchers(httpAddr)
	if err != nil {
		return err
	}

	// etcd's recipes on the same member: n Mutex waiters, n observers.
	var etcdSessions []*concurrency.Session
	for range n + 1 {
		s, err := concurrency.NewSession(raw, concurrency.WithTTL(30))
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		etcdSessions = append(etcdSessions, s)
	}
	if err := concurrency.NewMutex(etcdSessions[0], "/bench/watches-mutex").Lock(ctx); err != nil {
		return err
	}
	for _, s := range etcdSessions[1:] {
		go func() { _ = concurrency.NewMutex(s, "/bench/watches-mutex").Lock(ctx) }()
	}
	el := concurrency.NewElection(etcdSessions[0], "/bench/watches-election")
	if err := el.Campaign(ctx, "leader"); err != nil {
		return err
	}
	for range n {
		<-el.Observe(ctx)
	}
	var etcdAfter float64
	for range 500 { // until every waiter watches its predecessor
		if etcdAfter, err = etcdWatchers(httpAddr); err != nil {
			return err
		}
		if etcdAfter-after >= 2*n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("  etcd watches for %d lock waiters and %d observers: coordd +%.0f (target <= 2), etcd's recipes +%.0f\n", n, n, after-before, etcdAfter-after)
	return nil
}

// etcdWatchers reads etcd's gauge of open watchers from coordd's /metrics.
func etcdWatchers(httpAddr string) (float64, error) {
	return gauge(httpAddr, "etcd_debugging_mvcc_watcher_total")
}

// gauge reads one unlabelled metric from coordd's /metrics.
func gauge(httpAddr, name string) (float64, error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

// sumMetric is the sum of a metric over the members at httpAddrs (those
// that answer).
func sumMetric(httpAddrs []string, name string) float64 {
	sum := 0.0
	for _, a := range httpAddrs {
		if v, err := metric(a, name); err == nil {
			sum += v
		}
	}
	return sum
}

// leaderIndex is the index of the member (by gRPC address) whose health
// service says it leads etcd, or -1 when none says so.
func leaderIndex(grpcAddrs []string) int {
	for i, a := range grpcAddrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: coorddv1.LeaderHealthService})
		cancel()
		_ = conn.Close() // asked once; nothing to report
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return i
		}
	}
	return -1
}

// cpuProfile writes a CPU profile of the coordd at httpAddr (run with
// --enable-pprof), taken over the whole seconds of d, to file.
func cpuProfile(httpAddr string, d time.Duration, file string) error {
	secs := max(1, int(d.Seconds()))
	return saveURL(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", httpAddr, secs), file)
}

// saveURL writes what a GET of url answers to file.
func saveURL(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
