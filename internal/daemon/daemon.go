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
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus"
	etcdversion "go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/test/bufconn"

	"github.com/coordd/coordd/auth"
	"github.com/coordd/coordd/cluster"
	"github.com/coordd/coordd/configcenter"
	"github.com/coordd/coordd/console"
	"github.com/coordd/coordd/election"
	"github.com/coordd/coordd/grantwatch"
	"github.com/coordd/coordd/internal/api"
	"github.com/coordd/coordd/internal/gateway"
	"github.com/coordd/coordd/internal/groupcommit"
	"github.com/coordd/coordd/kv"
	"github.com/coordd/coordd/lock"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	"github.com/coordd/coordd/session"
)

// Daemon is a running coordd. Stop it with Stop.
type Daemon struct {
	cfg       Config
	lg        *zap.Logger
	etcd      *embed.Etcd // nil with external etcd
	cli       *clientv3.Client
	locks     *lock.Manager
	elections *election.Manager
	txns      *groupcommit.Committer // batches locks' and elections' writes
	// The config watch cache and the holdings watch (grantwatch) run
	// from Start until Stop, which cancels them with stopBackground.
	configCache    *configcenter.Cache
	clock          *session.Clock
	stopBackground context.CancelFunc
	leader         *leaderWatch

	grpcLis    net.Listener
	httpLis    net.Listener
	grpcSrv    *grpc.Server
	httpSrv    *http.Server
	gwConn     *grpc.ClientConn
	gwSrv      *grpc.Server // the gateway's: in memory, trusts the identity it forwards
	gwLis      *bufconn.Listener
	authn      *api.Authenticator // the public server's
	authz      *auth.Authorizer
	owners     *api.Owners
	audit      *auth.Audit // nil without --audit-log
	closeAudit func() error
	health     *health.Server
	// healthMu orders updateHealth's read of the two flags with its write
	// of the status, so a late update never overwrites a newer one.
	healthMu  sync.Mutex
	serving   atomic.Bool // Start finished: the listeners serve
	hasLeader atomic.Bool // the etcd member has a leader (true with external etcd)
	learner   atomic.Bool // the etcd member is a learner: it serves no client requests
	leads     atomic.Bool // the etcd member leads etcd (never with external etcd)
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

// Start starts etcd (or connects to it) and the listeners, and returns once
// they serve. An embedded etcd is ready by then; an external one may not be
// reachable yet, which Ready (and /readyz) reports. ctx bounds start-up only.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(false); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	d := &Daemon{cfg: cfg, lg: cfg.Logger, serveErr: make(chan error, 2)}
	d.stopped, d.markStopped = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			d.closeStartup()
		}
	}()

	// Everything that can fail fast comes before etcd touches the data
	// dir: a data dir in use or a taken port leaves etcd's data untouched
	// (the data dir and its lock file may have been created). Until the
	// listeners are served, connections to them are closed at once.
	embedded := len(cfg.EtcdEndpoints) == 0
	if embedded {
		if d.dirLock, err = lockDataDir(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if d.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("gRPC listener (--grpc-addr): %w", err)
	}
	if d.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("HTTP listener (--http-addr): %w", err)
	}
	d.refusers = []*refuser{refuse(d.grpcLis), refuse(d.httpLis)}

	if embedded {
		d.etcd, d.cli, err = startEmbedded(ctx, cfg, &d.quietEtcd)
	} else {
		d.cli, err = connectExternal(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}

	// Three election timeouts without a leader, as etcd's own
	// require-leader check uses.
	d.leader = newLeaderWatch(d.etcd, 3*time.Duration(cfg.ElectionMs)*time.Millisecond)
	d.hasLeader.Store(true)
	d.leader.onLeader = func(has bool) {
		d.hasLeader.Store(has)
		d.updateHealth()
	}
	d.leader.onLearner = func(l bool) {
		d.learner.Store(l)
		d.updateHealth()
	}
	d.leads.Store(d.leader.led)
	d.leader.onLeads = func(l bool) {
		d.leads.Store(l)
		d.updateHealth()
	}
	bindToLeader(d.cli, d.leader)
	if err := d.loadAuth(); err != nil {
		return nil, err
	}
	// coordd's own metrics, on this daemon's registry (several daemons
	// may share a test process); etcd's and Go's are on the default one.
	registry := prometheus.NewRegistry()
	d.registry = registry
	metrics := grpcMetrics(registry)
	apiMetrics := api.NewMetrics(registry)
	d.owners = &api.Owners{} // its managers are set below, before serving
	// Concurrent lock and election mutations share etcd transactions.
	d.txns = groupcommit.Direct(d.cli)
	if !cfg.NoGroupCommit {
		d.txns = groupcommit.New(d.cli)
	}
	var limits *auth.Limits
	if cfg.RateLimit > 0 || cfg.PublishRate > 0 {
		limits = &auth.Limits{
			PerPrincipal: rate.Limit(cfg.RateLimit), PrincipalBurst: cfg.RateBurst,
			PublishPerSpace: rate.Limit(cfg.PublishRate), PublishSpaceBurst: cfg.PublishBurst,
		}
	}
	// Two servers share every service: the public one on --grpc-addr,
	// and an in-memory one that only the REST gateway reaches, which
	// trusts the identity the gateway authenticated from the HTTP request.
	authOf := func(an api.Authn) api.Auth {
		return api.Auth{Authn: an, Authz: d.authz, Owners: d.owners, Limits: limits, Metrics: apiMetrics, Audit: d.audit, AuditFailed: func(err error) {
			d.lg.Error("audit log not written", zap.Error(err))
		}}
	}
	// Unary calls, and each call on a Calls stream (api.CallServer), run
	// through these.
	unary := func(an api.Authn) []grpc.UnaryServerInterceptor {
		return []grpc.UnaryServerInterceptor{api.UnaryArrival(d.txns.Arrived), metrics.UnaryServerInterceptor(), api.UnaryErrors(d.lg), api.UnaryAuth(authOf(an)), api.UnaryRequireLeader(d.leader.Lost)}
	}
	serverOpts := func(an api.Authn) []grpc.ServerOption {
		a := authOf(an)
		return []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(unary(an)...),
			grpc.ChainStreamInterceptor(metrics.StreamServerInterceptor(), api.StreamErrors(d.lg), api.StreamAuth(a), api.StreamRequireLeader(d.leader.Lost)),
			grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
			grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(connWindow),
			grpc.ForceServerCodecV2(api.Codec()), // protobuf, and messages marshaled once for many streams
			// Idle watch connections are the common case: keep the read buffer
			// small. (grpc-go releases the write buffer after each flush by
			// default; the SharedWriteBuffer(true) that asked for it is
			// deprecated.)
			grpc.ReadBufferSize(8 << 10),
			grpc.MaxConcurrentStreams(10000),
			// Handlers run on long-lived workers while one is free (else
			// on a new goroutine, which pays to grow its stack through
			// the interceptors and etcd's client). A stream holds its
			// worker for its whole life, so once more long-lived streams
			// (keep-alives, watches) are open than there are workers,
			// calls run on new goroutines as without this option: under
			// 64 clients on 64 locks that growth was 6-9 % of the
			// daemon's CPU, yet 256 workers saved no measurable CPU per
			// call, so the workers stay few.
			grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
			grpc.ConnectionTimeout(10 * time.Second),
			// A forced stop still waits for handlers to return (their
			// contexts are cancelled), so nothing touches etcd after it is
			// closed.
			grpc.WaitForHandlers(true),
		}
	}
	publicOpts := serverOpts(d.authn)
	if cfg.TLS != nil {
		publicOpts = append(publicOpts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	d.grpcSrv = grpc.NewServer(publicOpts...)
	d.gwSrv = grpc.NewServer(serverOpts(&api.Authenticator{Forwarded: true})...)
	servers := []*grpc.Server{d.grpcSrv, d.gwSrv}
	sessions := session.NewManager(d.cli, cfg.KeyRoot)
	sessions.LimitPerPrincipal(max(cfg.MaxSessionsPerPrincipal, 0))
	waiters := &api.Waiters{Max: max(cfg.MaxWaitersPerPrincipal, 0)}
	var renew session.Renewer
	member := randomMemberName()
	if d.etcd != nil {
		renew = renewer(d.etcd.Server)
		sessions.RenewWith(renew)
		member = fmt.Sprintf("%x", uint64(d.etcd.Server.MemberID()))
	}
	// coordd keeps the sessions' time, not etcd's lessor (session.Clock).
	d.clock = session.NewClock(d.cli, cfg.KeyRoot, member, renew, d.lg.Named("sessions"))
	ended := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordd_sessions_ended_total",
		Help: "Sessions this member ended because no member saw them renewed within their TTL (coordd's session clock).",
	})
	registry.MustRegister(ended)
	d.clock.Ended = func(n int) { ended.Add(float64(n)) }
	sessions.UseClock(d.clock)
	// One etcd watch per prefix tells every keep-alive stream of this
	// member when a lock grant or leadership it watches ends, and every
	// waiter when an entry ahead of it goes.
	holdings := grantwatch.New(d.cli, cfg.KeyRoot+"lock/", cfg.KeyRoot+"election/")
	d.locks = lock.NewManager(d.cli, cfg.KeyRoot, holdings, d.txns)
	d.elections = election.NewManager(d.cli, cfg.KeyRoot, holdings, d.txns)
	d.owners.Sessions, d.owners.Locks, d.owners.Elections = sessions, d.locks, d.elections
	sessionSvc := api.NewSessionServer(sessions, api.Holdings{Watcher: holdings, Locks: d.locks, Elections: d.elections}, d.stopped.Done(), apiMetrics)
	streams := api.NewKeepAliveStreams() // grants followed on their holders' keep-alive streams
	sessionSvc.Streams = streams
	registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordd_keepalive_streams",
		Help: "Shared keep-alive streams open on this member: one per SDK client with sessions here (clients prefer the member that leads etcd).",
	}, func() float64 { return float64(streams.Len()) }))
	sessionSvc.MaxRequestBytes = cfg.MaxRequestBytes
	pageKey, err := pageTokenKey(ctx, d.cli, cfg.KeyRoot)
	if err != nil {
		return nil, err
	}
	if err := sessionSvc.SetPageTokenKey(pageKey); err != nil {
		return nil, err
	}
	sessionSvc.SeesAll = func(ctx context.Context) bool {
		p := api.PrincipalFrom(ctx)
		read, _ := d.authz.Allows(p, auth.ClusterRead, auth.Resource{})
		admin, _ := d.authz.Allows(p, auth.ClusterAdmin, auth.Resource{})
		return read || admin
	}
	lockSvc := api.NewLockServer(d.stopped, d.locks, d.elections, sessions, apiMetrics)
	lockSvc.Streams = streams
	lockSvc.Waiters = waiters
	lockSvc.TokensVisible = func(ctx context.Context, name string) bool {
		ok, _ := d.authz.Allows(api.PrincipalFrom(ctx), auth.LockRelease, auth.Resource{Kind: auth.Lock, Name: name})
		return ok
	}
	electionSvc := api.NewElectionServer(d.stopped, d.elections, sessions, apiMetrics)
	electionSvc.Streams = streams
	electionSvc.Waiters = waiters
	// The SDK's calls with its sessions, pipelined on one stream per
	// client; each runs as the public server's unary RPC of its name.
	sessionSvc.CallStream = api.NewCallServer(lockSvc, electionSvc, unary(d.authn), apiMetrics, d.stopped.Done(), cfg.NoCallStream)
	for _, srv := range servers {
		coorddv1.RegisterSessionServiceServer(srv, sessionSvc)
		coorddv1.RegisterLockServiceServer(srv, lockSvc)
		coorddv1.RegisterElectionServiceServer(srv, electionSvc)
	}
	configStore := configcenter.NewStore(d.cli, cfg.KeyRoot, cfg.ConfigLimits)
	if embedded {
		// After a restore (see Restore), before serving anyone and before
		// the config cache loads.
		if err := endRestoredSessions(ctx, cfg.DataDir, d.cli, d.lg, configStore.MarkRestored); err != nil {
			return nil, err
		}
	}
	d.configCache = configcenter.NewCache(configStore, cfg.ConfigCache)
	configSvc := api.NewConfigServer(d.stopped, configStore, d.configCache, apiMetrics)
	statusEndpoint, local := cfg.EtcdClientURL, cluster.Local{}
	if d.etcd != nil {
		local = cluster.Local{MemberID: uint64(d.etcd.Server.MemberID()), Quota: cfg.QuotaBackendBytes, Defragment: d.etcd.Server.Defragment, Measure: d.measure}
	} else {
		statusEndpoint = d.cli.Endpoints()[0]
	}
	clusterMgr := cluster.NewManager(d.cli, cluster.Options{
		Endpoint: statusEndpoint, Local: local, KeyRoot: cfg.KeyRoot, Version: cfg.Version, HealthInterval: cfg.HealthInterval,
	})
	clusterSvc := api.NewClusterServer(clusterMgr, cfg.Version)
	clusterSvc.Groups = d.authz.Groups
	kvSvc := api.NewKVServer(d.stopped, kv.NewStore(d.cli, cfg.KeyRoot))
	for _, srv := range servers {
		coorddv1.RegisterKVServiceServer(srv, kvSvc)
		coorddv1.RegisterConfigServiceServer(srv, configSvc)
		coorddv1.RegisterClusterServiceServer(srv, clusterSvc)
	}
	state := stateSources{
		sessions: sessions, locks: d.locks, elections: d.elections, cache: d.configCache, cluster: clusterMgr,
		alarms: d.currentAlarms, lg: d.lg.Named("metrics"), commits: d.txns,
	}
	if d.etcd != nil {
		state.quota = cfg.QuotaBackendBytes
		state.learner = func() bool { return isLearner(d.etcd) }
	}
	registry.MustRegister(newStateCollector(state))
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	metrics.InitializeMetrics(d.grpcSrv)

	// The gateway reaches the internal server in memory, so every
	// interceptor applies to REST as to gRPC.
	d.gwLis = bufconn.Listen(1 << 20)
	d.gwConn, err = grpc.NewClient("passthrough:///coordd-gateway",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return d.gwLis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("gateway connection: %w", err)
	}
	var ui http.Handler
	if !cfg.NoConsole {
		ui = console.Handler()
	}
	handler, err := gateway.New(context.WithoutCancel(ctx), gateway.Options{
		Conn:            d.gwConn,
		MaxRequestBytes: int64(cfg.MaxRequestBytes),
		BodyTimeout:     cfg.HTTPBodyTimeout,
		Ready:           d.Ready,
		Gatherer:        prometheus.Gatherers{prometheus.DefaultGatherer, registry},
		Pprof:           cfg.EnablePprof,
		Forward:         d.authn.ForwardedMetadata,
		Forged:          api.IsForwardedHeader,
		Guard:           d.guardHTTP,
		ReadyNote:       d.authNote,
		Console:         ui,
		Browsers:        gateway.BrowserPolicy{AllowedOrigins: cfg.HTTPAllowedOrigins, AllowedHosts: cfg.HTTPAllowedHosts},
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	d.httpSrv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         cfg.TLS,
		ErrorLog:          zap.NewStdLog(d.lg.Named("http")),
	}

	d.stopRefusing()
	bgCtx, stopBackground := context.WithCancel(context.Background())
	d.stopBackground = stopBackground
	d.wg.Add(6)
	go func() {
		defer d.wg.Done()
		d.leader.run(d.stopped.Done())
	}()
	go func() {
		defer d.wg.Done()
		d.watchAlarms(bgCtx)
	}()
	if embedded {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			clusterMgr.RunHealthReports(bgCtx, cfg.HealthInterval, cfg.Version, d.lg.Named("health"))
		}()
		if cfg.AutoDefrag.On() {
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				clusterMgr.RunAutoDefrag(bgCtx, cfg.AutoDefrag, d.lg.Named("defrag"))
			}()
		}
	}
	if !embedded && !cfg.Compaction.Off() {
		// An embedded member compacts itself (on the etcd leader).
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := cluster.RunCompactor(bgCtx, d.cli, cfg.Compaction, d.lg.Named("compactor")); err != nil {
				d.lg.Error("etcd compaction is off", zap.Error(err)) // validated at start: cannot happen
			}
		}()
	}
	go func() {
		defer d.wg.Done()
		d.configCache.Run(bgCtx)
	}()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.clock.Run(bgCtx)
	}()
	go func() {
		defer d.wg.Done()
		holdings.Run(bgCtx)
	}()
	go func() {
		defer d.wg.Done()
		if err := d.grpcSrv.Serve(d.grpcLis); err != nil {
			d.serveErr <- fmt.Errorf("gRPC server: %w", err)
		}
	}()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.gwSrv.Serve(d.gwLis); err != nil {
			d.serveErr <- fmt.Errorf("gateway's gRPC server: %w", err)
		}
	}()
	if cfg.Reload != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for {
				select {
				case <-bgCtx.Done():
					return
				case <-cfg.Reload:
					if err := d.Reload(); err != nil {
						d.lg.Error("reload refused; what was in force stays", zap.Error(err))
					} else {
						d.lg.Info("reloaded the TLS certificates, the token file and the policy")
					}
				}
			}
		}()
	}
	go func() {
		defer d.wg.Done()
		var err error
		if cfg.TLS != nil {
			err = d.httpSrv.ServeTLS(d.httpLis, "", "")
		} else {
			err = d.httpSrv.Serve(d.httpLis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.serveErr <- fmt.Errorf("HTTP server: %w", err)
		}
	}()
	if embedded {
		// A member removed from the cluster stops its etcd: stop with it
		// rather than serve calls that would wait on a stopped server.
		// Not in d.wg: it may call Stop, which waits for d.wg.
		go func() {
			select {
			case <-d.etcd.Server.StopNotify():
				d.lg.Error("the embedded etcd stopped; stopping coordd", zap.Error(d.etcdStopReason()))
				_ = d.Stop(context.Background()) // its result is Stop's callers' to report
			case <-d.stopped.Done():
			}
		}()
	}
	d.serving.Store(true)
	d.updateHealth()
	d.logReady()
	return d, nil
}

// measure reads the embedded member's raft position and database size
// from the server (see cluster.Local.Measure).
func (d *Daemon) measure() cluster.Health {
	s := d.etcd.Server
	be := s.Backend()
	return cluster.Health{
		LeaderID: uint64(s.Leader()), RaftTerm: s.Term(), RaftIndex: s.CommittedIndex(), AppliedIndex: s.AppliedIndex(),
		DBSize: be.Size(), DBSizeInUse: be.SizeInUse(), EtcdVersion: etcdversion.Version,
	}
}

// updateHealth sets the gRPC health status: SERVING once the daemon
// serves and while its etcd member has a leader (always, with an external
// etcd) and is not a learner, NOT_SERVING otherwise. Clients probe it to decide when a member
// they gave up on can be used again. The status of
// coorddv1.LeaderHealthService is SERVING while, on top of that, the
// embedded member leads etcd (the SDK prefers that member). After Stop's
// health.Shutdown both stay NOT_SERVING.
func (d *Daemon) updateHealth() {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if d.serving.Load() && d.hasLeader.Load() && !d.learner.Load() {
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
// within one second.
func (d *Daemon) Ready(ctx context.Context) error {
	select {
	case <-d.stopped.Done():
		return api.ErrStopping
	default:
	}
	if d.etcd != nil && isLearner(d.etcd) {
		return errors.New("this member is a learner (added, not yet promoted): it serves no requests until coordctl member promote " + d.cfg.Name)
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
	d.markStopped()
	d.health.Shutdown()

	var errs *multierror.Error
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		// Timed out, as the gRPC side below may: close what is left. Its
		// error (of listeners Shutdown already closed) adds nothing.
		_ = d.httpSrv.Close()
	}
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
	if err := d.gwConn.Close(); err != nil {
		errs = multierror.Append(errs, err)
	}
	d.stopBackground()
	d.wg.Wait()
	d.locks.Close()
	d.elections.Close()
	d.txns.Close()
	if err := d.closeBackend(); err != nil {
		errs = multierror.Append(errs, err)
	}
	d.lg.Info("coordd stopped")
	return errs.ErrorOrNil()
}

// stopRefusing ends the refusal of connections that Start begins when it
// binds the listeners.
func (d *Daemon) stopRefusing() {
	for _, r := range d.refusers {
		r.Stop()
	}
	d.refusers = nil
}

// closeStartup undoes a Start that failed half-way. Start returns the error
// that stopped it; errors of this cleanup are not reported.
func (d *Daemon) closeStartup() {
	d.stopRefusing()
	if d.gwConn != nil {
		_ = d.gwConn.Close()
	}
	for _, l := range []net.Listener{d.grpcLis, d.httpLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	d.txns.Close() // its committer's goroutine, if it was started
	_ = d.closeBackend()
}

func (d *Daemon) closeBackend() error {
	var err error
	if d.cli != nil {
		// The in-process client reports its own cancellation on Close.
		if cerr := d.cli.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
			err = cerr
		}
	}
	if d.etcd != nil {
		closeEtcd(d.etcd, d.lg, 2*time.Duration(d.cfg.ElectionMs)*time.Millisecond)
	}
	d.dirLock.unlock()
	if d.closeAudit != nil {
		_ = d.closeAudit() // written line by line: nothing is lost
	}
	return err
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
