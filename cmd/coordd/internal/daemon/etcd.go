package daemon

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/featuregate"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

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
	ecfg.EnableGRPCGateway = false // coordd serves its own REST API
	ecfg.PreVote = true

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
	lg = lg.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return &closingFilter{Core: c, quiet: quiet} }))
	ecfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)

	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, nil, fmt.Errorf("embedded etcd failed: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, nil, fmt.Errorf("embedded etcd not ready: %w", ctx.Err())
	}
	return e, v3client.New(e.Server), nil
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

// closingFilter drops the error entries etcd logs, on every stop, about its
// own listeners being closed; they are expected and would alarm operators.
type closingFilter struct {
	zapcore.Core
	quiet *atomic.Bool
}

func (f *closingFilter) With(fields []zapcore.Field) zapcore.Core {
	return &closingFilter{Core: f.Core.With(fields), quiet: f.quiet}
}

func (f *closingFilter) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if f.quiet.Load() && (strings.HasPrefix(e.Message, "setting up serving from embedded etcd failed") ||
		strings.HasPrefix(e.Message, "stopping insecure grpc server") || strings.HasPrefix(e.Message, "stopped insecure grpc server")) {
		return ce
	}
	return f.Core.Check(e, ce)
}
