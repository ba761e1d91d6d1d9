package daemon

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/history"
	"github.com/coordd/coordd/internal/server/tlsfiles"
	"github.com/coordd/coordd/internal/server/trends"
)

// Config is everything the daemon needs. cmd/coordd fills it from flags and
// COORDD_* environment variables; tests fill it directly. Its zero value
// is the default: a switch is named for what setting it does (NoHistory,
// NoGroupCommit, NoConsole turn on-by-default parts off; Pprof and
// PublicMetrics turn off-by-default ones on; Unsafe* are for tests).
type Config struct {
	// DataDir holds the embedded etcd's data (in DataDir/etcd). Unused with
	// EtcdEndpoints.
	DataDir string

	// Embedded etcd member and cluster. For a single node only Name matters;
	// the rest defaults from it.
	Name                string   // member name, unique in the cluster
	InitialCluster      string   // "n1=http://10.0.0.1:7423,n2=..."; default "<Name>=<first advertise peer URL>"
	InitialClusterState string   // "new" or "existing"
	InitialClusterToken string   // keeps two clusters on one network apart
	ListenPeerURLs      []string // where this member listens for its peers
	AdvertisePeerURLs   []string // how peers reach it; default ListenPeerURLs
	// PeerTLS, when its files are set, encrypts and authenticates the
	// traffic between embedded members: every peer URL is https, and each
	// member accepts only peers presenting a certificate signed by
	// PeerTLS.CAFile.
	PeerTLS PeerTLS
	// EtcdClientURL is the embedded etcd's own client listener. It serves
	// etcd's raw KV and its unfenced lock and election APIs without any of
	// coordd's checks, so it must be a unix socket (default
	// unix://<DataDir>/run/etcd.sock: a 0700 directory, a 0600 socket,
	// reachable only by the daemon's own user) or, when no authentication
	// is configured, a loopback URL (reachable by every local user).
	EtcdClientURL string
	HeartbeatMs   uint // raft heartbeat interval
	ElectionMs    uint // raft election timeout
	UnsafeNoFsync bool // tests only: never set in production
	// WALDir, when set, holds the embedded etcd's write-ahead log instead
	// of DataDir/etcd/member/wal: a disk of its own, as etcd advises, since
	// every write waits for its fsync.
	WALDir string
	// SlowDiskThreshold and SlowDiskWindow: a member whose WAL fsync or
	// backend commit takes longer than the threshold on average for the
	// window reports its disk slow and hands etcd's leadership over while
	// it lasts (see diskWatch). A zero threshold switches it off.
	SlowDiskThreshold time.Duration
	SlowDiskWindow    time.Duration
	EtcdLogWarning    bool // log etcd at warn level instead of the daemon's level

	// EtcdEndpoints, when set, makes coordd a stateless API layer over an
	// existing etcd cluster instead of embedding a member.
	EtcdEndpoints []string
	EtcdTLS       *tls.Config // for EtcdEndpoints; nil for plain connections

	// QuotaBackendBytes caps the embedded member's database file; past it
	// etcd raises its NOSPACE alarm and refuses writes that add data
	// (DefaultQuotaBackendBytes when zero; etcd suggests at most 8 GiB).
	QuotaBackendBytes int64

	// NoGroupCommit commits every lock and election mutation as its own
	// etcd transaction instead of batching concurrent ones (see
	// internal/base/groupcommit): for comparisons, and a way out should
	// batching misbehave.
	NoGroupCommit bool
	// NoCallStream ends every SessionService.Calls stream with
	// UNIMPLEMENTED, so that clients send each call as its own unary RPC
	// (for comparisons, and to test the SDK's fallback).
	NoCallStream bool
	// UnsafeNoRevocation, for tests only, ends a grant or a leadership
	// taken from outside (a release or resignation that does not name the
	// holder's session) at once, without asking the holder first: the
	// behaviour before the revocation hand-shake, which a test uses to
	// show the overlaps the hand-shake prevents.
	UnsafeNoRevocation bool

	// Compaction of etcd's history (see cluster.Compaction for what it
	// keeps). The embedded member runs etcd's own compactor on the etcd
	// leader; zero means cluster.DefaultCompaction. Over EtcdEndpoints,
	// coordd compacts only when Compaction.Mode is set (the cluster may have
	// its own --auto-compaction flags or other users).
	Compaction cluster.Compaction
	// AutoDefrag defragments the embedded member when enough of its
	// database file is free (members take turns); zero is off.
	AutoDefrag cluster.AutoDefrag

	// Listeners.
	GRPCAddr string
	HTTPAddr string
	// TLS, when set, serves both listeners over TLS with this certificate.
	// TLSFiles, when set, replaces it: the certificate, key and client CA
	// bundle are read from files, and again on every Reload.
	TLS      *tls.Config
	TLSFiles *tlsfiles.Server
	// IdentityFrom says where a client certificate names its principal:
	// api.IdentityFromCN (default) or api.IdentityFromURI.
	IdentityFrom string
	// TokenFile maps bearer tokens (by their SHA-256) to principals; see
	// auth.ParseTokens. Read at start and on every Reload.
	TokenFile string
	// PolicyFile is the authorization policy (see auth.Policy); without
	// one coordd runs open: anyone who reaches its ports may do anything.
	// Read at start and on every Reload (a bad file is refused, the policy
	// in force stays).
	PolicyFile string
	// SecretKeyFile holds the key-encryption keys of secret config values
	// (see keyring.Parse; make one with `coordd keygen`). Without it,
	// secret values can be neither written nor read in clear on this
	// member. Read at start and on every Reload.
	SecretKeyFile string
	// AuditLog is where every call that changes something, and every call
	// refused, is written as one JSON line (auth.Record): a file (rotated
	// at AuditMaxMB, AuditKeep old files kept) or "-" for stderr; empty is
	// off.
	AuditLog   string
	AuditMaxMB int
	AuditKeep  int
	// RateLimit is how many calls that change something each principal
	// may make per second (RateBurst at once; default twice the rate);
	// PublishRate how many config releases each namespace may get per
	// second (PublishBurst at once). Zero is off (the default).
	RateLimit    float64
	RateBurst    int
	PublishRate  float64
	PublishBurst int
	// MaxSessionsPerPrincipal bounds each authenticated principal's live
	// sessions in the cluster; MaxWaitersPerPrincipal its lock
	// acquisitions and campaigns in progress on this member. Past them a
	// call is refused with QUOTA_EXCEEDED. Zero means the default
	// (DefaultMaxSessionsPerPrincipal, DefaultMaxWaitersPerPrincipal);
	// negative, no limit.
	MaxSessionsPerPrincipal int
	MaxWaitersPerPrincipal  int
	// MaxStreamsPerPrincipal bounds each authenticated principal's open
	// streams on this member (watches, observes, WatchMany, keep-alive and
	// call streams), MaxSubscriptionsPerPrincipal its config watches on
	// this member. Zero means the default, negative no limit.
	MaxStreamsPerPrincipal       int
	MaxSubscriptionsPerPrincipal int
	// HTTPAllowedOrigins are the origins ("https://console.example.com",
	// or "*") whose pages may call the REST API from a browser besides
	// coordd's own; HTTPAllowedHosts the host names a browser may reach
	// coordd by over plaintext HTTP besides IP addresses and localhost.
	// See gateway.BrowserPolicy.
	HTTPAllowedOrigins []string
	HTTPAllowedHosts   []string
	// HTTPBodyTimeout bounds how long a REST client may take to send a
	// request body (default 30 s); past it the connection is closed.
	HTTPBodyTimeout time.Duration
	// PublicMetrics serves /metrics and /openapi.json to anyone, also under
	// a policy (else they need cluster.read).
	PublicMetrics bool
	// Reload, when it receives, reloads TLSFiles, TokenFile, PolicyFile
	// and SecretKeyFile
	// (coordd sends SIGHUP here).
	Reload <-chan struct{}

	// KeyRoot is the etcd key prefix of everything coordd stores, so several
	// deployments can share one etcd cluster. It starts and ends with "/".
	KeyRoot string
	// MaxRequestBytes caps one gRPC message and one HTTP request body.
	MaxRequestBytes int
	// ConfigLimits bound config-center values and releases; ConfigCache
	// tunes the member's config watch cache. Zero fields mean defaults.
	ConfigLimits configcenter.Limits
	ConfigCache  configcenter.CacheOptions
	// History tunes the grant history (retention and size; Member is
	// set from Name). NoHistory turns it off: nothing is recorded, and
	// the history calls list what was recorded before.
	History   history.Options
	NoHistory bool
	// Trends tune the figures the member keeps for the console's charts
	// (TrendService): a sample every 10 s, half an hour of them.
	Trends trends.Options
	// Version is reported by the cluster status call.
	Version string
	// Pprof serves Go's profiles under /debug/pprof/ on the HTTP
	// listener.
	Pprof bool
	// NoConsole turns the web console (/ui/) off.
	NoConsole bool
	// ShutdownTimeout bounds the graceful part of a stop.
	ShutdownTimeout time.Duration
	// HealthInterval is how often the embedded member writes its health
	// report for the other members' cluster status (default
	// cluster.DefaultHealthInterval).
	HealthInterval time.Duration

	Logger *zap.Logger
}

// PeerTLS is the embedded member's certificate for its peers. A member is
// both a server and a client of its peers, so the certificate needs both
// key usages (serverAuth and clientAuth) and must name the host of its
// peer URLs. etcd reads the certificate and key again for every new peer
// connection, so replacing the files renews them without a restart; the
// CA bundle is read at start.
type PeerTLS struct {
	CertFile, KeyFile string
	CAFile            string
	// AllowedCNs, when set, admits only peers whose certificate's common
	// name is one of these: needed when PeerTLS.CAFile also signs other
	// certificates (API clients', say), which would otherwise be
	// accepted on the peer port.
	AllowedCNs []string
}

// On reports whether peer TLS is configured.
func (p PeerTLS) On() bool { return p.CertFile != "" || p.KeyFile != "" || p.CAFile != "" }

// Defaults for Config fields left zero.
const (
	DefaultGRPCAddr        = "127.0.0.1:7420"
	DefaultHTTPAddr        = "127.0.0.1:7421"
	DefaultPeerURL         = "http://127.0.0.1:7423"
	DefaultDataDir         = "coordd-data"
	DefaultName            = "coordd"
	DefaultKeyRoot         = "/coordd/"
	DefaultMaxRequestBytes = 1 << 20
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultSlowDiskThreshold and DefaultSlowDiskWindow: a leader whose
	// fsyncs take 100 ms on average for 1 s hands leadership over (etcd
	// warns at 1 s for one fsync; a healthy SSD takes under 10 ms).
	DefaultSlowDiskThreshold = 100 * time.Millisecond
	DefaultSlowDiskWindow    = time.Second
	DefaultClusterToken      = "coordd"
	// Per-principal quotas: generous, so that only a runaway or hostile
	// client meets them.
	DefaultMaxSessionsPerPrincipal = 10_000
	DefaultMaxWaitersPerPrincipal  = 10_000
	// An SDK client keeps two or three streams open; a stream costs the
	// member about 20 KiB, a subscription on a shared WatchMany stream
	// well under one.
	DefaultMaxStreamsPerPrincipal       = 10_000
	DefaultMaxSubscriptionsPerPrincipal = 100_000
	// DefaultQuotaBackendBytes is etcd's own default database quota, 2 GiB.
	DefaultQuotaBackendBytes = 2 << 30
)

// withDefaults returns cfg with zero fields filled in.
func (cfg Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.DataDir, DefaultDataDir)
	def(&cfg.Name, DefaultName)
	def(&cfg.InitialClusterState, "new")
	def(&cfg.InitialClusterToken, DefaultClusterToken)
	if cfg.EtcdClientURL == "" {
		cfg.EtcdClientURL = defaultEtcdClientURL(cfg.DataDir)
	}
	cfg = cfg.withDefaultQuotas()
	def(&cfg.GRPCAddr, DefaultGRPCAddr)
	def(&cfg.HTTPAddr, DefaultHTTPAddr)
	def(&cfg.KeyRoot, DefaultKeyRoot)
	if len(cfg.ListenPeerURLs) == 0 {
		cfg.ListenPeerURLs = []string{DefaultPeerURL}
	}
	if len(cfg.AdvertisePeerURLs) == 0 {
		cfg.AdvertisePeerURLs = cfg.ListenPeerURLs
	}
	def(&cfg.InitialCluster, cfg.Name+"="+cfg.AdvertisePeerURLs[0])
	if cfg.HeartbeatMs == 0 {
		cfg.HeartbeatMs = 100
	}
	if cfg.ElectionMs == 0 {
		cfg.ElectionMs = 1000
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.SlowDiskWindow == 0 {
		cfg.SlowDiskWindow = DefaultSlowDiskWindow
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if cfg.TLSFiles != nil {
		cfg.TLS = cfg.TLSFiles.Config()
	}
	if cfg.RateBurst <= 0 {
		cfg.RateBurst = max(1, int(2*cfg.RateLimit))
	}
	if cfg.PublishBurst <= 0 {
		cfg.PublishBurst = max(1, int(2*cfg.PublishRate))
	}
	if cfg.AuditMaxMB <= 0 {
		cfg.AuditMaxMB = 100
	}
	if cfg.AuditKeep <= 0 {
		cfg.AuditKeep = 10
	}
	if cfg.IdentityFrom == "" {
		cfg.IdentityFrom = "cn"
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = cluster.DefaultHealthInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	switch {
	case cfg.Compaction.Mode == "" && len(cfg.EtcdEndpoints) > 0:
		cfg.Compaction.Mode = cluster.CompactionOff
	case cfg.Compaction.Mode == "":
		cfg.Compaction.Mode = cluster.DefaultCompaction.Mode
		def(&cfg.Compaction.Retention, cluster.DefaultCompaction.Retention)
	case cfg.Compaction.Mode == cluster.DefaultCompaction.Mode:
		def(&cfg.Compaction.Retention, cluster.DefaultCompaction.Retention)
	}
	return cfg
}

// validate reports every problem at once, in the words of the flags.
// restoring relaxes what only a running member needs.
func (cfg Config) validate(restoring bool) error {
	errs := &multierror.Error{ErrorFormat: listErrors}
	add := func(format string, args ...any) { errs = multierror.Append(errs, fmt.Errorf(format, args...)) }

	if !strings.HasPrefix(cfg.KeyRoot, "/") || !strings.HasSuffix(cfg.KeyRoot, "/") {
		add("--key-root %q must start and end with /", cfg.KeyRoot)
	}
	if v := cfg.ConfigLimits.MaxValueBytes; v < 0 || v > cfg.MaxRequestBytes/2 {
		add("--config-max-value-bytes %d must be between 1 and half of --max-request-bytes (%d)", v, cfg.MaxRequestBytes/2)
	}
	if h := cfg.ConfigLimits.HistoryReleases; h < 0 || h > 100000 {
		add("--config-history-releases %d must be between 1 and 100000", h)
	}
	if cfg.MaxRequestBytes < 4096 || cfg.MaxRequestBytes > 8<<20 {
		add("--max-request-bytes %d must be between 4096 and 8388608", cfg.MaxRequestBytes)
	}
	for _, a := range []struct{ flag, addr string }{{"--grpc-addr", cfg.GRPCAddr}, {"--http-addr", cfg.HTTPAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			add("%s %q is not host:port: %v", a.flag, a.addr, err)
		}
	}
	if cfg.QuotaBackendBytes < 0 || cfg.QuotaBackendBytes > 64<<30 {
		add("--quota-backend-bytes %d must be between 1 and 68719476736 (64 GiB; etcd suggests at most 8 GiB)", cfg.QuotaBackendBytes)
	}
	if err := cfg.Compaction.Validate(); err != nil {
		add("%v", err)
	}
	if cfg.RateLimit < 0 || cfg.PublishRate < 0 {
		add("--rate-limit and --publish-rate must not be negative (0 is off)")
	}
	if cfg.IdentityFrom != "cn" && cfg.IdentityFrom != "uri" {
		add("--identity-from %q: want cn (the certificate's common name) or uri (its first URI SAN)", cfg.IdentityFrom)
	}
	if cfg.TLSFiles != nil && cfg.TLSFiles.ClientCAFile != "" && cfg.TLS == nil {
		add("--client-ca-file needs --tls-cert-file and --tls-key-file")
	}
	for _, o := range cfg.HTTPAllowedOrigins {
		if u, err := url.Parse(o); o != "*" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "") {
			add("--http-allowed-origins %q: want an origin such as https://console.example.com (scheme and host, optional port, no path), or *", o)
		}
	}
	if cfg.HTTPBodyTimeout < 0 {
		add("--http-body-timeout %s must not be negative", cfg.HTTPBodyTimeout)
	}
	for _, h := range cfg.HTTPAllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			add("--http-allowed-hosts %q: want a host name without port, such as coordd.internal", h)
		}
	}
	if cfg.History.Retention < 0 || (cfg.History.Retention > 0 && cfg.History.Retention < time.Minute) {
		add("--history-retention %s must be at least 1m", cfg.History.Retention)
	}
	if cfg.History.MaxRecords < 0 {
		add("--history-max-records %d must not be negative", cfg.History.MaxRecords)
	}
	if cfg.History.Floor < -1 || cfg.History.Floor > 1000 {
		add("--history-floor %d must be -1 (none) or at most 1000", cfg.History.Floor)
	}
	if cfg.History.FloorNames < 0 {
		add("--history-floor-names %d must not be negative", cfg.History.FloorNames)
	}
	if err := cfg.AutoDefrag.Validate(); err != nil {
		add("--auto-defrag-free-ratio: %v", err)
	}
	if len(cfg.EtcdEndpoints) == 0 {
		cfg.validateMember(restoring, add)
	}
	return errs.ErrorOrNil()
}

// validateMember checks the flags of the embedded etcd member (none apply
// with an external etcd), adding each problem found with add.
func (cfg Config) validateMember(restoring bool, add func(format string, args ...any)) {
	if cfg.InitialClusterState != "new" && cfg.InitialClusterState != "existing" {
		add("--initial-cluster-state %q must be new or existing", cfg.InitialClusterState)
	}
	if err := checkLoopbackURL(cfg.EtcdClientURL); err != nil {
		add("--etcd-client-url: %v", err)
	} else if cfg.authenticates() && !isUnixURL(cfg.EtcdClientURL) {
		add("--etcd-client-url %q: with authentication on (--token-file, --client-ca-file or --policy-file) the embedded etcd's client listener must be a unix:// socket (the default, %s): on a TCP port any local user could reach etcd and bypass the policy", cfg.EtcdClientURL, defaultEtcdClientURL(cfg.DataDir))
	}
	if u, err := url.Parse(cfg.EtcdClientURL); err == nil && isUnixURL(cfg.EtcdClientURL) && len(u.Host+u.Path) > maxUnixSocketPath {
		add("--etcd-client-url %q: a unix socket path may have at most %d bytes; give a shorter --data-dir or a shorter unix:// path", cfg.EtcdClientURL, maxUnixSocketPath)
	}
	if p := cfg.PeerTLS; p.On() && (p.CertFile == "" || p.KeyFile == "" || p.CAFile == "") {
		add("peer TLS needs all of --peer-cert-file, --peer-key-file and --peer-ca-file (the CA that signs every member's peer certificate)")
	}
	if p := cfg.PeerTLS; p.On() && len(p.AllowedCNs) == 0 && cfg.TLSFiles != nil && cfg.TLSFiles.ClientCAFile != "" && sameFile(p.CAFile, cfg.TLSFiles.ClientCAFile) {
		add("--peer-ca-file is also --client-ca-file: every API client certificate would be accepted on the peer port as a member; give the members a CA of their own, or name the members' certificates with --peer-allowed-cn")
	}
	// A restore only writes the data dir: it needs the peer URLs as the
	// member will start with, not the certificates.
	checkScheme := !restoring
	peerURL := func(what, s string) {
		u, err := parseHTTPURL(s)
		switch {
		case err != nil:
			add("%s %q: %v", what, s, err)
		case checkScheme && cfg.PeerTLS.On() && u.Scheme != "https":
			add("%s %q: must be https with --peer-cert-file (peer traffic is encrypted)", what, s)
		case checkScheme && !cfg.PeerTLS.On() && u.Scheme == "https":
			add("%s %q: https peer URLs need --peer-cert-file, --peer-key-file and --peer-ca-file", what, s)
		}
	}
	for _, u := range cfg.ListenPeerURLs {
		peerURL("--listen-peer-urls", u)
	}
	for _, u := range cfg.AdvertisePeerURLs {
		peerURL("--initial-advertise-peer-urls", u)
	}
	if cfg.ElectionMs < 5*cfg.HeartbeatMs {
		add("--etcd-election-timeout (%dms) must be at least 5 heartbeat intervals (%dms)", cfg.ElectionMs, cfg.HeartbeatMs)
	}
	found := false
	for _, m := range strings.Split(cfg.InitialCluster, ",") {
		name, u, ok := strings.Cut(m, "=")
		if !ok {
			add("--initial-cluster entry %q is not name=url", m)
			continue
		}
		peerURL("--initial-cluster URL of "+name, u)
		found = found || name == cfg.Name
	}
	if !found {
		add("--initial-cluster %q has no member named %q (--name)", cfg.InitialCluster, cfg.Name)
	}
}

// listErrors formats configuration problems for a terminal: one alone on
// the line, several as an indented list.
func listErrors(errs []error) string {
	if len(errs) == 1 {
		return errs[0].Error()
	}
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = "\n  - " + err.Error()
	}
	return strings.Join(lines, "")
}

func parseHTTPURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, errors.New("scheme must be http or https")
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return nil, fmt.Errorf("needs host:port: %w", err)
	}
	return u, nil
}

// maxUnixSocketPath is the longest path Linux takes for a unix socket
// (sun_path is 108 bytes, with its terminating NUL).
const maxUnixSocketPath = 107

// defaultEtcdClientURL is the embedded etcd's client socket: in a
// directory of the data dir that only the daemon's user may enter.
func defaultEtcdClientURL(dataDir string) string {
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	return "unix://" + filepath.Join(dataDir, "run", "etcd.sock")
}

func isUnixURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "unix" || u.Scheme == "unixs")
}

// authenticates reports whether callers must say who they are: then the
// policy must not be bypassable through etcd's own port.
func (cfg Config) authenticates() bool {
	return cfg.TokenFile != "" || cfg.PolicyFile != "" || (cfg.TLSFiles != nil && cfg.TLSFiles.ClientCAFile != "") ||
		(cfg.TLS != nil && cfg.TLS.ClientAuth != tls.NoClientCert)
}

// sameFile reports whether two paths name the same file, or files with
// the same contents (two copies of one CA bundle).
func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ia, errA := os.Stat(a)
	ib, errB := os.Stat(b)
	if errA == nil && errB == nil && os.SameFile(ia, ib) {
		return true
	}
	da, errA := os.ReadFile(a)
	db, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(bytes.TrimSpace(da), bytes.TrimSpace(db))
}

// checkLoopbackURL accepts http(s) URLs on a loopback IP or localhost, and
// unix sockets.
func checkLoopbackURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "unix", "unixs":
		return nil
	case "http", "https":
	default:
		return fmt.Errorf("%q: scheme must be http, https, unix or unixs", s)
	}
	host, _, err := net.SplitHostPort(u.Host)
	if err != nil {
		return fmt.Errorf("%q needs host:port", s)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: the embedded etcd's client port must not be reachable from other hosts", s)
	}
	return nil
}

// withDefaultQuotas fills in the per-principal quotas left at zero.
func (cfg Config) withDefaultQuotas() Config {
	for _, q := range []struct {
		v   *int
		def int
	}{
		{&cfg.MaxSessionsPerPrincipal, DefaultMaxSessionsPerPrincipal},
		{&cfg.MaxWaitersPerPrincipal, DefaultMaxWaitersPerPrincipal},
		{&cfg.MaxStreamsPerPrincipal, DefaultMaxStreamsPerPrincipal},
		{&cfg.MaxSubscriptionsPerPrincipal, DefaultMaxSubscriptionsPerPrincipal},
	} {
		if *q.v == 0 {
			*q.v = q.def
		}
	}
	return cfg
}
