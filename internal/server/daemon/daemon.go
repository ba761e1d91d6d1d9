// Package daemon runs coordd: it starts (or connects to) etcd, serves the
// gRPC API and the HTTP listener (REST gateway, health, metrics, OpenAPI),
// and stops all of it gracefully.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	etcdversion "go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/barrier"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/server/api"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Daemon is a running coordd. Stop it with Stop.
type Daemon struct {
	cfg       Config
	lg        *zap.Logger
	etcd      *embed.Etcd // nil with external etcd
	cli       *clientv3.Client
	locks     *lock.Manager
	elections *election.Manager
	barriers  *barrier.Manager
	txns      *groupcommit.Committer // batches locks' and elections' writes
	identity  api.ClusterIdentity    // names the cluster in every answer
	// stops undoes what Start built, in reverse order: in Stop, and when
	// Start fails half-way.
	stops       stopper
	configCache *configcenter.Cache
	configStore *configcenter.Store // its secret keys are reloaded
	clock       *session.Clock
	leader      *leaderWatch

	grpcLis net.Listener
	httpLis net.Listener
	grpcSrv *grpc.Server
	httpSrv *http.Server
	gwConn  *grpc.ClientConn
	gwSrv   *grpc.Server // the gateway's: in memory, trusts the identity it forwards
	gwLis   *bufconn.Listener
	authn   *api.Authenticator // the public server's
	authz   *auth.Authorizer
	owners  *api.Owners
	audit   *auth.Audit // nil without --audit-log
	health  *health.Server
	// healthMu orders updateHealth's read of the two flags with its write
	// of the status, so a late update never overwrites a newer one.
	healthMu sync.Mutex
	serving  atomic.Bool // Start finished: the listeners serve
	disk     *diskWatch  // nil with external etcd or --slow-disk-threshold 0
	commits  atomic.Bool // the etcd member has a leader and confirms reads through it (true with external etcd)
	learner  atomic.Bool // the etcd member is a learner: it serves no client requests
	leads    atomic.Bool // the etcd member leads etcd (never with external etcd)
	// registry holds coordd's own metrics (its gRPC server's among them);
	// /metrics serves it with the default registry's (etcd's and Go's).
	registry *prometheus.Registry
	// stopped is done once Stop begins: streams end, waits give up.
	stopped     context.Context
	markStopped context.CancelFunc
	serveErr    chan error
	wg          sync.WaitGroup // serving goroutines
	stopOnce    sync.Once
	// quietEtcd drops the errors etcd logs about its own listeners closing.
	quietEtcd atomic.Bool
	stopErr   error
	// dirLock keeps a second daemon off the data dir (embedded etcd only).
	dirLock *dataDirLock
	// refusers turn connections away until the listeners are served.
	refusers []*refuser
	// alarms are etcd's active alarms, kept by watchAlarms.
	stopReasonOnce sync.Once
	stopReason     error // why the embedded etcd stopped on its own
	alarmMu        sync.Mutex
	alarms         []cluster.Alarm
}

// grpcMetrics are the daemon's gRPC server metrics, on its own registry
// (namespaced: etcd registers grpc_server_* for its own listener on the
// default one), so that each daemon in a process counts its own calls.
func grpcMetrics(registry prometheus.Registerer) *grpcprom.ServerMetrics {
	m := grpcprom.NewServerMetrics(
		grpcprom.WithServerCounterOptions(grpcprom.WithNamespace("coordd")),
		grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace("coordd")))
	registry.MustRegister(m)
	return m
}

// HTTP/2 flow-control windows of coordd's gRPC server and of its client
// of an external etcd, fixed: gRPC's bandwidth-delay estimate sends a ping
// for about every round trip that carries data, as many writes and reads
// as the calls themselves on a connection of small requests and answers.
// They are what the estimate grows to for a large message on a long link.
const (
	streamWindow = 8 << 20
	connWindow   = 16 << 20
)

// measure reads the embedded member's raft position and database size
// from the server (see cluster.Local.Measure).
func (d *Daemon) measure() cluster.Health {
	s := d.etcd.Server
	be := s.Backend()
	return cluster.Health{
		LeaderID: uint64(s.Leader()), RaftTerm: s.Term(), RaftIndex: s.CommittedIndex(), AppliedIndex: s.AppliedIndex(),
		DBSize: be.Size(), DBSizeInUse: be.SizeInUse(), EtcdVersion: etcdversion.Version,
		DiskSlow: d.disk != nil && d.disk.slow.Load(),
	}
}

// updateHealth sets the gRPC health status: SERVING once the daemon
// serves and while its etcd member can commit (it has a leader and reads
// through it are confirmed, see leaderWatch; always, with an external
// etcd) and is not a learner, NOT_SERVING otherwise. Clients probe it to decide when a member
// they gave up on can be used again. The status of
// coorddv1.LeaderHealthService is SERVING while, on top of that, the
// embedded member leads etcd (the SDK prefers that member). After Stop's
// health.Shutdown both stay NOT_SERVING.
func (d *Daemon) updateHealth() {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if d.serving.Load() && d.commits.Load() && !d.learner.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	d.health.SetServingStatus("", st)
	if d.etcd == nil {
		return // no member of ours leads: the leader's service stays unknown
	}
	lead := healthpb.HealthCheckResponse_NOT_SERVING
	if st == healthpb.HealthCheckResponse_SERVING && d.leads.Load() {
		lead = healthpb.HealthCheckResponse_SERVING
	}
	d.health.SetServingStatus(coorddv1.LeaderHealthService, lead)
}

// logReady tells an operator, on the first screen, where everything is and
// how to stop it.
func (d *Daemon) logReady() {
	scheme := "http"
	if d.cfg.TLS != nil {
		scheme = "https"
	}
	fields := []zap.Field{
		zap.Int("pid", os.Getpid()), // under "go run", $! is the go tool's
		zap.String("grpc", d.GRPCAddr()),
		zap.String("http", scheme+"://"+d.HTTPAddr()),
	}
	if d.etcd != nil {
		dir, _ := filepath.Abs(d.cfg.DataDir)
		reach := " (this host only)"
		if isUnixURL(d.cfg.EtcdClientURL) {
			reach = " (this user only)"
		}
		fields = append(fields,
			zap.String("data-dir", dir),
			zap.String("etcd-client", d.cfg.EtcdClientURL+reach),
			zap.Strings("etcd-peers", d.cfg.ListenPeerURLs),
			zap.Int("members", len(d.etcd.Server.Cluster().Members())))
	} else {
		fields = append(fields, zap.Strings("etcd", d.cfg.EtcdEndpoints))
	}
	fields = append(fields, zap.String("key-root", d.cfg.KeyRoot), zap.String("stop", "Ctrl-C or SIGTERM (a second one forces)"))
	d.lg.Info("coordd is ready", fields...)
}

// GRPCAddr is the address the gRPC listener is bound to.
func (d *Daemon) GRPCAddr() string { return d.grpcLis.Addr().String() }

// HTTPAddr is the address the HTTP listener is bound to.
func (d *Daemon) HTTPAddr() string { return d.httpLis.Addr().String() }

// Etcd is the embedded etcd member, or nil with external etcd.
func (d *Daemon) Etcd() *embed.Etcd { return d.etcd }

// Ready reports whether etcd has a leader and answers a linearizable read,
// within one second, and (embedded) whether the member can commit (see
// leaderWatch).
func (d *Daemon) Ready(ctx context.Context) error {
	select {
	case <-d.stopped.Done():
		return api.ErrStopping
	default:
	}
	if d.etcd != nil && isLearner(d.etcd) {
		return errors.New("this member is a learner (added, not yet promoted): it serves no requests until coordctl member promote " + d.cfg.Name)
	}
	if d.etcd != nil && !d.commits.Load() {
		return errors.New("this member cannot commit: its etcd member has no leader, or cannot reach a quorum of its peers (cut off from them?)")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := d.cli.Get(ctx, d.cfg.KeyRoot, clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return d.alarmError()
}

// Wait blocks until ctx is done or a listener or etcd fails, and returns the
// failure (nil when ctx ended).
func (d *Daemon) Wait(ctx context.Context) error {
	var etcdErr <-chan error
	var etcdStopped <-chan struct{}
	if d.etcd != nil {
		etcdErr, etcdStopped = d.etcd.Err(), d.etcd.Server.StopNotify()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-d.serveErr:
		return err
	case err := <-etcdErr:
		return fmt.Errorf("embedded etcd: %w", err)
	case <-etcdStopped:
		return d.etcdStopReason()
	}
}

// etcdStopReason says why the embedded etcd stopped, once it has. A
// member learns of its removal either by applying it or from a peer that
// refuses it; in the second case its own member list still has it, so the
// peers are asked.
func (d *Daemon) etcdStopReason() error {
	d.stopReasonOnce.Do(func() {
		d.stopReason = errors.New("embedded etcd stopped on its own (see its log above)")
		srv := d.etcd.Server
		if !srv.IsMemberExist(srv.MemberID()) {
			d.stopReason = ErrMemberRemoved
			return
		}
		// A busy machine may leave a peer's answer late: ask a few times
		// while none answers.
		for range 5 {
			removed, answered := removedByPeers(srv)
			if removed {
				d.stopReason = ErrMemberRemoved
			}
			if answered {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return d.stopReason
}

// removedByPeers asks the other members (their peer listener's member
// list) whether this member is still one of them; answered is false when
// none answered.
func removedByPeers(srv *etcdserver.EtcdServer) (removed, answered bool) {
	hc := &http.Client{Timeout: time.Second}
	if info := srv.Cfg.PeerTLSInfo; !info.Empty() {
		tc, err := info.ClientConfig()
		if err != nil {
			return false, false
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	defer hc.CloseIdleConnections()
	for _, m := range srv.Cluster().Members() {
		if m.ID == srv.MemberID() {
			continue
		}
		for _, u := range m.PeerURLs {
			resp, err := hc.Get(strings.TrimSuffix(u, "/") + "/members")
			if err != nil {
				continue
			}
			var members []membership.Member
			err = json.NewDecoder(resp.Body).Decode(&members)
			_ = resp.Body.Close()
			if err != nil || len(members) == 0 {
				continue
			}
			return !slices.ContainsFunc(members, func(o membership.Member) bool { return o.ID == srv.MemberID() }), true
		}
	}
	return false, false
}

// ErrMemberRemoved is Wait's error once this daemon's etcd member has been
// removed from the cluster: it stops for good, and its data dir cannot be
// used again (start afresh with an empty one to rejoin as a new member).
var ErrMemberRemoved = errors.New("this member was removed from the cluster (coordctl member remove): its etcd stopped; " +
	"to rejoin, add it again (coordctl member add) and start it with an empty --data-dir")

// Stop stops the daemon: it stops accepting, ends keep-alive streams with
// Unavailable, waits up to ShutdownTimeout for calls in flight, then closes
// etcd. ctx cancelled early makes the stop forceful. Stop is idempotent.
func (d *Daemon) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() { d.stopErr = d.stop(ctx) })
	return d.stopErr
}

func (d *Daemon) stop(ctx context.Context) error {
	d.lg.Info("coordd stopping")
	d.quietEtcd.Store(true)
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ShutdownTimeout)
	defer cancel()
	err := d.stops.stopAll(ctx)
	d.lg.Info("coordd stopped")
	return err
}

// stopRefusing ends the refusal of connections that Start begins when it
// binds the listeners.
func (d *Daemon) stopRefusing() {
	for _, r := range d.refusers {
		r.Stop()
	}
	d.refusers = nil
}

// closeStartup undoes a Start that failed half-way, by the same steps as
// Stop, and removes a data dir this start made. Start returns the error
// that stopped it; errors of this cleanup are not reported.
func (d *Daemon) closeStartup() {
	if d.dirLock != nil {
		d.dirLock.discard = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	_ = d.stops.stopAll(ctx)
}

// stopServers stops both gRPC servers gracefully, and forcefully once ctx
// ends; forced or not, it returns once their handlers have.
func (d *Daemon) stopServers(ctx context.Context) {
	graceful := make(chan struct{})
	go func() {
		defer close(graceful)
		d.grpcSrv.GracefulStop()
		d.gwSrv.GracefulStop()
	}()
	select {
	case <-graceful:
	case <-ctx.Done():
		d.lg.Warn("graceful stop timed out; closing remaining calls")
		d.grpcSrv.Stop()
		d.gwSrv.Stop()
		<-graceful
	}
}

// Run starts the daemon, serves until ctx is done or something fails, then
// stops it.
func Run(ctx context.Context, cfg Config) error {
	d, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	werr := d.Wait(ctx)
	serr := d.Stop(context.WithoutCancel(ctx))
	if werr != nil {
		return werr
	}
	return serr
}

// randomMemberName names a member of an external etcd cluster in the
// session renewals it writes (an embedded member uses its etcd id).
func randomMemberName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	return "x" + hex.EncodeToString(b)
}
