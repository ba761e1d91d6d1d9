package daemon_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// The embedded member compacts by default, keeping 10 seconds of history.
func TestCompactionIsOnByDefault(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	ec := d.Etcd().Config()
	if ec.AutoCompactionMode != cluster.CompactionPeriodic || ec.AutoCompactionRetention != "10s" {
		t.Fatalf("embedded etcd compaction: mode %q, retention %q; want periodic, 10s", ec.AutoCompactionMode, ec.AutoCompactionRetention)
	}
}

// With compaction running (a one-second window here), everything coordd
// promises survives it: release history, diff and rollback read release
// records, never old revisions; a config subscription cut off while its
// revision is compacted away resumes into the current releases; an
// election observer resuming from a compacted revision starts from the
// current leader; lock tokens keep growing.
func TestCompactionKeepsWhatCoorddNeeds(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Compaction = cluster.Compaction{Mode: cluster.CompactionPeriodic, Retention: "1s"}
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	const ns = "compaction/app"

	first, err := c.ConfigCenter().Put(ctx, ns, "k", "1", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.Start(t, d.GRPCAddr())
	sc := newClient(t, proxy.Addr())
	sub, err := sc.ConfigCenter().Subscribe(ctx, []string{ns}, fast...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lock1, err := s.Lock(ctx, "compaction/lock")
	if err != nil {
		t.Fatal(err)
	}
	if err := lock1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l1, err := s.Campaign(ctx, "compaction/election", "one")
	if err != nil {
		t.Fatal(err)
	}
	observedAt := first.Revision

	proxy.Down() // the subscriber is cut off from here on
	var last clientlib.ConfigRelease
	for _, v := range []string{"2", "3", "4", "5"} {
		if last, err = c.ConfigCenter().Put(ctx, ns, "k", v, clientlib.PublishOptions{Message: "set " + v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("second"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Campaign(ctx, "compaction/election", "two"); err != nil {
		t.Fatal(err)
	}
	waitCompacted(t, []string{cfg.EtcdClientURL}, last.Revision)

	// History, diff and rollback.
	rels, err := c.ConfigCenter().Releases(ctx, ns, 0, 10)
	if err != nil || len(rels) != 5 {
		t.Fatalf("release history after compaction: %d releases, %v; want 5", len(rels), err)
	}
	changes, err := c.ConfigCenter().Diff(ctx, ns, first.Number, last.Number)
	if err != nil || len(changes) != 1 || changes[0].Key != "k" {
		t.Fatalf("diff of compacted releases: %+v, %v", changes, err)
	}
	if _, err := c.ConfigCenter().Rollback(ctx, ns, first.Number, clientlib.PublishOptions{}); err != nil {
		t.Fatalf("rollback to a release whose revision is compacted: %v", err)
	}
	rolled, err := c.ConfigCenter().Snapshot(ctx, ns, 0)
	if err != nil || rolled.Values["k"] != "1" {
		t.Fatalf("after rollback: %+v, %v; want k=1", rolled.Values, err)
	}

	// The subscriber resumes into the current release.
	proxy.Up()
	wait.Within(t, 15*time.Second, "the subscriber to catch up past the compaction", func() bool {
		v, _ := sub.Snapshot().Get(ns, "k")
		return sub.Snapshot().Release(ns) == rolled.Release && v == "1"
	})

	// The observer starts from the current leader.
	octx, cancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
	defer cancel()
	obs := c.Observe(octx, "compaction/election", clientlib.ObserveFrom(observedAt))
	ev, ok := <-obs.Events()
	if !ok || !ev.Current || ev.Leader.Value != "two" {
		t.Fatalf("observing from a compacted revision: first event %+v (ok %v, err %v); want the current leader, marked Current", ev, ok, obs.Err())
	}

	lock2, err := s.Lock(ctx, "compaction/lock")
	if err != nil {
		t.Fatal(err)
	}
	if lock2.Token() <= lock1.Token() {
		t.Fatalf("token after compaction %d, before %d", lock2.Token(), lock1.Token())
	}
}

// Over an external etcd, coordd compacts when told to.
func TestCompactionOfAnExternalEtcd(t *testing.T) {
	t.Parallel()
	m := etcdtest.Start(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints = []string{m.ClientURL}
	cfg.Compaction = cluster.Compaction{Mode: cluster.CompactionPeriodic, Retention: "1s"}
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	rel, err := c.ConfigCenter().Put(t.Context(), "external/app", "k", "v", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConfigCenter().Put(t.Context(), "external/app", "k", "w", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCompacted(t, []string{m.ClientURL}, rel.Revision)
}

// waitCompacted waits until etcd has compacted away revision rev.
func waitCompacted(t *testing.T, endpoints []string, rev int64) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	wait.Within(t, 15*time.Second, "etcd to compact", func() bool {
		_, err := cli.Get(t.Context(), "any", clientv3.WithRev(rev))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
}

// With --auto-defrag-free-ratio, a member whose database file is mostly
// free after compaction defragments itself and gives the space back.
// (Checked to fail with AutoDefrag left zero: the file keeps its size.)
func TestAutoDefragGivesSpaceBack(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Compaction = cluster.Compaction{Mode: cluster.CompactionOff}
	cfg.AutoDefrag = cluster.AutoDefrag{FreeRatio: 0.5, MinFree: 1 << 20, Every: 50 * time.Millisecond}
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "defrag")
	if err != nil {
		t.Fatal(err)
	}
	blob := []byte(strings.Repeat("x", 100<<10))
	for range 80 { // 8 MiB of old versions of one key
		if _, err := l.Put(ctx, "defrag/blob", blob); err != nil {
			t.Fatal(err)
		}
	}
	full, err := c.Admin().ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	compactAll(t, cfg.EtcdClientURL)
	// Defragmenting 8 MiB under the race detector beside a CPU hog took
	// over 10 s once; the wait ends as soon as the space is back.
	wait.Within(t, 30*time.Second, "the member to defragment itself", func() bool {
		st, err := c.Admin().ClusterStatus(ctx)
		return err == nil && st.DBSize < full.DBSize/2
	})
}
