// Command coordd is the coordd daemon: locks with fencing tokens, leader
// elections and a config center over an embedded (or external) etcd.
//
// Every flag can also be set through an environment variable: --grpc-addr
// is COORDD_GRPC_ADDR, and so on. A flag given on the command line wins.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/history"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/server/tlsfiles"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		// Printed once, here: the command neither logs it nor lets cobra
		// print it.
		fmt.Fprintf(os.Stderr, "coordd: %v\n", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a bad command line: exit code 2, with a pointer to --help.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() + " (see coordd --help)" }
func (e usageError) Unwrap() error { return e.err }

// version is set at build time (-ldflags "-X main.version=v1.2.3"); else
// the module version the binary was built from, or "dev".
var version = ""

func coorddVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// settings are what coordd's flags set: the daemon's config, and the
// flags that become part of it when coordd starts.
type settings struct {
	cfg                        daemon.Config
	logFormat, logLevel        string
	tlsCert, tlsKey, clientCA  string
	etcdCA, etcdCert, etcdKey  string
	heartbeat, electionTimeout time.Duration
}

func newCommand() *cobra.Command {
	s := &settings{}
	cmd := &cobra.Command{
		Use:   "coordd",
		Short: "coordd serves fenced locks, leader elections and a config center over etcd",
		Long: `coordd serves fenced locks, leader elections and a config center over gRPC and REST.

By default it embeds a single-node etcd that keeps its data in --data-dir.
Give --name, --initial-cluster and peer URLs to run three or five members,
or --etcd-endpoints to use an existing etcd cluster instead.

Every flag can be set through an environment variable: --grpc-addr is
COORDD_GRPC_ADDR, and so on. A flag on the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       coorddVersion(),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unexpected argument %q: coordd takes flags only", args[0])}
			}
			return nil
		},
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(_ *cobra.Command, _ []string) error {
			return s.serve()
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.CompletionOptions.DisableDefaultCmd = true
	addSubcommands(cmd)
	f := cmd.Flags()
	s.addServerFlags(f)
	s.addMemberFlags(f)
	s.addEtcdFlags(f)
	s.addComparisonFlags(f)
	s.addStoreFlags(f)
	s.addProcessFlags(f)
	return cmd
}

// addSubcommands adds restore and keygen to cmd, their flag errors usage
// errors too.
func addSubcommands(cmd *cobra.Command) {
	restore := restoreCommand()
	restore.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.AddCommand(restore)
	keygen := keygenCommand()
	keygen.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.AddCommand(keygen)
}

// addServerFlags adds the flags of the data dir, the listeners, TLS,
// authentication, the audit log and the limits.
func (s *settings) addServerFlags(f *pflag.FlagSet) {
	f.StringVar(&s.cfg.DataDir, "data-dir", daemon.DefaultDataDir, "directory of the embedded etcd's data (kept across restarts)")
	f.StringVar(&s.cfg.GRPCAddr, "grpc-addr", daemon.DefaultGRPCAddr, "gRPC listen address")
	f.StringVar(&s.cfg.HTTPAddr, "http-addr", daemon.DefaultHTTPAddr, "HTTP listen address: REST API, /healthz, /readyz, /metrics, /openapi.json")
	f.StringVar(&s.tlsCert, "tls-cert-file", "", "serve gRPC and HTTP over TLS with this certificate (PEM)")
	f.StringVar(&s.tlsKey, "tls-key-file", "", "private key of --tls-cert-file (PEM)")
	f.StringVar(&s.clientCA, "client-ca-file", "", "require and verify client certificates signed by a CA in this bundle (PEM), on gRPC and HTTPS (mutual TLS)")
	f.StringVar(&s.cfg.IdentityFrom, "identity-from", "cn", `where a client certificate names its principal: "cn" (common name) or "uri" (first URI SAN, e.g. spiffe://...)`)
	f.StringVar(&s.cfg.TokenFile, "token-file", "", "bearer tokens (their SHA-256 hashes) and the principals they name (YAML; see docs/security.md); reloaded on SIGHUP")
	f.StringVar(&s.cfg.SecretKeyFile, "secret-key-file", "", "key-encryption keys of secret config values, one \"<id> <base64>\" per line, the first primary (make one with coordd keygen; mode 600; the same file on every member); reloaded on SIGHUP")
	f.StringVar(&s.cfg.PolicyFile, "policy-file", "", "authorization policy (YAML): who may do what on which locks, elections, namespaces and keys; deny by default; without one coordd runs open; reloaded on SIGHUP")
	f.StringVar(&s.cfg.AuditLog, "audit-log", "", `write every call that changes something, and every refused call, as a JSON line to this file (rotated) or "-" (stderr)`)
	f.IntVar(&s.cfg.AuditMaxMB, "audit-log-max-mb", 100, "rotate the audit log at this size")
	f.IntVar(&s.cfg.AuditKeep, "audit-log-keep", 10, "rotated audit logs to keep")
	f.IntVar(&s.cfg.MaxSessionsPerPrincipal, "max-sessions-per-principal", daemon.DefaultMaxSessionsPerPrincipal, "live sessions each authenticated principal may hold in the cluster (negative: no limit)")
	f.IntVar(&s.cfg.MaxWaitersPerPrincipal, "max-waiters-per-principal", daemon.DefaultMaxWaitersPerPrincipal, "lock acquisitions and campaigns each authenticated principal may have in progress on this member (negative: no limit)")
	f.IntVar(&s.cfg.MaxStreamsPerPrincipal, "max-streams-per-principal", daemon.DefaultMaxStreamsPerPrincipal, "streams (watches, observes, keep-alive and call streams) each authenticated principal may have open on this member (negative: no limit)")
	f.IntVar(&s.cfg.MaxSubscriptionsPerPrincipal, "max-subscriptions-per-principal", daemon.DefaultMaxSubscriptionsPerPrincipal, "config watches each authenticated principal may have open on this member (negative: no limit)")
	f.Float64Var(&s.cfg.RateLimit, "rate-limit", 0, "calls that change something each authenticated principal may make per second (0: no limit)")
	f.IntVar(&s.cfg.RateBurst, "rate-limit-burst", 0, "calls a principal may make at once above --rate-limit (default twice the rate)")
	f.Float64Var(&s.cfg.PublishRate, "publish-rate", 0, "config releases per second each namespace may get, whoever publishes: the release-storm guard (0: no limit)")
	f.IntVar(&s.cfg.PublishBurst, "publish-burst", 0, "releases a namespace may get at once above --publish-rate (default twice the rate)")
	f.BoolVar(&s.cfg.PublicMetrics, "public-metrics", false, "serve /metrics and /openapi.json to anyone, also under a policy (else they need cluster.read)")
}

// addMemberFlags adds the flags of the embedded etcd member (cluster,
// peers, raft timing, WAL and disk), and the REST API's body timeout and
// allowed origins and hosts.
func (s *settings) addMemberFlags(f *pflag.FlagSet) {
	f.StringVar(&s.cfg.Name, "name", daemon.DefaultName, "this etcd member's name, unique in the cluster")
	f.StringVar(&s.cfg.InitialCluster, "initial-cluster", "", `all members as name=peer-url,... (default "<name>=<first advertise peer URL>")`)
	f.StringVar(&s.cfg.InitialClusterState, "initial-cluster-state", "new", `"new" to form a cluster, "existing" to join one`)
	f.StringVar(&s.cfg.InitialClusterToken, "initial-cluster-token", daemon.DefaultClusterToken, "token that keeps clusters on one network apart")
	f.StringSliceVar(&s.cfg.ListenPeerURLs, "listen-peer-urls", []string{daemon.DefaultPeerURL}, "URLs this member listens on for its peers")
	f.StringSliceVar(&s.cfg.AdvertisePeerURLs, "initial-advertise-peer-urls", nil, "URLs peers use to reach this member (default --listen-peer-urls)")
	f.StringVar(&s.cfg.PeerTLS.CertFile, "peer-cert-file", "", "encrypt and authenticate traffic between embedded members with this certificate (PEM; serverAuth and clientAuth usage, naming the host of this member's peer URLs, which must then be https); re-read for every new peer connection")
	f.StringVar(&s.cfg.PeerTLS.KeyFile, "peer-key-file", "", "private key of --peer-cert-file (PEM)")
	f.StringVar(&s.cfg.PeerTLS.CAFile, "peer-ca-file", "", "CA bundle (PEM) that every member's peer certificate must chain to; peers without one are refused")
	f.StringVar(&s.cfg.EtcdClientURL, "etcd-client-url", "", "the embedded etcd's own client listener, which bypasses every coordd check: a unix:// socket, or with no authentication configured a loopback URL (default unix://<data-dir>/run/etcd.sock, reachable only by this user)")
	f.DurationVar(&s.cfg.HTTPBodyTimeout, "http-body-timeout", 30*time.Second, "how long a REST client may take to send a request body; past it the connection is closed")
	f.StringSliceVar(&s.cfg.HTTPAllowedOrigins, "http-allowed-origins", nil, "origins (https://console.example.com, or *) whose pages may call the REST API from a browser, besides coordd's own")
	f.StringSliceVar(&s.cfg.HTTPAllowedHosts, "http-allowed-hosts", nil, "host names browsers may reach coordd by over plaintext HTTP, besides IP addresses and localhost (guards against DNS rebinding)")
	f.StringSliceVar(&s.cfg.PeerTLS.AllowedCNs, "peer-allowed-cn", nil, "admit on the peer port only certificates with one of these common names (needed when --peer-ca-file also signs other certificates, such as API clients')")
	f.DurationVar(&s.heartbeat, "etcd-heartbeat-interval", 100*time.Millisecond, "raft heartbeat interval")
	f.DurationVar(&s.electionTimeout, "etcd-election-timeout", time.Second, "raft election timeout")
	f.StringVar(&s.cfg.WALDir, "wal-dir", "", "directory of the embedded etcd's write-ahead log, on a disk of its own (default: inside --data-dir; the same on every start)")
	f.DurationVar(&s.cfg.SlowDiskThreshold, "slow-disk-threshold", daemon.DefaultSlowDiskThreshold, "a member whose WAL fsyncs or backend commits take longer than this on average for --slow-disk-window reports its disk slow and hands etcd's leadership over while it lasts (0: never)")
	f.DurationVar(&s.cfg.SlowDiskWindow, "slow-disk-window", daemon.DefaultSlowDiskWindow, "how long the disk must stay slow (see --slow-disk-threshold)")
	f.BoolVar(&s.cfg.EtcdLogWarning, "etcd-quiet", true, "log the embedded etcd at warning level and above only")
}

// addEtcdFlags adds the flags of an existing etcd cluster to use instead.
func (s *settings) addEtcdFlags(f *pflag.FlagSet) {
	f.StringSliceVar(&s.cfg.EtcdEndpoints, "etcd-endpoints", nil, "use this existing etcd cluster instead of embedding a member")
	f.StringVar(&s.etcdCA, "etcd-cacert", "", "CA bundle to verify --etcd-endpoints (PEM)")
	f.StringVar(&s.etcdCert, "etcd-cert", "", "client certificate for --etcd-endpoints (PEM)")
	f.StringVar(&s.etcdKey, "etcd-key", "", "private key of --etcd-cert (PEM)")
}

// addComparisonFlags adds the flags that turn off an optimization or a
// safeguard, for comparisons.
func (s *settings) addComparisonFlags(f *pflag.FlagSet) {
	f.BoolVar(&s.cfg.NoCallStream, "no-call-stream", false, "refuse the call stream (SessionService.Calls) that the Go SDK pipelines its lock and election calls on, so clients send each as its own unary RPC (for comparisons)")
	f.BoolVar(&s.cfg.UnsafeNoRevocation, "unsafe-no-revocation", false, "end grants and leaderships released, resigned or closed from outside at once, without asking the holder first (its context then ends after the next holder's grant): for comparisons only")
	_ = f.MarkHidden("unsafe-no-revocation")
	f.BoolVar(&s.cfg.NoGroupCommit, "no-group-commit", false, "commit every lock and election change as its own etcd transaction instead of batching concurrent ones into one (slower under load; for comparisons)")
}

// addStoreFlags adds the flags of what coordd keeps in etcd, for how long,
// and how large: quota, compaction, grant history, defragmentation, sizes.
func (s *settings) addStoreFlags(f *pflag.FlagSet) {
	f.Int64Var(&s.cfg.QuotaBackendBytes, "quota-backend-bytes", daemon.DefaultQuotaBackendBytes, "the embedded etcd database's size cap: past it etcd raises its NOSPACE alarm and refuses writes that add data (etcd suggests at most 8 GiB)")
	f.StringVar(&s.cfg.Compaction.Mode, "compaction-mode", "", `how much etcd history to keep: "periodic" (a time window), "revision" (a number of revisions) or "off" (default periodic with the embedded member, off over --etcd-endpoints)`)
	f.StringVar(&s.cfg.Compaction.Retention, "compaction-retention", "", `periodic: a duration (default 10s; compaction runs that often, down to the revision of that long ago); revision: a number of revisions to keep (compaction runs every 5m)`)

	f.DurationVar(&s.cfg.History.Retention, "history-retention", history.DefaultRetention, "how long the grant history keeps events (coordctl lock history)")
	f.IntVar(&s.cfg.History.MaxRecords, "history-max-records", history.DefaultMaxRecords, "the most events the grant history keeps; the oldest go first")
	f.IntVar(&s.cfg.History.Floor, "history-floor", history.DefaultFloor, "each lock's and election's newest events kept past --history-max-records, so that one tenant's flood cannot erase another's last grants (-1: none)")
	f.IntVar(&s.cfg.History.FloorNames, "history-floor-names", history.DefaultFloorNames, "the most names whose floor (--history-floor) one principal's events keep")
	f.BoolVar(&s.cfg.NoHistory, "no-history", false, "record no grant history")
	f.Float64Var(&s.cfg.AutoDefrag.FreeRatio, "auto-defrag-free-ratio", 0, "defragment the embedded member when this fraction of its database file is free (e.g. 0.5) and at least --auto-defrag-min-free bytes; members take turns; 0 is off")
	f.Int64Var(&s.cfg.AutoDefrag.MinFree, "auto-defrag-min-free", cluster.DefaultAutoDefragMinFree, "the least free space in the database file worth an automatic defragmentation")
	f.StringVar(&s.cfg.KeyRoot, "key-root", daemon.DefaultKeyRoot, "etcd key prefix of everything coordd stores")
	f.IntVar(&s.cfg.MaxRequestBytes, "max-request-bytes", daemon.DefaultMaxRequestBytes, "largest gRPC message or HTTP request body accepted")
	f.IntVar(&s.cfg.ConfigLimits.MaxValueBytes, "config-max-value-bytes", configcenter.DefaultMaxValueBytes, "largest config value accepted")
	f.IntVar(&s.cfg.ConfigLimits.HistoryReleases, "config-history-releases", configcenter.DefaultHistoryReleases, "releases kept per config namespace for history, diff and rollback")
}

// addProcessFlags adds the flags of profiling, the console, stopping and
// logging.
func (s *settings) addProcessFlags(f *pflag.FlagSet) {
	f.BoolVar(&s.cfg.Pprof, "enable-pprof", false, "serve Go's profiles under /debug/pprof/ on the HTTP listener")
	f.BoolVar(&s.cfg.NoConsole, "no-console", false, "do not serve the web console (/ui/ on the HTTP listener)")
	f.DurationVar(&s.cfg.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long a graceful stop waits for calls in flight")
	f.StringVar(&s.logFormat, "log-format", "console", `log format: "console" (human-readable) or "json"`)
	f.StringVar(&s.logLevel, "log-level", "info", "log level: debug, info, warn or error")
}

// serve completes the config from the flags and runs the daemon until
// SIGINT or SIGTERM.
func (s *settings) serve() error {
	lg, err := newLogger(s.logFormat, s.logLevel)
	if err != nil {
		return err
	}
	// The logger writes to stderr unbuffered, so Sync has nothing to
	// flush; it only fsyncs stderr, which fails (EINVAL) whenever
	// stderr is a terminal or a pipe.
	defer func() { _ = lg.Sync() }()
	if err := s.complete(lg); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go forceExitOnSecondSignal(ctx, lg)
	// SIGHUP reloads the TLS files, the token file, the policy and the
	// secret key file.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s.cfg.Reload = forwardReloads(ctx, hup)
	return daemon.Run(ctx, s.cfg)
}

// complete sets the config's fields that the flags give only indirectly:
// the logger, the version, raft timing and TLS.
func (s *settings) complete(lg *zap.Logger) error {
	var err error
	s.cfg.Logger = lg
	s.cfg.Version = coorddVersion()
	s.cfg.HeartbeatMs = uint(s.heartbeat / time.Millisecond)
	s.cfg.ElectionMs = uint(s.electionTimeout / time.Millisecond)
	switch {
	case s.tlsCert != "" || s.tlsKey != "":
		if s.cfg.TLSFiles, err = tlsfiles.Load(s.tlsCert, s.tlsKey, s.clientCA); err != nil {
			return err
		}
	case s.clientCA != "":
		return usageError{errors.New("--client-ca-file needs --tls-cert-file and --tls-key-file")}
	}
	if s.cfg.EtcdTLS, err = clientTLS(s.etcdCA, s.etcdCert, s.etcdKey); err != nil {
		return err
	}
	return nil
}

// forwardReloads returns a channel that receives once per signal on hup,
// until ctx ends.
func forwardReloads(ctx context.Context, hup <-chan os.Signal) <-chan struct{} {
	reload := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				select {
				case reload <- struct{}{}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return reload
}

// applyEnv sets every flag not given on the command line from its
// COORDD_* environment variable.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		env := "COORDD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok || f.Changed || err != nil {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q: %w", env, v, serr)
		}
	})
	return err
}

func newLogger(format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var cfg zap.Config
	switch format {
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
		cfg.DisableStacktrace = true
		cfg.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout("2006-01-02T15:04:05.000Z0700")
	case "json":
		cfg = zap.NewProductionConfig()
	default:
		return nil, fmt.Errorf("--log-format %q: want console or json", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build()
}

func forceExitOnSecondSignal(ctx context.Context, lg *zap.Logger) {
	<-ctx.Done()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	lg.Warn("second signal: exiting without a graceful stop")
	os.Exit(2)
}

func clientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--etcd-cacert %s holds no PEM certificate", caFile)
		}
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
