package daemon_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
)

const (
	rulesFile     = "../../../deploy/prometheus/coordd-rules.yml"
	rulesTestFile = "../../../deploy/prometheus/coordd-rules.test.yml"
	dashboardFile = "../../../deploy/grafana/coordd-dashboard.json"
)

// metricName matches the metric names in a PromQL expression: coordd's,
// etcd's, and the Go client's process and runtime metrics.
var metricName = regexp.MustCompile(`\b((?:coordd|etcd|process|go)_[a-zA-Z0-9_]+)`)

// exported reports whether name is a series of one of fams: a family's
// name, or a histogram's _bucket, _sum or _count series.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	if _, ok := fams[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := fams[base]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				return true
			}
		}
	}
	return false
}

// Every expression of the Grafana dashboard and of the alert rules names
// metrics that a running coordd exports, so neither silently shows nothing.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.SlowDiskThreshold = daemon.DefaultSlowDiskThreshold // on in production, off in the other tests
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(t.Context(), "monitoring"); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, "http://"+d.HTTPAddr())

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := map[string]string{} // expression -> where
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs[tg.Expr] = "dashboard panel " + p.Title
		}
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*expr: (.+)$`).FindAllStringSubmatch(string(rules), -1) {
		exprs[m[1]] = "alert rule"
	}
	if len(exprs) < 30 {
		t.Fatalf("read %d expressions from the dashboard and the rules; the files changed shape?", len(exprs))
	}
	names := 0
	for expr, where := range exprs {
		ms := metricName.FindAllString(expr, -1)
		if len(ms) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, name := range ms {
			names++
			if !exported(fams, name) {
				t.Errorf("%s: %q names %s, which /metrics does not export", where, expr, name)
			}
		}
	}
	t.Logf("%d expressions, %d metric names, all exported", len(exprs), names)
}

// The alert rules are valid and each alert fires (and stays silent) as
// its unit test in coordd-rules.test.yml expects. promtool comes with
// Debian's prometheus package, which CI installs (COORDD_REQUIRE_TOOLS=1
// turns a missing promtool into a failure).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("COORDD_REQUIRE_TOOLS") != "" {
			t.Fatal("promtool is not installed (apt-get install prometheus) and COORDD_REQUIRE_TOOLS is set")
		}
		t.Skip("promtool is not installed (apt-get install prometheus); skipping the alert rules' checks")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
