package daemontest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// TestConfig is Config for t: data in t's temporary directory, etcd's
// client listener on a fresh socket, the peer listener on a free loopback
// port, warnings and errors logged to t.
func TestConfig(t testing.TB) daemon.Config {
	t.Helper()
	return Config(t.TempDir(), freeport.Socket(t), freeport.URL(t), zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
}

// Start starts a daemon and stops it when the test ends. It skips the
// test in -short mode.
func Start(t testing.TB, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd and the daemon")
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(30*time.Second))
	defer cancel()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("daemon.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return d
}

// Client is an SDK client of endpoints, closed when the test ends.
func Client(t testing.TB, endpoints ...string) *clientlib.Client {
	t.Helper()
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatalf("clientlib.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster starts an n-member cluster of TestConfig members (each changed
// by opts) and stops it when the test ends.
func Cluster(t testing.TB, n int, opts ...func(*daemon.Config)) []*daemon.Daemon {
	t.Helper()
	return StartAll(t, ClusterConfigs(t, n, opts...))
}

// GRPCAddrs are the members' gRPC addresses, in order: a client's
// endpoints for the whole cluster.
func GRPCAddrs(ds []*daemon.Daemon) []string {
	addrs := make([]string, len(ds))
	for i, d := range ds {
		addrs[i] = d.GRPCAddr()
	}
	return addrs
}

// ClusterConfigs returns the configurations of an n-member cluster:
// members m0, m1, ... of TestConfig, each changed by opts.
func ClusterConfigs(t testing.TB, n int, opts ...func(*daemon.Config)) []daemon.Config {
	t.Helper()
	cfgs := make([]daemon.Config, n)
	var members []string
	for i := range cfgs {
		cfgs[i] = TestConfig(t)
		for _, o := range opts {
			o(&cfgs[i])
		}
		cfgs[i].Name = fmt.Sprintf("m%d", i)
		peerURL := cfgs[i].ListenPeerURLs[0]
		if len(cfgs[i].AdvertisePeerURLs) > 0 {
			peerURL = cfgs[i].AdvertisePeerURLs[0]
		}
		members = append(members, cfgs[i].Name+"="+peerURL)
	}
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(members, ",")
	}
	return cfgs
}

// StartAll starts the members of a cluster at once (each waits for a
// quorum), waits until each says it has an etcd leader (members without
// TLS), and stops them, at once too, when the test ends: a member of a
// cluster takes a second to stop (etcd gives its peer listener that long
// to go idle, which raft's streams never do), so one after another they
// cost the suite two seconds more per cluster. It skips the test in
// -short mode.
func StartAll(t testing.TB, cfgs []daemon.Config) []*daemon.Daemon {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster (not in -short mode)")
	}
	type started struct {
		i   int
		d   *daemon.Daemon
		err error
	}
	ds := make([]*daemon.Daemon, len(cfgs))
	starts := make(chan started, len(cfgs))
	// Bounds start-up only: members that cannot reach each other fail
	// the test instead of waiting for a quorum until the test times out.
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Minute))
	defer cancel()
	for i := range cfgs {
		go func() {
			d, err := daemon.Start(ctx, cfgs[i])
			starts <- started{i, d, err}
		}()
	}
	// Every member that started is stopped when the test ends, also when
	// another failed: a member left running would outlive its data dir.
	var errs []error
	for range cfgs {
		s := <-starts
		if s.err != nil {
			errs = append(errs, s.err)
			cancel() // the others would wait for a quorum forever
			continue
		}
		ds[s.i] = s.d
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for i, d := range ds {
			if d == nil {
				continue
			}
			wg.Go(func() {
				if err := d.Stop(context.Background()); err != nil {
					t.Errorf("Stop %s: %v", cfgs[i].Name, err)
				}
			})
		}
		wg.Wait()
	})
	if len(errs) > 0 {
		t.Fatalf("cluster start: %v", errors.Join(errs...))
	}
	// A member serves once its etcd has joined, which may be before it
	// has heard of a leader (a slow election on a busy machine): wait for
	// each to say it has one, so the test's first call is not refused.
	for i, d := range ds {
		if cfgs[i].TLS != nil {
			continue
		}
		waitForLeader(t, cfgs[i].Name, d.GRPCAddr())
	}
	return ds
}

// waitForLeader waits until the member at addr says, through gRPC's
// health service, that its etcd has a leader.
func waitForLeader(t testing.TB, name, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	health := healthpb.NewHealthClient(conn)
	wait.Within(t, 30*time.Second, name+" to have an etcd leader", func() bool {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
}

// ConfigTestConfig is TestConfig with quick config-cache bookmarks, so
// that tests tell a stalled subscription from a quiet namespace fast.
func ConfigTestConfig(t testing.TB) daemon.Config {
	t.Helper()
	cfg := TestConfig(t)
	cfg.ConfigCache.Bookmark = 100 * time.Millisecond
	cfg.ConfigCache.Progress = 50 * time.Millisecond
	return cfg
}

// FastSubscribe are subscription options for tests: a short stall timeout
// and reconnect backoff.
var FastSubscribe = []clientlib.SubscribeOption{
	clientlib.WithStallTimeout(time.Second),
	clientlib.WithReconnectBackoff(50*time.Millisecond, 500*time.Millisecond),
}
