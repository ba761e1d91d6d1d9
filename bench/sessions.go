package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/clientlib"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

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
	defer func() { _ = sdk.Close() }()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{d.etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()

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
	defer func() { _ = s.Close(ctx) }()
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

// benchIdleSessions measures what idle sessions cost the daemon: for each
// count, a fresh coordd, that many SDK sessions (TTL 30 s) over 10
// clients, then over one TTL of doing nothing but keeping them alive, the
// daemon's RSS and its CPU (user + system) as a share of one core.
func benchIdleSessions(bin, tmp string) error {
	const clients, ttl = 10, 30 * time.Second
	fmt.Printf("idle sessions (%d clients, TTL %s, kept alive by the SDK; measured over one TTL; per session and CPU over none: beyond a daemon with the same clients and no sessions)\n", clients, ttl)
	fmt.Printf("%-10s %12s %12s %14s %12s %16s\n", "sessions", "RSS before", "RSS idle", "per session", "CPU (core)", "CPU over none")
	// The daemon and its clients with no sessions: what idling costs
	// anyway, subtracted from the others for the cost of the sessions.
	var base idleBase
	if err := idleRun(bin, filepath.Join(tmp, "idle-0"), 0, clients, ttl, &base); err != nil {
		return err
	}
	for _, f := range strings.Split(*idleSessions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-idle-sessions %q: want positive counts", *idleSessions)
		}
		if err := idleRun(bin, filepath.Join(tmp, fmt.Sprintf("idle-%d", n)), n, clients, ttl, &base); err != nil {
			// A count the daemon cannot hold is a result, not the end.
			fmt.Printf("%-10d not held: %v\n", n, err)
		}
	}
	return nil
}

// idleBase is the run without sessions.
type idleBase struct {
	grewKiB int64   // RSS growth, KiB
	cpu     float64 // share of a core
}

// idleRun measures n sessions idling on a fresh daemon; with n = 0 it
// fills base, otherwise it prints the figures beside base's.
func idleRun(bin, dir string, n, clients int, ttl time.Duration, base *idleBase) error {
	d, err := startDaemon(bin, dir)
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	before := d.rssKiB()
	cs := make([]*clientlib.Client, clients)
	for i := range cs {
		if cs[i], err = clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}}); err != nil {
			return err
		}
		defer func() { _ = cs[i].Close() }()
	}
	var mu sync.Mutex
	var sessions []*clientlib.Session
	var firstErr error
	var wg sync.WaitGroup
	for w := range 50 { // creators
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 50 {
				s, err := cs[i%clients].NewSession(ctx, clientlib.WithTTL(ttl))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					sessions = append(sessions, s)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, s := range sessions {
			_ = s.Close(context.Background())
		}
	}()
	if firstErr != nil {
		return fmt.Errorf("%d sessions: %w", n, firstErr)
	}
	t0, cpu0 := time.Now(), d.cpuSeconds()
	if *idleProfile != "" && n == firstIdleCount() {
		if err := cpuProfile(d.httpAddr, ttl, *idleProfile); err != nil {
			return fmt.Errorf("CPU profile: %w", err)
		}
		defer fmt.Printf("(CPU profile of coordd while %d sessions idled: %s)\n", n, *idleProfile)
	}
	time.Sleep(max(0, ttl-time.Since(t0)))
	cpu := (d.cpuSeconds() - cpu0) / time.Since(t0).Seconds()
	idle := d.rssKiB()
	lost := 0
	for _, s := range sessions {
		if s.Err() != nil {
			lost++
		}
	}
	if n == 0 {
		base.grewKiB, base.cpu = int64(idle-before), cpu
		fmt.Printf("%-10s %10.1fMiB %10.1fMiB %14s %11.1f%%\n", "none", float64(before)/1024, float64(idle)/1024, "-", 100*cpu)
		return nil
	}
	fmt.Printf("%-10d %10.1fMiB %10.1fMiB %12.1fKiB %11.1f%% %15.1f%%", n, float64(before)/1024, float64(idle)/1024,
		float64(int64(idle-before)-base.grewKiB)/float64(n), 100*cpu, 100*(cpu-base.cpu))
	if lost > 0 {
		fmt.Printf("   (%d sessions lost while idle)", lost)
	}
	fmt.Println()
	return nil
}

// firstIdleCount is the first count of -idle-sessions (the one profiled).
func firstIdleCount() int {
	n, _ := strconv.Atoi(strings.TrimSpace(strings.Split(*idleSessions, ",")[0]))
	return n
}
