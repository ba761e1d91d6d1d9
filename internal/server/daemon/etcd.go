package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/featuregate"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.etcd.io/etcd/server/v3/lease"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/internal/session"
)

// nameListener names the flag of the etcd listener that err (from
// embed.StartEtcd) failed to open, as the gRPC and HTTP listeners' errors
// do; any other error is returned as it is.
func nameListener(err error, ecfg *embed.Config) error {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "listen" || op.Addr == nil {
		return err
	}
	addr := op.Addr.String()
	for _, flag := range []struct {
		name string
		urls []url.URL
	}{{"--listen-peer-urls", ecfg.ListenPeerUrls}, {"--etcd-client-url", ecfg.ListenClientUrls}} {
		for _, u := range flag.urls {
			if u.Host == addr || u.Path != "" && u.Path == addr {
				return fmt.Errorf("etcd's listener %s (%s): %w", u.String(), flag.name, err)
			}
		}
	}
	return err
}

// checkWALDir refuses a --wal-dir without a log while the data dir holds
// one (after coordd restore, or a start without --wal-dir): etcd would
// take the member for a new one and start it without its data.
func checkWALDir(etcdDir, walDir string) error {
	if walDir == "" {
		return nil
	}
	inData, _ := filepath.Glob(filepath.Join(etcdDir, "member", "wal", "*.wal"))
	inWALDir, _ := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if len(inData) > 0 && len(inWALDir) == 0 {
		return fmt.Errorf("--wal-dir %s has no write-ahead log, but %s has one (written by coordd restore or a start without --wal-dir): move its files to --wal-dir, or start without --wal-dir", walDir, filepath.Join(etcdDir, "member", "wal"))
	}
	return nil
}

// startEmbedded starts this daemon's etcd member and returns it with an
// in-process client (direct calls, no socket).
func startEmbedded(ctx context.Context, cfg Config, quiet *atomic.Bool) (*embed.Etcd, *clientv3.Client, error) {
	ecfg := embed.NewConfig()
	ecfg.Name = cfg.Name
	ecfg.Dir = filepath.Join(cfg.DataDir, "etcd")
	ecfg.InitialCluster = cfg.InitialCluster
	ecfg.ClusterState = cfg.InitialClusterState
	ecfg.InitialClusterToken = cfg.InitialClusterToken
	ecfg.TickMs, ecfg.ElectionMs = cfg.HeartbeatMs, cfg.ElectionMs
	ecfg.UnsafeNoFsync = cfg.UnsafeNoFsync
	ecfg.WalDir = cfg.WALDir
	ecfg.EnableGRPCGateway = false // coordd serves its own REST API
	ecfg.PreVote = true
	ecfg.AutoCompactionMode, ecfg.AutoCompactionRetention = cfg.Compaction.Etcd()
	ecfg.QuotaBackendBytes = cfg.QuotaBackendBytes

	var err error
	if ecfg.ListenPeerUrls, err = parseURLs(cfg.ListenPeerURLs); err != nil {
		return nil, nil, err
	}
	if ecfg.AdvertisePeerUrls, err = parseURLs(cfg.AdvertisePeerURLs); err != nil {
		return nil, nil, err
	}
	if ecfg.ListenClientUrls, err = parseURLs([]string{cfg.EtcdClientURL}); err != nil {
		return nil, nil, err
	}
	ecfg.AdvertiseClientUrls = ecfg.ListenClientUrls
	socket := unixSocketPath(ecfg.ListenClientUrls[0])
	if socket != "" {
		// The socket's directory is the daemon user's alone, so no other
		// local user can reach the socket, even in the moment before its
		// own mode is narrowed below.
		if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
			return nil, nil, fmt.Errorf("etcd client socket: %w", err)
		}
		if runDir, _ := filepath.Abs(filepath.Join(cfg.DataDir, "run")); filepath.Dir(socket) == runDir {
			if err := os.Chmod(runDir, 0o700); err != nil {
				return nil, nil, fmt.Errorf("etcd client socket: %w", err)
			}
		}
	}
	if cfg.PeerTLS.On() {
		// A CA makes etcd require and verify every peer's certificate;
		// allowed CNs narrow it to the members' own.
		ecfg.PeerTLSInfo = transport.TLSInfo{
			CertFile: cfg.PeerTLS.CertFile, KeyFile: cfg.PeerTLS.KeyFile,
			TrustedCAFile: cfg.PeerTLS.CAFile, ClientCertAuth: true,
			AllowedCNs: cfg.PeerTLS.AllowedCNs,
		}
	}

	// Keep a lease's remaining TTL across etcd leader changes instead of
	// resetting it, so a dead holder's session does not get a fresh TTL.
	gates := ecfg.ServerFeatureGate.(featuregate.MutableFeatureGate)
	if err := gates.Set("LeaseCheckpoint=true,LeaseCheckpointPersist=true"); err != nil {
		return nil, nil, fmt.Errorf("etcd feature gates: %w", err)
	}

	lg := cfg.Logger.Named("etcd")
	if cfg.EtcdLogWarning && lg.Core().Enabled(zapcore.InfoLevel) {
		lg = lg.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	}
	lg = lg.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return &etcdFilter{Core: c, quiet: quiet} }))
	ecfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)

	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start embedded etcd: %w", nameListener(err, ecfg))
	}
	// Before it is ready (a member waits for its cluster's quorum), etcd's
	// Close waits for client listeners that only start once it is ready:
	// stop the server first, or a SIGTERM during start-up would hang.
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Server.HardStop()
		e.Close()
		return nil, nil, fmt.Errorf("embedded etcd failed: %w", err)
	case <-ctx.Done():
		e.Server.HardStop()
		e.Close()
		return nil, nil, fmt.Errorf("embedded etcd not ready: %w", ctx.Err())
	}
	if socket != "" {
		if err := os.Chmod(socket, 0o600); err != nil {
			e.Server.HardStop()
			e.Close()
			return nil, nil, fmt.Errorf("etcd client socket: %w", err)
		}
	}
	return e, v3client.New(e.Server), nil
}

// unixSocketPath is the file of a unix:// listener URL ("" for others),
// as etcd reads it.
func unixSocketPath(u url.URL) string {
	if u.Scheme != "unix" && u.Scheme != "unixs" {
		return ""
	}
	return u.Host + u.Path
}

// connectExternal connects to an existing etcd cluster.
func connectExternal(ctx context.Context, cfg Config) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.EtcdEndpoints,
		TLS:                  cfg.EtcdTLS,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Context:              context.WithoutCancel(ctx),
		Logger:               cfg.Logger.Named("etcd-client").WithOptions(zap.IncreaseLevel(zap.WarnLevel)),
		DialOptions:          []grpc.DialOption{grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow)},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", cfg.EtcdEndpoints, err)
	}
	return cli, nil
}

func parseURLs(ss []string) ([]url.URL, error) {
	out := make([]url.URL, 0, len(ss))
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("URL %q: %w", s, err)
		}
		out = append(out, *u)
	}
	return out, nil
}

// etcdFilter drops etcd log entries that are expected in coordd and would
// only alarm an operator:
//   - warnings about choices coordd makes on purpose: one client port for
//     HTTP and gRPC (it is loopback-only and serves coordd alone) and
//     etcd's simple auth tokens (coordd does not use etcd's auth);
//   - a refused apply for a lease that does not exist: a request that named
//     an unknown or expired session (see failedApply);
//   - once a stop has begun (quiet), the errors etcd logs about its own
//     listeners being closed.
type etcdFilter struct {
	zapcore.Core
	quiet *atomic.Bool
}

var (
	etcdNoise = []string{
		"Running http and grpc server on single port",
		"simple token is not cryptographically signed",
	}
	etcdStopNoise = []string{
		"setting up serving from embedded etcd failed",
		"stopping insecure grpc server",
		"stopped insecure grpc server",
		// After closeEtcd stopped a leader that could not hand off (it
		// logs that itself).
		"leadership transfer failed",
	}
)

func (f *etcdFilter) With(fields []zapcore.Field) zapcore.Core {
	return &etcdFilter{Core: f.Core.With(fields), quiet: f.quiet}
}

func (f *etcdFilter) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if hasPrefix(e.Message, etcdNoise) || (f.quiet.Load() && hasPrefix(e.Message, etcdStopNoise)) {
		return ce
	}
	if e.Message == failedApply || e.Message == slowApply {
		// Decided in Write, which sees the entry's fields.
		if f.Enabled(e.Level) {
			return ce.AddCore(e, f)
		}
		return ce
	}
	return f.Core.Check(e, ce)
}

// failedApply is etcd's warning, with the whole request, for a transaction
// it refused while applying it (slowApply, for one that took long). coordd
// sends a session's lease with every write on its behalf, so a request
// naming an unknown or expired session (a client error, answered
// SESSION_NOT_FOUND) would log such a dump; those with etcd's "lease not
// found" are dropped.
const (
	failedApply = "failed to apply request"
	slowApply   = "apply request took too long"
)

func (f *etcdFilter) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if e.Message == failedApply || e.Message == slowApply {
		for _, fd := range fields {
			if err, ok := fd.Interface.(error); ok && fd.Key == "error" && strings.Contains(err.Error(), "lease not found") {
				return nil
			}
		}
	}
	return f.Core.Write(e, fields)
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// closeEtcd closes the embedded member. A leader first hands leadership to
// another voting member, so the cluster need not wait an election timeout
// for a new one; the hand-off gets transferFor in all. etcd's own hand-off
// on close would wait up to its request timeout (5 s + two election
// timeouts), which is wasted when the other members are stopping too, so
// a member of a cluster then stops without it (as after a crash): if it
// still leads, the others elect a leader by themselves.
func closeEtcd(e *embed.Etcd, lg *zap.Logger, transferFor time.Duration) {
	s := e.Server
	self := s.MemberID()
	if s.Leader() == self {
		others := otherVoters(s)
		// Each voter gets an equal share: one that is down uses up only its
		// own, one that is up takes over within a few heartbeats.
		for _, id := range others {
			ctx, cancel := context.WithTimeout(context.Background(), transferFor/time.Duration(len(others)))
			err := s.MoveLeader(ctx, uint64(self), id)
			cancel()
			if err == nil {
				break
			}
		}
		if s.Leader() == self && len(s.Cluster().Members()) > 1 {
			lg.Info("etcd leadership hand-off did not finish; stopping the member without it", zap.Duration("waited", transferFor))
		}
	}
	// Stopped hard, Close finds no peer to hand off to and skips etcd's own
	// hand-off. That matters for a member that did not lead a moment ago
	// too: a peer stopping at the same time may just have handed it the
	// leadership, and etcd's hand-off back to that stopping peer would wait
	// its whole request timeout. The only cost: if it does lead now, the
	// others elect a leader after an election timeout, as after a crash.
	if len(s.Cluster().Members()) > 1 {
		s.HardStop()
	}
	e.Close()
}

// otherVoters are the ids of s's cluster's voting members other than s:
// those etcd's leadership can be handed to.
func otherVoters(s *etcdserver.EtcdServer) []uint64 {
	var out []uint64
	for _, m := range s.Cluster().Members() {
		if m.ID != s.MemberID() && !m.IsLearner {
			out = append(out, uint64(m.ID))
		}
	}
	return out
}

// renewer renews sessions through the embedded member's own lessor (which
// forwards to the etcd leader's when this member does not lead): about a
// microsecond of CPU on the leader, against some 30 for a keep-alive stream
// of the in-process client per renewal. Errors other than a missing lease
// are etcd being unavailable (no leader, a timeout, a stop).
func renewer(srv *etcdserver.EtcdServer) session.Renewer {
	return func(ctx context.Context, id clientv3.LeaseID) (int64, error) {
		ttl, err := srv.LeaseRenew(ctx, lease.LeaseID(id))
		switch {
		case errors.Is(err, lease.ErrLeaseNotFound), err == nil && ttl <= 0:
			return 0, rpctypes.ErrLeaseNotFound
		case err != nil:
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, status.Error(codes.Unavailable, "etcd: renew lease: "+err.Error())
		}
		return ttl, nil
	}
}
