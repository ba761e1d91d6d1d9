package verify_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/testkit/daemontest"
	"github.com/coordd/coordd/internal/verify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) *clientlib.Client {
	t.Helper()
	dir := t.TempDir()
	peer, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(t.Context(), daemontest.Config(filepath.Join(dir, "data"), "unix://"+filepath.Join(dir, "etcd.sock"),
		fmt.Sprintf("http://127.0.0.1:%d", peer), zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A healthy daemon passes: grants and fenced writes on both kinds, every
// late write refused, nothing left behind. Sabotaged (writes to an
// unfenced store), the same run fails: the late writes land after newer
// tokens' and the checkers say so.
func TestVerify(t *testing.T) {
	c := start(t)
	rep, err := verify.Run(t.Context(), c, verify.Options{Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Passed || len(rep.Violations) > 0 {
		t.Fatalf("a healthy daemon failed verify: %+v", rep)
	}
	for kind, kr := range map[string]verify.KindReport{"lock": rep.Lock, "election": rep.Election} {
		if kr.Grants < 5 || kr.Writes < 2*kr.Grants-2 || kr.Applied < kr.Writes-kr.Refused-kr.Unknown || kr.LateRefused != kr.LateWrites || kr.LateWrites < kr.Grants-2 {
			t.Errorf("%s: %+v: want grants, two writes each, all applied, and every late write refused", kind, kr)
		}
		if kr.GrantP50 <= 0 || kr.LongestGap <= 0 {
			t.Errorf("%s: figures missing: %+v", kind, kr)
		}
	}
	if rep.Leftovers != "" {
		t.Errorf("left behind: %s", rep.Leftovers)
	}
	page, err := c.KV().List(t.Context(), rep.Name, clientlib.ListOptions{})
	if err != nil || len(page.KVs) != 0 {
		t.Errorf("keys left under %s: %+v (%v)", rep.Name, page.KVs, err)
	}
	if st, err := c.Admin().DescribeLock(t.Context(), rep.Name+"lock"); err == nil && (len(st.Holders) > 0 || len(st.Waiters) > 0) {
		t.Errorf("the run's lock still has holders or waiters: %+v", st)
	}
	if !strings.HasPrefix(rep.Name, "coordd-verify/") {
		t.Errorf("names %q, want them under coordd-verify/", rep.Name)
	}

	bad, err := verify.Run(t.Context(), c, verify.Options{Duration: 2 * time.Second, Sabotage: verify.SabotageUnfenced})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("healthy: lock %+v, election %+v", rep.Lock, rep.Election)
	t.Logf("sabotaged: %d violations, e.g. %v", len(bad.Violations), bad.Violations[:min(3, len(bad.Violations))])
	if bad.Passed || len(bad.Violations) == 0 {
		t.Fatalf("verify passed with its fence switched off: %+v", bad)
	}
	found := false
	for _, v := range bad.Violations {
		found = found || strings.HasPrefix(v.Checker, "write-order-") || strings.HasPrefix(v.Checker, "linearizable-")
	}
	if !found {
		t.Errorf("sabotaged run's violations %v, want write-order or linearizability ones", bad.Violations)
	}
}
