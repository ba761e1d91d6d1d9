// Package daemontest is the configuration of an in-process coordd for
// tests: one member on loopback with fast raft ticks and fsync off. It is
// for tests only; never use its settings in production.
package daemontest

import (
	"time"

	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/server/daemon"
)

// Config is a single-member daemon keeping its data in dataDir, its
// etcd's client listener at etcdClientURL (a unix:// socket) and its peer
// listener at peerURL; the gRPC and HTTP listeners take free loopback
// ports when it starts (Daemon.GRPCAddr, Daemon.HTTPAddr). Raft runs
// 10 ms heartbeats and 100 ms election timeouts, and nothing is fsynced.
func Config(dataDir, etcdClientURL, peerURL string, lg *zap.Logger) daemon.Config {
	return daemon.Config{
		DataDir:         dataDir,
		Name:            "n1",
		EtcdClientURL:   etcdClientURL,
		ListenPeerURLs:  []string{peerURL},
		GRPCAddr:        "127.0.0.1:0",
		HTTPAddr:        "127.0.0.1:0",
		HeartbeatMs:     10,
		ElectionMs:      100,
		UnsafeNoFsync:   true,
		ShutdownTimeout: 5 * time.Second,
		Logger:          lg,
	}
}
