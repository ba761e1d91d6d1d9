package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
