// Package etcdtest starts real embedded etcd members for tests: a temp data
// dir, loopback URLs on ports from freeport, fast raft ticks, no fsync. It is for
// tests only; never use its settings in production.
package etcdtest

import (
	"context"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
)

// Member is one running embedded etcd member.
type Member struct {
	Etcd      *embed.Etcd
	ClientURL string
}

// Config returns an embed.Config for a single-member test cluster in a temp
// dir, with tick 10 ms / election 100 ms and fsync off.
func Config(tb testing.TB) *embed.Config {
	tb.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "test"
	cfg.Dir = tb.TempDir()
	cu := mustURL(tb, freeport.URL(tb))
	pu := mustURL(tb, freeport.URL(tb))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zaptest.NewLogger(tb, zaptest.Level(zap.ErrorLevel)))
	return cfg
}

// Start starts a single-member etcd and stops it when the test ends. In
// short mode (go test -short) it skips the test instead: every test that
// needs etcd gets it here, so none needs a skip of its own.
func Start(tb testing.TB) *Member {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts etcd (not in -short mode)")
	}
	cfg := Config(tb)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatalf("etcdtest: start: %v", err)
	}
	tb.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		tb.Fatalf("etcdtest: etcd failed: %v", err)
	case <-time.After(20 * time.Second):
		tb.Fatal("etcdtest: etcd not ready after 20s")
	}
	return &Member{Etcd: e, ClientURL: cfg.AdvertiseClientUrls[0].String()}
}

// Client returns a client of m, closed when the test ends.
func (m *Member) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{m.ClientURL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	// The test is over: an error closing its client says nothing about it.
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

func mustURL(tb testing.TB, s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return *u
}

// CountGets makes cli count the reads made through it (Get calls), and
// returns the count. Call it before handing cli to what is measured.
func CountGets(cli *clientv3.Client) *atomic.Int64 {
	kv := &countingKV{KV: cli.KV}
	cli.KV = kv
	return &kv.gets
}

type countingKV struct {
	clientv3.KV
	gets atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.gets.Add(1)
	return c.KV.Get(ctx, key, opts...)
}

// Watcher runs a grantwatch.Watcher of prefixes on cli (as a coordd member
// runs one per prefix) until the test ends.
func Watcher(tb testing.TB, cli *clientv3.Client, prefixes ...string) *grantwatch.Watcher {
	tb.Helper()
	w := grantwatch.New(cli, prefixes...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	return w
}
