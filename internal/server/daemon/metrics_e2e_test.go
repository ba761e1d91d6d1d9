package daemon_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// scrape reads a daemon's /metrics.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value is the value of the family's series whose labels include labels
// (name=value pairs), or -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// coordd's own metrics count what happens: sessions, grants and waits,
// lock-delay, fenced writes by result, leaders and observers, config
// releases, subscribers and status reports, and the cluster-wide state
// read from etcd. Every coordd_ metric /metrics exports is in docs/operations.md's
// table, and every metric in the table is exported.
func TestCoorddMetrics(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.SlowDiskThreshold = daemon.DefaultSlowDiskThreshold // on in production, off in the other tests
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()

	a, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held, err := a.Lock(ctx, "m/held")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	wctx, stopWaiting := context.WithCancel(ctx)
	go func() {
		_, err := b.Lock(wctx, "m/held")
		waiting <- err
	}()
	if _, err := held.Put(ctx, "m/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	stale := clientlib.Fence{Lock: "m/held", Token: held.Token() - 1}
	if _, err := c.Admin().FencedPut(ctx, stale, "m/k", []byte("old")); !errors.Is(err, clientlib.ErrStaleToken) && !errors.Is(err, clientlib.ErrNotHolder) {
		t.Fatalf("a stale fenced write: %v", err)
	}
	if _, err := a.Campaign(ctx, "m/election", "a"); err != nil {
		t.Fatal(err)
	}
	obs := c.Observe(ctx, "m/election")
	<-obs.Events()
	if _, err := c.ConfigCenter().Put(ctx, "m/app", "k", "v1", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"m/app"}, clientlib.WithInstance("i-1", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	wait.Within(t, 10*time.Second, "the metrics to show it all", func() bool {
		f := scrape(t, base)
		want := map[string]float64{
			"coordd_sessions_created_total": 2, "coordd_sessions": 2,
			"coordd_lock_grants_total": 1, "coordd_lock_wait_seconds": 1,
			"coordd_locks_held": 1, "coordd_lock_holders": 1, "coordd_lock_waiters": 1,
			"coordd_election_leader_changes_total": 1, "coordd_elections_with_leader": 1, "coordd_election_observers": 1,
			"coordd_config_namespaces": 1, "coordd_config_watchers": 1,
			"coordd_etcd_quota_backend_bytes": 2 << 30, "coordd_etcd_is_learner": 0, "coordd_etcd_can_commit": 1,
			"coordd_session_expiries_total": 0,
		}
		for name, v := range want {
			if got := value(f, name); got != v {
				t.Logf("%s = %v, want %v", name, got, v)
				return false
			}
		}
		return value(f, "coordd_fenced_writes_total", "result", "accepted") == 1 &&
			value(f, "coordd_fenced_writes_total", "result", "stale_token")+value(f, "coordd_fenced_writes_total", "result", "not_holder") == 1 &&
			value(f, "coordd_config_releases_total", "op", "put") == 1 &&
			value(f, "coordd_config_status_reports_total") >= 1 &&
			value(f, "coordd_etcd_alarm", "type", "NOSPACE") == 0 &&
			value(f, "coordd_group_commit_batches_total") >= 2 &&
			value(f, "coordd_group_commit_changes_total") >= value(f, "coordd_group_commit_batches_total") &&
			value(f, "coordd_etcd_revision") > 0 && value(f, "coordd_etcd_db_size_bytes") > 0 &&
			value(f, "coordd_config_watch_cache_live") == 1 && value(f, "coordd_config_watch_cache_lag_seconds") < 5
	})

	// A lock-delay sat out, and a session lost while kept alive.
	stopWaiting()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting Lock call: %v; want it cancelled", err)
	}
	if _, err := b.Lock(ctx, "m/delayed", clientlib.WithLockDelay(200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(ctx, "m/delayed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin().KeepAliveSession(ctx, b.ID()); !errors.Is(err, clientlib.ErrSessionNotFound) {
		t.Fatalf("keep-alive of a closed session: %v", err)
	}
	// A session nobody renews is ended by this member's session clock.
	dead, err := c.Admin().CreateSession(ctx, 2*time.Second, "dead", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 10*time.Second, "the unrenewed session to be ended", func() bool {
		return value(scrape(t, base), "coordd_sessions_ended_total") == 1
	})
	if _, err := c.Admin().GetSession(ctx, dead.ID); !errors.Is(err, clientlib.ErrSessionNotFound) {
		t.Fatalf("the ended session: %v", err)
	}
	f := scrape(t, base)
	if v := value(f, "coordd_lock_delay_waits_total"); v != 1 {
		t.Errorf("coordd_lock_delay_waits_total = %v, want 1", v)
	}
	// At least the keep-alive of b after its close; a renewal of b that
	// the SDK had in flight when b closed may land after the close too
	// (it counted 2 once on a loaded machine). None counted before b
	// closed (the first wait above).
	if v := value(f, "coordd_session_expiries_total"); v < 1 {
		t.Errorf("coordd_session_expiries_total = %v, want at least 1", v)
	}
	if v := value(f, "coordd_sessions_closed_total"); v != 1 {
		t.Errorf("coordd_sessions_closed_total = %v, want 1", v)
	}

	// The operations guide's table and /metrics name the same coordd_
	// metrics.
	readme, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "## Metrics"); i >= 0 {
		section = section[i:]
		if j := strings.Index(section[3:], "\n## "); j >= 0 {
			section = section[:j+3]
		}
	} else {
		t.Fatal("docs/operations.md has no ## Metrics section")
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(coordd_[a-z_]+)`").FindAllStringSubmatch(section, -1) {
		documented[m[1]] = true
	}
	for name := range f {
		if strings.HasPrefix(name, "coordd_") && !strings.HasPrefix(name, "coordd_grpc_") && !documented[name] {
			t.Errorf("%s is exported but not in the metrics table of docs/operations.md", name)
		}
	}
	for name := range documented {
		if _, ok := f[name]; !ok && !strings.HasPrefix(name, "coordd_grpc_") {
			t.Errorf("%s is in the metrics table of docs/operations.md but not exported", name)
		}
	}
}
