package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// The restore drill: save a snapshot, keep going (tokens, terms and
// releases advance), restore the old snapshot to a new three-member
// cluster. Every token and term handed out afterwards is greater than any
// handed out before the restore, also those after the snapshot; the
// snapshot's sessions are gone, so what they held is free; config reads
// see the snapshot's releases, and a watch from before the restore starts
// with a snapshot of them.
func TestRestoreDrill(t *testing.T) {
	t.Parallel()
	old := start(t, testConfig(t))
	c := newClient(t, old.GRPCAddr())
	ctx := t.Context()

	s, err := c.NewSession(ctx, clientlib.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Held at the snapshot, released after it.
	held, err := s.Lock(ctx, "drill/held")
	if err != nil {
		t.Fatal(err)
	}
	leading, err := s.Campaign(ctx, "drill/election", "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConfigCenter().Put(ctx, "drill/app", "k", "at-snapshot", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	// The history recorder's claim is a lease of the snapshot too.
	wait.For(t, "the history recorder's claim", func() bool { return old.Metric("coordd_history_recording") == 1 })
	file := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin().SaveSnapshot(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	// After the snapshot: more grants, a resignation, a release.
	highest := max(held.Token(), leading.Term())
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leading.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		l, err := s.Lock(ctx, "drill/held")
		if err != nil {
			t.Fatal(err)
		}
		highest = max(highest, l.Token())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lost, err := c.ConfigCenter().Put(ctx, "drill/app", "k", "after-snapshot", clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Restore to a new three-member cluster.
	cfgs := clusterConfigs(t, 3)
	for _, cfg := range cfgs {
		r, err := daemon.Restore(cfg, daemon.RestoreOptions{Snapshot: file})
		if err != nil {
			t.Fatalf("restore %s: %v", cfg.Name, err)
		}
		// The session, and the lease of the member recording the history.
		if r.Sessions != 2 {
			t.Errorf("restore %s: %d leases in the snapshot, want 2 (a session and the history recorder's claim)", cfg.Name, r.Sessions)
		}
	}
	if _, err := daemon.Restore(cfgs[0], daemon.RestoreOptions{Snapshot: file}); err == nil || !strings.Contains(err.Error(), "is not empty") {
		t.Fatalf("restore onto a data dir in use: %v, want a refusal", err)
	}
	ds := startConfigs(t, cfgs)
	eps := grpcAddrs(ds)
	nc := newClient(t, eps...)

	// The snapshot's session is gone, and what it held is free. A new
	// cluster answers UNAVAILABLE while its first etcd leadership
	// settles (the API's retry answer): asked again until it answers.
	wait.Within(t, 15*time.Second, "the restored cluster to answer", func() bool {
		_, err := nc.Admin().GetSession(ctx, s.ID())
		if errors.Is(err, clientlib.ErrUnavailable) {
			return false
		}
		if !errors.Is(err, clientlib.ErrSessionNotFound) {
			t.Fatalf("the snapshot's session after the restore: %v, want ErrSessionNotFound", err)
		}
		return true
	})
	ns, err := nc.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, wait.Bound(5*time.Second))
	defer cancel()
	l, err := ns.Lock(tctx, "drill/held")
	if err != nil {
		t.Fatalf("the lock the snapshot's session held: %v", err)
	}
	ld, err := ns.Campaign(tctx, "drill/election", "new")
	if err != nil {
		t.Fatalf("the election the snapshot's session led: %v", err)
	}
	for what, v := range map[string]fencing.Token{"lock token": l.Token(), "term": ld.Term()} {
		if v <= highest {
			t.Errorf("%s after the restore %d, not above %d handed out before it", what, v, highest)
		}
	}

	// Config: the snapshot's content; a watch from before the restore
	// starts with a snapshot.
	// A member of the new cluster that answers slowly while it settles
	// (a loaded machine) has the client move, and the read answer
	// UNAVAILABLE: it is asked again.
	wait.Within(t, 15*time.Second, "the restored config", func() bool {
		v, _, err := nc.ConfigCenter().Get(ctx, "drill/app", "k", 0)
		if errors.Is(err, clientlib.ErrUnavailable) {
			return false
		}
		if err != nil || v != "at-snapshot" {
			t.Fatalf("config after the restore: %q, %v; want the snapshot's value", v, err)
		}
		return true
	})
	wctx, wcancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
	defer wcancel()
	var first clientlib.ConfigWatchEvent
	errStop := errors.New("stop")
	err = nc.ConfigCenter().Watch(wctx, []string{"drill/app"}, lost.Revision, func(ev clientlib.ConfigWatchEvent) error {
		first = ev
		return errStop
	})
	if !errors.Is(err, errStop) || first.Type != "SNAPSHOT" || first.Revision <= lost.Revision {
		t.Fatalf("watch from revision %d of the old cluster: first %+v (%v); want a SNAPSHOT past it", lost.Revision, first, err)
	}
}

// A truncated or corrupt snapshot, or a missing one, is refused and leaves
// no data dir behind.
func TestRestoreRefusesBadSnapshots(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	f, err := os.Create(good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin().SaveSnapshot(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	truncated, corrupt := filepath.Join(dir, "truncated.db"), filepath.Join(dir, "corrupt.db")
	if err := os.WriteFile(truncated, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)/3] ^= 0xff
	if err := os.WriteFile(corrupt, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, snap := range []string{truncated, corrupt, filepath.Join(dir, "missing.db")} {
		cfg := testConfig(t)
		if _, err := daemon.Restore(cfg, daemon.RestoreOptions{Snapshot: snap}); err == nil {
			t.Errorf("restore of %s succeeded", filepath.Base(snap))
		}
		if entries, _ := os.ReadDir(cfg.DataDir); len(entries) > 0 {
			t.Errorf("restore of %s left %d entries in the data dir", filepath.Base(snap), len(entries))
		}
	}
}
