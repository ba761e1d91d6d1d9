// Command bench measures coordd beside raw etcd in the same run and prints
// the ratios: session create+close against a raw lease grant+revoke, and a
// keep-alive round trip against a raw etcd lease keep-alive round trip, both
// on the same embedded etcd of one coordd process. It also measures the
// daemon's cold start to /readyz and its idle memory.
//
// Run it from the repository root: go run ./bench
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

var (
	rounds              = flag.Int("rounds", 5, "rounds per workload; peers alternate order each round")
	ops                 = flag.Int("ops", 300, "operations per peer per round")
	starts              = flag.Int("starts", 5, "cold starts to measure")
	only                = flag.String("only", "all", "which part to run: all, sessions, locks, rwlocks, elections, config, config-sdk, gray, console, or soak, auth, idle-sessions, sustained, long-queue, crowd, history-cost, revoke or schema-bomb (not part of all)")
	idleProfile         = flag.String("idle-profile", "", "write a CPU profile of coordd while the first -idle-sessions count idles to this file (go tool pprof)")
	idleSessions        = flag.String("idle-sessions", "10000,50000", "idle session counts of -only idle-sessions (10 clients, TTL 30s)")
	soakD               = flag.Duration("soak-duration", 10*time.Minute, "how long each soak run lasts")
	soakWindowD         = flag.Duration("soak-window", time.Minute, "the soak's measuring window")
	soakCompare         = flag.Bool("soak-compare", true, "run the soak a second time with compaction off")
	soakFlags           = flag.String("soak-coordd-flags", "", "extra coordd flags for the soak's first run (e.g. \"--compaction-retention 10s\")")
	lockD               = flag.Duration("lock-duration", 3*time.Second, "how long each lock workload runs per peer and round")
	lockRounds          = flag.Int("lock-rounds", 2, "rounds of the lock workloads; peers rotate order each round")
	lockMembers         = flag.Int("lock-members", 1, "embedded members of the cluster the lock workloads run on (1 or 3; 3 are three coordd processes)")
	coorddFlags         = flag.String("coordd-flags", "", "extra coordd flags for the lock and election daemons (e.g. \"--no-group-commit\" to compare)")
	lockProfile         = flag.String("lock-profile", "", "write a CPU profile of coordd during the SDK's first 64-clients-on-64-locks run to this file, and of the clients to this file.clients (go tool pprof)")
	electionRounds      = flag.Int("election-rounds", 3, "rounds of the election workloads; peers alternate order each round")
	electionOps         = flag.Int("election-ops", 100, "hand-overs and proclamations per peer per round")
	failovers           = flag.Int("failovers", 3, "crash fail-overs per peer")
	configK             = flag.String("config-subscribers", "100,1000", "subscriber counts of the config fan-out benchmark")
	sdkSubs             = flag.Int("sdk-subscriptions", 1000, "subscriptions (each its own client) of the config SDK benchmark")
	configPubs          = flag.Int("config-publishes", 0, "publishes per subscriber count and peer (0: 200 in the config fan-out's rounds, whose p99 is then a percentile, not the slowest publish; 50 elsewhere)")
	configMembers       = flag.Int("config-members", 1, "members of the cluster -only config runs on: 1 (the one-member tables) or 3 (subscribers spread over three coordd processes, beside raw etcd watches spread the same way)")
	configInRounds      = flag.Bool("config-in-rounds", false, "run -only config's fan-out in rounds, as on three members (warm-up, rotating order, shared commits, ratios by round), also with -config-members 1: the one-member tables time one pass each, whose p99 is one or two publishes")
	configClusterK      = flag.String("config-cluster-subscribers", "1000", "subscriber counts of the config fan-out with -config-members 3")
	configClusterRounds = flag.Int("config-cluster-rounds", 3, "rounds of the config fan-out with -config-members 3")
	configOtherBin      = flag.String("config-other-bin", "", "with -config-in-rounds on one member: also run the coordd binary at this path as a second one-member daemon, its SDK subscribers spread as this build's, in the same rounds: an A/B of two builds (ratios this build / that one)")
	configProfile       = flag.String("config-profile", "", "with -config-members 3 or -config-in-rounds: write CPU and allocation profiles of member m0 during the first spread run at the largest K to this file and this file.allocs, and of the clients to this file.clients and this file.clients.allocs (go tool pprof; the clients' allocations with -base this file.clients.allocs.base)")
	failoverTTL         = flag.Int("failover-ttl", 2, "session TTL in seconds for the crash fail-overs")
	// campaignChild makes this binary a process that leads an election until
	// killed: -campaign-child kind,endpoint,name,ttl.
	campaignChild = flag.String("campaign-child", "", "internal: lead an election until killed")
	// rawMember makes this binary a bare embedded etcd member (the peer of
	// the cold-start and memory figures): -raw-member dir,clientURL,peerURL.
	// It prints its bound client URL, so the URLs may have port 0.
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

// publishes is -config-publishes, or its default: 200 in the config
// fan-out's rounds, where with 50 a round's p99 at 1,000 subscribers is its
// slowest publish's median delivery (docs/performance.md, "More publishes
// per round"), and 50 elsewhere.
func publishes(rounds bool) int {
	switch {
	case *configPubs > 0:
		return *configPubs
	case rounds:
		return 200
	}
	return 50
}

func run() error {
	tmp, err := os.MkdirTemp("", "coordd-bench-")
	if err != nil {
		return err
	}
	defer func() {
		// coordd's binary and the data dirs: say so if they are left behind.
		if err := os.RemoveAll(tmp); err != nil {
			fmt.Fprintln(os.Stderr, "bench: warning:", err)
		}
	}()
	bin := filepath.Join(tmp, "coordd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/coordd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build coordd: %w", err)
	}
	fmt.Printf("coordd bench  %s  cpus=%d  rounds=%d ops=%d\n\n", time.Now().Format(time.RFC3339), runtime.NumCPU(), *rounds, *ops)
	// On a shared virtual machine the hypervisor may run other guests on
	// these CPUs; every server and client here then waits, and the
	// figures are slower and noisier than the same run on a quiet one.
	noServers := func() float64 { return 0 }
	start := takeCPU(noServers)
	defer func() {
		fmt.Printf("\nCPU steal over this run: %.0f%% of the machine's CPU time (time the hypervisor ran other guests on these CPUs; compare figures across runs only at a similar steal)\n",
			takeCPU(noServers).stealPct(start))
	}()

	if *only == "soak" {
		return benchSoak(bin, tmp)
	}
	if *only == "idle-sessions" {
		return benchIdleSessions(bin, tmp)
	}
	if *only == "auth" {
		return benchAuth(bin, tmp)
	}
	if *only == "sustained" {
		return benchSustained(bin, tmp)
	}
	if *only == "history-cost" {
		return benchHistoryCost(bin, tmp)
	}
	if *only == "long-queue" {
		return benchLongQueue(bin, tmp)
	}
	if *only == "crowd" {
		return benchCrowd(bin, tmp)
	}
	if *only == "revoke" {
		return benchRevoke(bin, tmp)
	}
	if *only == "schema-bomb" {
		return benchSchemaBomb(bin, tmp)
	}
	if *only == "all" || *only == "locks" || *only == "elections" {
		// ZooKeeper and Redis, each its own process, beside coordd in the
		// lock and election tables.
		defer startOutsiders(filepath.Join(tmp, "outsiders"))()
	}
	if *only == "all" || *only == "sessions" {
		if err := benchSessions(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "locks" {
		if *lockMembers > 1 {
			ds, err := startCluster(bin, filepath.Join(tmp, "locks"), *lockMembers, strings.Fields(*coorddFlags)...)
			if err != nil {
				return err
			}
			var grpcs, https, etcds []string
			for _, d := range ds {
				defer d.stop()
				grpcs, https, etcds = append(grpcs, d.grpcAddr), append(https, d.httpAddr), append(etcds, d.etcdURL)
			}
			fmt.Printf("(%d members, each its own coordd process; clients are given every member)\n", len(ds))
			serverCPU := func() float64 {
				sum := 0.0
				for _, d := range ds {
					sum += d.cpuSeconds()
				}
				return sum
			}
			if err := benchLocks(strings.Join(grpcs, ","), https, strings.Join(etcds, ","), serverCPU, *lockD); err != nil {
				return err
			}
		} else {
			d, err := startDaemon(bin, filepath.Join(tmp, "locks"), strings.Fields(*coorddFlags)...)
			if err != nil {
				return err
			}
			defer d.stop()
			if err := benchLocks(d.grpcAddr, []string{d.httpAddr}, d.etcdURL, d.cpuSeconds, *lockD); err != nil {
				return err
			}
		}
	}
	if *only == "all" || *only == "rwlocks" {
		if err := benchRWLocks(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "config" {
		if *configOtherBin != "" && (!*configInRounds || *configMembers != 1) {
			return fmt.Errorf("-config-other-bin needs -config-in-rounds on one member")
		}
		if *configProfile != "" {
			runtime.MemProfileRate = 16 << 10 // the clients' allocation profile: a sample per 16 KiB, not 512
		}
		if *configMembers > 1 || *configInRounds {
			if err := benchConfigCluster(bin, tmp, *configMembers); err != nil {
				return err
			}
		} else if err := benchConfig(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "config-sdk" {
		if err := benchConfigSDK(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "console" {
		if err := benchConsole(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "gray" {
		if err := benchGray(bin, tmp); err != nil {
			return err
		}
	}
	if *only == "all" || *only == "elections" {
		d, err := startDaemon(bin, filepath.Join(tmp, "elections"), strings.Fields(*coorddFlags)...)
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
