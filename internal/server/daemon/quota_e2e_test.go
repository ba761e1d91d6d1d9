package daemon_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// A database that reaches its quota: etcd raises NOSPACE, and coordd says
// so everywhere (the error of every write that adds data, /readyz, cluster
// status, alarms, the metric), while reads, releases, resignations and
// session closes keep working. Compaction, defragmentation and disarming
// bring it back.
func TestQuotaFullDatabase(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.QuotaBackendBytes = 4 << 20
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	base := "http://" + d.HTTPAddr()

	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Lock(ctx, "quota/held")
	if err != nil {
		t.Fatal(err)
	}
	leading, err := s.Campaign(ctx, "quota/election", "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConfigCenter().Put(ctx, "quota/app", "small", "kept", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}

	// Fill it with new versions of one large fenced value: only old
	// revisions, which compaction frees (config releases would stay in the
	// release history).
	blob := []byte(strings.Repeat("x", 100<<10))
	var fillErr error
	for i := 0; i < 200 && fillErr == nil; i++ {
		_, fillErr = held.Put(ctx, "quota/fill", blob)
	}
	if !errors.Is(fillErr, clientlib.ErrNoSpace) || !strings.Contains(fillErr.Error(), "--quota-backend-bytes") {
		t.Fatalf("filling a 4 MiB database: %v; want ErrNoSpace naming --quota-backend-bytes", fillErr)
	}

	// Said everywhere.
	wait.Within(t, 5*time.Second, "/readyz to report NOSPACE", func() bool {
		code, body := get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "NOSPACE")
	})
	st, err := c.Admin().ClusterStatus(ctx)
	if err != nil || len(st.Alarms) != 1 || st.Alarms[0].Type != "NOSPACE" || st.Alarms[0].MemberName != "n1" || st.Quota != 4<<20 {
		t.Fatalf("cluster status: alarms %+v, quota %d, %v; want NOSPACE of n1 and a 4 MiB quota", st.Alarms, st.Quota, err)
	}
	if h := st.Members[0].Health; h == nil || len(h.Alarms) != 1 || h.Alarms[0].Type != "NOSPACE" {
		t.Fatalf("member health %+v; want the NOSPACE alarm on the member", h)
	}
	if as, err := c.Admin().Alarms(ctx); err != nil || len(as) != 1 || as[0].Type != "NOSPACE" {
		t.Fatalf("alarms: %+v, %v", as, err)
	}
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, `coordd_etcd_alarm{type="NOSPACE"} 1`) {
		t.Fatal("metrics: coordd_etcd_alarm{type=\"NOSPACE\"} is not 1")
	}
	r := call(t, "POST", base+"/v1/sessions", `{"ttl":"10s"}`)
	if r.status != http.StatusInsufficientStorage || reason(r) != "NO_SPACE" {
		t.Fatalf("REST session create on a full database: %d %s; want 507 NO_SPACE", r.status, reason(r))
	}
	if _, err := c.NewSession(ctx); !errors.Is(err, clientlib.ErrNoSpace) {
		t.Fatalf("new session on a full database: %v; want ErrNoSpace", err)
	}
	if _, err := s.TryLock(ctx, "quota/other"); !errors.Is(err, clientlib.ErrNoSpace) {
		t.Fatalf("new lock on a full database: %v; want ErrNoSpace", err)
	}

	// What still works.
	if v, _, err := c.ConfigCenter().Get(ctx, "quota/app", "small", 0); err != nil || v != "kept" {
		t.Fatalf("read on a full database: %q, %v", v, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release on a full database: %v", err)
	}
	if err := leading.Resign(ctx); err != nil {
		t.Fatalf("resign on a full database: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("session close on a full database: %v", err)
	}

	// Recovery: compact, defragment, disarm.
	compactAll(t, cfg.EtcdClientURL)
	df, err := c.Admin().Defragment(ctx)
	if err != nil || df.SizeAfter >= df.SizeBefore || df.MemberName != "n1" {
		t.Fatalf("defragment: %+v, %v; want n1 smaller than before", df, err)
	}
	disarmed, err := c.Admin().DisarmAlarms(ctx)
	if err != nil || len(disarmed) != 1 || disarmed[0].Type != "NOSPACE" {
		t.Fatalf("disarm: %+v, %v", disarmed, err)
	}
	wait.Within(t, 5*time.Second, "/readyz to be ready again", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
	s2, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("new session after recovery: %v", err)
	}
	if _, err := s2.Lock(ctx, "quota/held"); err != nil {
		t.Fatalf("lock after recovery: %v", err)
	}
	if as, err := c.Admin().Alarms(ctx); err != nil || len(as) != 0 {
		t.Fatalf("alarms after recovery: %+v, %v", as, err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// compactAll compacts the etcd at url up to its current revision.
func compactAll(t *testing.T, url string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(10*time.Second))
	defer cancel()
	resp, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}
