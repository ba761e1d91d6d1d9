package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/test/bufconn"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/barrier"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/console"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/history"
	"github.com/coordd/coordd/internal/kv"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/server/api"
	"github.com/coordd/coordd/internal/server/gateway"
	"github.com/coordd/coordd/internal/server/trends"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/keyring"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Start starts etcd (or connects to it) and the listeners, and returns once
// they serve. An embedded etcd is ready by then; an external one may not be
// reachable yet, which Ready (and /readyz) reports. ctx bounds start-up only.
//
// The steps, in order: claim the data dir and the ports (everything that
// can fail fast, before etcd touches the data dir), start or reach etcd,
// follow its leadership, load the policy, build the gRPC servers and the
// services behind them, build the HTTP side, then serve.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(false); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	d := &Daemon{cfg: cfg, lg: cfg.Logger, serveErr: make(chan error, 2)}
	d.stopped, d.markStopped = context.WithCancel(context.Background())
	d.stops.onStop("the daemon's stop mark", done(d.markStopped))
	defer func() {
		if err != nil {
			d.closeStartup()
		}
	}()
	if err := d.claim(); err != nil {
		return nil, err
	}
	if d.embedded() {
		d.etcd, d.cli, err = startEmbedded(ctx, cfg, &d.quietEtcd)
	} else {
		d.cli, err = connectExternal(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	if d.etcd != nil {
		d.stops.onStop("the embedded etcd", done(func() { closeEtcd(d.etcd, d.lg, 2*time.Duration(d.cfg.ElectionMs)*time.Millisecond) }))
	}
	d.stops.onStop("the etcd client", func(context.Context) error {
		// The in-process client reports its own cancellation on Close.
		if err := d.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	})
	d.followLeader()
	if err := d.loadAuth(); err != nil {
		return nil, err
	}
	p := d.newServers()
	// Every answer names the cluster (api.ClusterIdentity).
	uid, err := clusterUID(ctx, d.cli, d.cfg.KeyRoot)
	if err != nil {
		return nil, err
	}
	d.identity.Set(uid)
	if err := d.registerCoordination(ctx, p); err != nil {
		return nil, err
	}
	if err := d.registerConfigAndCluster(ctx, p); err != nil {
		return nil, err
	}
	if err := d.newHTTP(ctx, p); err != nil {
		return nil, err
	}
	d.serve(p)
	d.serving.Store(true)
	d.updateHealth()
	d.logReady()
	return d, nil
}

// embedded reports whether the daemon runs its own etcd member.
func (d *Daemon) embedded() bool { return len(d.cfg.EtcdEndpoints) == 0 }

// parts are what Start's steps build for the later ones; they live only
// until the daemon serves.
type parts struct {
	registry   *prometheus.Registry    // coordd's own metrics
	rpcMetrics *grpcprom.ServerMetrics // the gRPC servers' own
	apiMetrics *api.Metrics            // the adapters'
	// streams and subscriptions bound each principal's open streams and
	// config watches on this member.
	streams, subscriptions *api.PerPrincipal
	// unary is the interceptor chain of unary calls (and of each call on
	// a Calls stream) for callers authenticated by an.
	unary    func(an api.Authn) []grpc.UnaryServerInterceptor
	servers  []*grpc.Server // the public one, then the gateway's
	sessions *session.Manager
	holdings *grantwatch.Watcher
	history  *history.Recorder // nil with --no-history
	trends   *trends.Tracker
	cluster  *cluster.Manager
}

// claim takes the data dir (embedded etcd) and the gRPC and HTTP ports.
// A data dir in use or a taken port fails here and leaves etcd's data
// untouched (the data dir and its lock file may have been created). Until
// the listeners are served, connections to them are closed at once.
func (d *Daemon) claim() (err error) {
	if d.embedded() {
		if d.dirLock, err = lockDataDir(d.cfg.DataDir); err != nil {
			return err
		}
		d.stops.onStop("the data dir's lock", done(d.dirLock.unlock))
	}
	if d.grpcLis, err = net.Listen("tcp", d.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("gRPC listener (--grpc-addr): %w", err)
	}
	// Served, a listener is closed by its server; these closes then only
	// repeat that (the error says so, and is dropped).
	d.stops.onStop("the gRPC listener", done(func() { _ = d.grpcLis.Close() }))
	if d.httpLis, err = net.Listen("tcp", d.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("HTTP listener (--http-addr): %w", err)
	}
	d.stops.onStop("the HTTP listener", done(func() { _ = d.httpLis.Close() }))
	d.refusers = []*refuser{refuse(d.grpcLis), refuse(d.httpLis)}
	d.stops.onStop("refusing connections", done(d.stopRefusing))
	return nil
}

// followLeader sets up the watch of the embedded member's leadership:
// calls end once the member cannot commit (see leaderWatch), and the
// health status follows whether it can, is a learner, and leads.
func (d *Daemon) followLeader() {
	d.leader = newLeaderWatch(d.etcd, time.Duration(d.cfg.ElectionMs)*time.Millisecond)
	d.commits.Store(true)
	d.leader.onServing = func(can bool) {
		d.commits.Store(can)
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
}

// newServers builds the two gRPC servers every service is registered on:
// the public one on --grpc-addr, and an in-memory one that only the REST
// gateway reaches, which trusts the identity the gateway authenticated
// from the HTTP request. Both run the same interceptors.
func (d *Daemon) newServers() *parts {
	cfg := d.cfg
	// coordd's own metrics, on this daemon's registry (several daemons
	// may share a test process); etcd's and Go's are on the default one.
	p := &parts{registry: prometheus.NewRegistry()}
	d.registry = p.registry
	p.rpcMetrics = grpcMetrics(p.registry)
	p.apiMetrics = api.NewMetrics(p.registry)
	d.owners = &api.Owners{} // its managers are set by registerCoordination, before serving
	// Concurrent lock and election mutations share etcd transactions.
	d.txns = groupcommit.Direct(d.cli)
	if !cfg.NoGroupCommit {
		d.txns = groupcommit.New(d.cli)
	}
	d.stops.onStop("group commit", done(d.txns.Close))
	var limits *auth.Limits
	if cfg.RateLimit > 0 || cfg.PublishRate > 0 {
		limits = &auth.Limits{
			PerPrincipal: rate.Limit(cfg.RateLimit), PrincipalBurst: cfg.RateBurst,
			PublishPerSpace: rate.Limit(cfg.PublishRate), PublishSpaceBurst: cfg.PublishBurst,
		}
	}
	authOf := func(an api.Authn) api.Auth {
		return api.Auth{Authn: an, Authz: d.authz, Owners: d.owners, Limits: limits, Metrics: p.apiMetrics, Audit: d.audit, AuditFailed: func(err error) {
			d.lg.Error("audit log not written", zap.Error(err))
		}}
	}
	p.streams = &api.PerPrincipal{Max: max(cfg.MaxStreamsPerPrincipal, 0), What: "streams", Flag: "--max-streams-per-principal", Refused: p.apiMetrics.QuotaRefused("streams")}
	p.subscriptions = &api.PerPrincipal{Max: max(cfg.MaxSubscriptionsPerPrincipal, 0), What: "config subscriptions", Flag: "--max-subscriptions-per-principal",
		Refused: p.apiMetrics.QuotaRefused("subscriptions")}
	p.unary = func(an api.Authn) []grpc.UnaryServerInterceptor {
		return []grpc.UnaryServerInterceptor{d.identity.Unary(), api.UnaryArrival(d.txns.Arrived), api.Deferring(p.rpcMetrics.UnaryServerInterceptor()), api.UnaryErrors(d.lg), api.UnaryAuth(authOf(an)), api.UnaryRequireLeader(d.leader.Lost)}
	}
	serverOpts := func(an api.Authn) []grpc.ServerOption {
		return append([]grpc.ServerOption{
			grpc.ChainUnaryInterceptor(p.unary(an)...),
			grpc.ChainStreamInterceptor(d.identity.Stream(), p.rpcMetrics.StreamServerInterceptor(), api.StreamErrors(d.lg), api.StreamAuth(authOf(an)), api.StreamQuota(p.streams), api.StreamRequireLeader(d.leader.Lost)),
			grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		}, serverTuning()...)
	}
	publicOpts := serverOpts(d.authn)
	if cfg.TLS != nil {
		publicOpts = append(publicOpts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	d.grpcSrv = grpc.NewServer(publicOpts...)
	d.gwSrv = grpc.NewServer(serverOpts(&api.Authenticator{Forwarded: true})...)
	p.servers = []*grpc.Server{d.grpcSrv, d.gwSrv}
	// A new server already runs its stream workers: a start that fails
	// before serving stops them here (after serving, the graceful stop
	// registered by serve has, and these are no-ops).
	d.stops.onStop("the gRPC servers' workers", done(func() {
		d.grpcSrv.Stop()
		d.gwSrv.Stop()
	}))
	return p
}

// serverTuning is how both gRPC servers handle connections and streams.
func serverTuning() []grpc.ServerOption {
	return []grpc.ServerOption{
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

// newRecorder makes this member's grant history recorder (run later with the
// daemon's other parts) and registers its metrics.
func (d *Daemon) newRecorder(cfg Config, p *parts) {
	opts := cfg.History
	opts.Member = cfg.Name
	if d.etcd != nil { // the embedded member: read its events in place
		opts.Local = d.etcd.Server.KV()
	}
	p.history = history.NewRecorder(d.cli, cfg.KeyRoot, opts, d.lg.Named("history"))
	p.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordd_history_recording",
		Help: "1 while this member records the grant history (one member at a time), else 0.",
	}, func() float64 { return b2f(p.history.Recording()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "coordd_history_events_recorded_total",
		Help: "Grant history events this member has written.",
	}, func() float64 { n, _ := p.history.Recorded(); return float64(n) }))
}

// newSessions builds the session manager, on coordd's session clock
// (d.clock), not etcd's lessor.
func (d *Daemon) newSessions(p *parts) *session.Manager {
	cfg := d.cfg
	sessions := session.NewManager(d.cli, cfg.KeyRoot)
	sessions.LimitPerPrincipal(max(cfg.MaxSessionsPerPrincipal, 0))
	var renew session.Renewer
	member := randomMemberName()
	if d.etcd != nil {
		renew = renewer(d.etcd.Server)
		sessions.RenewWith(renew)
		member = fmt.Sprintf("%x", uint64(d.etcd.Server.MemberID()))
	}
	d.clock = session.NewClock(d.cli, cfg.KeyRoot, member, renew, d.lg.Named("sessions"))
	ended := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordd_sessions_ended_total",
		Help: "Sessions this member ended because no member saw them renewed within their TTL (coordd's session clock).",
	})
	p.registry.MustRegister(ended)
	d.clock.Ended = func(n int) { ended.Add(float64(n)) }
	sessions.UseClock(d.clock)
	return sessions
}

// registerCoordination builds sessions (kept on coordd's session clock),
// locks and elections, and registers their services on both servers.
func (d *Daemon) registerCoordination(ctx context.Context, p *parts) error {
	cfg := d.cfg
	sessions := d.newSessions(p)
	// One etcd watch per prefix tells every keep-alive stream of this
	// member when a lock grant or leadership it watches ends, and every
	// waiter when an entry ahead of it goes.
	p.holdings = grantwatch.New(d.cli, cfg.KeyRoot+"lock/", cfg.KeyRoot+"election/")
	d.locks = lock.NewManager(d.cli, cfg.KeyRoot, p.holdings, d.txns)
	d.elections = election.NewManager(d.cli, cfg.KeyRoot, p.holdings, d.txns)
	d.stops.onStop("locks and elections", done(func() {
		d.locks.Close()
		d.elections.Close()
	}))
	d.owners.Sessions, d.owners.Locks, d.owners.Elections = sessions, d.locks, d.elections
	p.sessions = sessions
	streams := api.NewKeepAliveStreams() // grants followed on their holders' keep-alive streams
	p.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordd_keepalive_streams",
		Help: "Shared keep-alive streams open on this member: one per SDK client with sessions here (clients prefer the member that leads etcd).",
	}, func() float64 { return float64(streams.Len()) }))
	pageKey, err := pageTokenKey(ctx, d.cli, cfg.KeyRoot)
	if err != nil {
		return err
	}
	return d.registerCoordinationServices(p, streams, pageKey)
}

// registerCoordinationServices builds the barrier manager, then the
// session, lock, election, barrier and history services on what
// registerCoordination built, and registers them on both servers. streams
// are the shared keep-alive streams; pageKey seals page tokens.
func (d *Daemon) registerCoordinationServices(p *parts, streams *api.KeepAliveStreams, pageKey []byte) error {
	cfg := d.cfg
	waiters := &api.Waiters{Max: max(cfg.MaxWaitersPerPrincipal, 0)}
	lockSvc, err := api.NewLockServer(api.LockOptions{
		Stopped: d.stopped, Locks: d.locks, Elections: d.elections, Sessions: p.sessions, Metrics: p.apiMetrics,
		Streams: streams, TokensVisible: d.lockTokensVisible, Waiters: waiters, PageTokenKey: pageKey,
		NoRevocation: cfg.UnsafeNoRevocation,
	})
	if err != nil {
		return err
	}
	electionSvc := api.NewElectionServer(api.ElectionOptions{
		Stopped: d.stopped, Elections: d.elections, Sessions: p.sessions, Metrics: p.apiMetrics,
		Waiters: waiters, Streams: streams, NoRevocation: cfg.UnsafeNoRevocation,
	})
	d.barriers = barrier.NewManager(d.cli, cfg.KeyRoot)
	d.stops.onStop("barriers", done(d.barriers.Close))
	barrierSvc := api.NewBarrierServer(api.BarrierOptions{Barriers: d.barriers, Waiters: waiters})
	sessionSvc, err := api.NewSessionServer(api.SessionOptions{
		Sessions: p.sessions, Holdings: api.Holdings{Watcher: p.holdings, Locks: d.locks, Elections: d.elections},
		Stopping: d.stopped.Done(), Metrics: p.apiMetrics, Streams: streams, MaxRequestBytes: cfg.MaxRequestBytes,
		PageTokenKey: pageKey, SeesAll: d.seesAllSessions, NoRevocation: cfg.UnsafeNoRevocation,
		// The SDK's calls with its sessions, pipelined on one stream per
		// client; each runs as the public server's unary RPC of its name.
		CallStream: api.NewCallServer(api.CallOptions{
			Locks: lockSvc, Elections: electionSvc, Barriers: barrierSvc, Interceptors: p.unary(d.authn),
			Metrics: p.apiMetrics, Stopping: d.stopped.Done(), Disabled: cfg.NoCallStream,
		}),
	})
	if err != nil {
		return err
	}
	if !cfg.NoHistory {
		d.newRecorder(cfg, p)
	}
	historySvc := api.NewHistoryServer(api.HistoryOptions{Store: history.NewStore(d.cli, cfg.KeyRoot), TokensVisible: d.lockTokensVisible})
	for _, srv := range p.servers {
		coorddv1.RegisterSessionServiceServer(srv, sessionSvc)
		coorddv1.RegisterLockServiceServer(srv, lockSvc)
		coorddv1.RegisterElectionServiceServer(srv, electionSvc)
		coorddv1.RegisterBarrierServiceServer(srv, barrierSvc)
		coorddv1.RegisterHistoryServiceServer(srv, historySvc)
	}
	return nil
}

// registerTrends builds the figures the console charts, from the member's
// watch of locks and elections and its config cache, and serves them.
func (d *Daemon) registerTrends(p *parts) {
	p.trends = trends.New(trends.Sources{
		Watch: p.holdings, Cli: d.cli, Root: d.cfg.KeyRoot, Sessions: p.sessions.Count,
		Namespaces: d.configCache.EachNamespace, Lg: d.lg.Named("trends"),
	}, d.cfg.Trends)
	trendSvc := api.NewTrendServer(p.trends)
	for _, srv := range p.servers {
		coorddv1.RegisterTrendServiceServer(srv, trendSvc)
	}
}

// registerConfigAndCluster builds the config center, the cluster's
// management and the fenced KV, registers their services and the health
// service, and the collector of the cluster-wide state metrics.
func (d *Daemon) registerConfigAndCluster(ctx context.Context, p *parts) error {
	cfg := d.cfg
	configStore := configcenter.NewStore(d.cli, cfg.KeyRoot, cfg.ConfigLimits)
	d.configStore = configStore
	if cfg.SecretKeyFile != "" {
		ring, err := keyring.Load(cfg.SecretKeyFile)
		if err != nil {
			return fmt.Errorf("--secret-key-file: %w", err)
		}
		configStore.SetKeys(ring)
		d.lg.Info("secret config values: keys loaded", zap.Strings("key_ids", ring.IDs()), zap.String("primary", ring.Primary()))
	}
	if d.embedded() {
		// After a restore (see Restore), before serving anyone and before
		// the config cache loads.
		if err := endRestoredSessions(ctx, cfg.DataDir, d.cli, d.lg, configStore.MarkRestored); err != nil {
			return err
		}
	}
	cacheOpts := cfg.ConfigCache
	if d.etcd != nil { // the embedded member: watch its store in place
		cacheOpts.Local = d.etcd.Server.KV()
	}
	d.configCache = configcenter.NewCache(configStore, cacheOpts)
	configSvc := api.NewConfigServer(api.ConfigOptions{
		Stopped: d.stopped, Store: configStore, Cache: d.configCache, Metrics: p.apiMetrics,
		MayReadSecrets: d.mayReadSecrets, MayRead: d.mayReadConfig, Subscriptions: p.subscriptions,
	})
	// A shared namespace's later releases reach an heir only while the
	// principal who made it inherit may still read the shared namespace.
	configStore.SetInheritCheck(func(setter configcenter.Setter, shared string) bool {
		ok, _ := d.authz.Allows(auth.Principal{Name: setter.Name, Groups: setter.Groups}, auth.ConfigRead, auth.Resource{Kind: auth.Namespace, Name: shared})
		return d.authz.Open() || ok
	})
	statusEndpoint, local := cfg.EtcdClientURL, cluster.Local{}
	if d.etcd != nil {
		local = cluster.Local{MemberID: uint64(d.etcd.Server.MemberID()), Quota: cfg.QuotaBackendBytes, Defragment: d.etcd.Server.Defragment, Measure: d.measure}
	} else {
		statusEndpoint = d.cli.Endpoints()[0]
	}
	p.cluster = cluster.NewManager(d.cli, cluster.Options{
		Endpoint: statusEndpoint, Local: local, KeyRoot: cfg.KeyRoot, Version: cfg.Version, HealthInterval: cfg.HealthInterval,
	})
	clusterSvc := api.NewClusterServer(api.ClusterOptions{Cluster: p.cluster, Version: cfg.Version, Groups: d.authz.Groups})
	kvSvc := api.NewKVServer(d.stopped, kv.NewStore(d.cli, cfg.KeyRoot))
	for _, srv := range p.servers {
		coorddv1.RegisterKVServiceServer(srv, kvSvc)
		coorddv1.RegisterConfigServiceServer(srv, configSvc)
		coorddv1.RegisterClusterServiceServer(srv, clusterSvc)
	}
	state := stateSources{
		sessions: p.sessions, locks: d.locks, elections: d.elections, cache: d.configCache, cluster: p.cluster,
		alarms: d.currentAlarms, lg: d.lg.Named("metrics"), commits: d.txns,
	}
	if d.etcd != nil {
		state.quota = cfg.QuotaBackendBytes
		state.learner = func() bool { return isLearner(d.etcd) }
		state.canCommit = d.commits.Load
		if cfg.SlowDiskThreshold > 0 {
			d.disk = &diskWatch{
				etcd: d.etcd, gather: etcdDiskGatherer(), threshold: cfg.SlowDiskThreshold, window: cfg.SlowDiskWindow,
				lg: d.lg.Named("disk"), handedOver: prometheus.NewCounter(prometheus.CounterOpts{
					Name: "coordd_etcd_slow_disk_handovers_total",
					Help: "Times this member handed etcd's leadership over because its disk was slow (--slow-disk-threshold).",
				}),
			}
			d.disk.order = p.cluster.HandOverOrder
			p.registry.MustRegister(d.disk.handedOver)
			state.diskSlow = d.disk.slow.Load
		}
	}
	p.registry.MustRegister(newStateCollector(state))
	d.registerTrends(p)
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	// Server reflection, for grpcurl and other generic tools (under a
	// policy, to principals with cluster.read, as /openapi.json).
	reflection.Register(d.grpcSrv)
	p.rpcMetrics.InitializeMetrics(d.grpcSrv)
	return nil
}

// newHTTP builds the HTTP side: the REST gateway (which reaches the
// internal gRPC server in memory, so every interceptor applies to REST as
// to gRPC), /metrics, the health endpoints and the console.
func (d *Daemon) newHTTP(ctx context.Context, p *parts) (err error) {
	cfg := d.cfg
	d.gwLis = bufconn.Listen(1 << 20)
	d.gwConn, err = grpc.NewClient("passthrough:///coordd-gateway",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return d.gwLis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("gateway connection: %w", err)
	}
	d.stops.onStop("the gateway's connection", func(context.Context) error { return d.gwConn.Close() })
	var ui http.Handler
	if !cfg.NoConsole {
		ui = console.Handler()
	}
	handler, err := gateway.New(context.WithoutCancel(ctx), gateway.Options{
		Conn:            d.gwConn,
		MaxRequestBytes: int64(cfg.MaxRequestBytes),
		BodyTimeout:     cfg.HTTPBodyTimeout,
		Ready:           d.Ready,
		Gatherer:        prometheus.Gatherers{prometheus.DefaultGatherer, p.registry},
		Pprof:           cfg.Pprof,
		Forward:         d.authn.ForwardedMetadata,
		Forged:          api.IsForwardedHeader,
		Guard:           d.guardHTTP,
		ReadyNote:       d.authNote,
		Console:         ui,
		Browsers:        gateway.BrowserPolicy{AllowedOrigins: cfg.HTTPAllowedOrigins, AllowedHosts: cfg.HTTPAllowedHosts},
	})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	d.httpSrv = &http.Server{
		Handler:           grpcOnHTTP(handler, d.grpcLis.Addr().String()),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         cfg.TLS,
		ErrorLog:          zap.NewStdLog(d.lg.Named("http")),
	}
	return nil
}

// spawn runs f on a goroutine that Stop waits for (d.wg).
func (d *Daemon) spawn(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// serve starts the background work (each on a goroutine Stop waits for,
// under a context Stop cancels) and the servers.
func (d *Daemon) serve(p *parts) {
	cfg := d.cfg
	d.stopRefusing()
	// Stopped in this order (the reverse of the registrations): stop
	// accepting, the HTTP server, the gRPC servers, then the background
	// work and every goroutine spawned here.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	d.stops.onStop("background work", done(func() {
		stopBackground()
		d.wg.Wait()
	}))
	d.stops.onStop("the gRPC servers", func(ctx context.Context) error {
		d.stopServers(ctx)
		return nil
	})
	d.stops.onStop("the HTTP server", func(ctx context.Context) error {
		if err := d.httpSrv.Shutdown(ctx); err != nil {
			// Timed out, as the gRPC side may: close what is left. Its
			// error (of listeners Shutdown already closed) adds nothing.
			_ = d.httpSrv.Close()
		}
		return nil
	})
	d.stops.onStop("accepting calls", done(func() {
		d.markStopped() // streams end, waits give up
		d.health.Shutdown()
	}))
	d.spawn(func() { d.leader.run(d.stopped.Done()) })
	d.spawn(func() { d.watchAlarms(bgCtx) })
	if d.disk != nil {
		d.spawn(func() { d.disk.run(bgCtx) })
	}
	if d.embedded() {
		d.spawn(func() { p.cluster.RunHealthReports(bgCtx, cfg.HealthInterval, cfg.Version, d.lg.Named("health")) })
		if cfg.AutoDefrag.On() {
			d.spawn(func() { p.cluster.RunAutoDefrag(bgCtx, cfg.AutoDefrag, d.lg.Named("defrag")) })
		}
	} else if !cfg.Compaction.Off() {
		// An embedded member compacts itself (on the etcd leader).
		d.spawn(func() {
			if err := cluster.RunCompactor(bgCtx, d.cli, cfg.Compaction, d.lg.Named("compactor")); err != nil {
				d.lg.Error("etcd compaction is off", zap.Error(err)) // validated at start: cannot happen
			}
		})
	}
	d.spawn(func() { d.configCache.Run(bgCtx) })
	d.spawn(func() { catchUpHeirs(bgCtx, d.configCache, d.configStore, d.lg.Named("config")) })
	d.spawn(func() { d.clock.Run(bgCtx) })
	d.spawn(func() { p.holdings.Run(bgCtx) })
	d.spawn(func() { p.trends.Run(bgCtx) })
	if p.history != nil {
		d.spawn(func() { p.history.Run(bgCtx) })
	}
	if cfg.Reload != nil {
		d.spawn(func() { d.reloadOnSignal(bgCtx, cfg.Reload) })
	}
	d.spawn(func() {
		if err := d.grpcSrv.Serve(hintFor(d.grpcLis, d.httpLis.Addr().String())); err != nil {
			d.serveErr <- fmt.Errorf("gRPC server: %w", err)
		}
	})
	d.spawn(func() {
		if err := d.gwSrv.Serve(d.gwLis); err != nil {
			d.serveErr <- fmt.Errorf("gateway's gRPC server: %w", err)
		}
	})
	d.spawn(func() {
		var err error
		if cfg.TLS != nil {
			err = d.httpSrv.ServeTLS(d.httpLis, "", "")
		} else {
			err = d.httpSrv.Serve(httpPortListener{Listener: d.httpLis, grpcAddr: d.grpcLis.Addr().String()})
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.serveErr <- fmt.Errorf("HTTP server: %w", err)
		}
	})
	if d.embedded() {
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
}

// reloadOnSignal reloads the TLS certificates, the token file, the policy
// and the secret key file each time reload fires, until ctx ends.
func (d *Daemon) reloadOnSignal(ctx context.Context, reload <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
			if err := d.Reload(); err != nil {
				d.lg.Error("reload refused; what was in force stays", zap.Error(err))
			} else {
				d.lg.Info("reloaded the TLS certificates, the token file, the policy and the secret key file")
			}
		}
	}
}

// heirCatchUpEvery is how often a member looks for heirs of shared config
// namespaces that do not carry their shared namespace's last release (the
// member that made it stopped before carrying it): a look at its own
// cache, no etcd read unless one is behind.
const heirCatchUpEvery = 2 * time.Second

// catchUpHeirs carries shared releases to the heirs the cache finds
// behind, until ctx ends. Every member runs it; a catch-up is idempotent.
func catchUpHeirs(ctx context.Context, cache *configcenter.Cache, store *configcenter.Store, lg *zap.Logger) {
	t := time.NewTicker(heirCatchUpEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, heir := range cache.BehindHeirs() {
			if _, err := store.CatchUp(ctx, heir); err != nil && ctx.Err() == nil {
				lg.Warn("could not carry a shared namespace's release to its heir; trying again", zap.String("heir", heir), zap.Error(err))
			}
		}
	}
}
