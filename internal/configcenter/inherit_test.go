package configcenter_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// sharedAndHeir makes common/db (host, port, timeout) and app/a (its own
// timeout and name), app/a inheriting from common/db.
func sharedAndHeir(t *testing.T, e env) configcenter.Release {
	t.Helper()
	ctx := t.Context()
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "common/db", Mutations: []configcenter.Mutation{
		{Key: "host", Value: "db1"}, {Key: "port", Value: "5432"}, {Key: "timeout", Value: "5s"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "app/a", Mutations: []configcenter.Mutation{
		{Key: "timeout", Value: "9s"}, {Key: "name", Value: "a"}}}); err != nil {
		t.Fatal(err)
	}
	rel, err := e.s.Inherit(ctx, "app/a", "common/db", configcenter.Setter{}, "ann", "share the db")
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func TestAnHeirSeesTheSharedNamespaceUnderItsOwnKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	rel := sharedAndHeir(t, e)
	if rel.Number != 2 || len(rel.Changes) != 2 || rel.InheritedFrom != "common/db" || rel.InheritedRelease != 1 {
		t.Fatalf("Inherit = %+v", rel)
	}
	snap, err := e.s.Snapshot(ctx, "app/a", 0)
	want := map[string]string{"host": "db1", "port": "5432", "timeout": "9s", "name": "a"}
	if err != nil || !equalMaps(snap.Content, want) || snap.Inherits != "common/db" || !snap.Inherited["host"] || snap.Inherited["timeout"] {
		t.Fatalf("the heir = %+v, %v", snap, err)
	}
	// A release of the shared namespace: one release of the heir, with
	// only what the heir does not override.
	shared, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "common/db", Mutations: []configcenter.Mutation{{Key: "host", Value: "db2"}, {Key: "timeout", Value: "1s"}}})
	if err != nil {
		t.Fatal(err)
	}
	rels, _ := e.s.Releases(ctx, "app/a", 0, 10)
	if len(rels) != 3 || rels[0].InheritedFrom != "common/db" || rels[0].InheritedRelease != shared.Number || len(rels[0].Changes) != 1 || rels[0].Changes[0].Key != "host" {
		t.Fatalf("the heir's releases = %+v", rels)
	}
	// Deleting an override brings the shared value back; an inherited key
	// cannot be deleted here.
	if r, err := e.s.Delete(ctx, "app/a", "timeout", 0, "", ""); err != nil || *r.Changes[0].New != "1s" {
		t.Fatalf("deleting the override = %+v, %v", r, err)
	}
	if _, err := e.s.Delete(ctx, "app/a", "host", 0, "", ""); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "inherited from") {
		t.Fatalf("deleting an inherited key = %v", err)
	}
	// An override of a shared key, then the shared key goes: the override
	// stays.
	if _, err := e.s.Put(ctx, "app/a", "port", "6000", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Delete(ctx, "common/db", "port", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	snap, _ = e.s.Snapshot(ctx, "app/a", 0)
	if snap.Content["port"] != "6000" || snap.Inherited["port"] {
		t.Fatalf("the override after the shared key went: %+v", snap)
	}
	// Stopping: only the heir's own keys stay.
	if _, err := e.s.Inherit(ctx, "app/a", "", configcenter.Setter{}, "", "on its own"); err != nil {
		t.Fatal(err)
	}
	snap, _ = e.s.Snapshot(ctx, "app/a", 0)
	if !equalMaps(snap.Content, map[string]string{"name": "a", "port": "6000"}) || snap.Inherits != "" {
		t.Fatalf("after stopping: %+v", snap)
	}
	if _, err := e.s.Put(ctx, "common/db", "host", "db3", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "app/a", 0); snap.Content["host"] != "" {
		t.Fatalf("a former heir got a shared release: %+v", snap)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSharedReleasesReachHeirsEvenIfTheWriterMissesThem: with the writer's
// own catch-up switched off (a member stopping right after a shared
// release), the heir misses the change (the check would catch that) until
// the cache finds it behind and CatchUp carries it.
func TestSharedReleasesReachHeirsEvenIfTheWriterMissesThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	cache := e.startCache(t, configcenter.CacheOptions{})
	ctx := t.Context()
	sharedAndHeir(t, e)
	configcenter.SetNoCatchUp(e.s)
	if _, err := e.s.Put(ctx, "common/db", "host", "db9", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "app/a", 0); snap.Content["host"] != "db1" {
		t.Fatalf("with catch-up off the heir has host=%q: the check below proves nothing", snap.Content["host"])
	}
	wait.For(t, "the cache to find the heir behind", func() bool { return slices.Equal(cache.BehindHeirs(), []string{"app/a"}) })
	rel, err := e.s.CatchUp(ctx, "app/a")
	if err != nil || rel.InheritedRelease != 2 || len(rel.Changes) != 1 {
		t.Fatalf("CatchUp = %+v, %v", rel, err)
	}
	if again, err := e.s.CatchUp(ctx, "app/a"); err != nil || again.Number != rel.Number {
		t.Fatalf("a second CatchUp = %+v, %v; want nothing new", again, err)
	}
	wait.Within(t, 10*time.Second, "the cache to see the heir current", func() bool { return len(cache.BehindHeirs()) == 0 })
	snap, err := cache.Snapshot(ctx, "app/a", rel.Revision)
	if err != nil || snap.Content["host"] != "db9" || snap.Inherits != "common/db" || !snap.Inherited["host"] {
		t.Fatalf("the cache's heir = %+v, %v", snap, err)
	}
}

func TestInheritanceRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	ctx := t.Context()
	sharedAndHeir(t, e)
	for name, try := range map[string]func() error{
		"itself":       func() error { _, err := e.s.Inherit(ctx, "x", "x", configcenter.Setter{}, "", ""); return err },
		"from an heir": func() error { _, err := e.s.Inherit(ctx, "x", "app/a", configcenter.Setter{}, "", ""); return err },
		"a shared one": func() error {
			_, err := e.s.Inherit(ctx, "common/db", "other", configcenter.Setter{}, "", "")
			return err
		},
		"stop when not":   func() error { _, err := e.s.Inherit(ctx, "x", "", configcenter.Setter{}, "", ""); return err },
		"a secret shared": func() error { return publishSecret(e, "common/db") },
		"from a secret one": func() error {
			_ = publishSecret(e, "vault")
			_, err := e.s.Inherit(ctx, "y", "vault", configcenter.Setter{}, "", "")
			return err
		},
	} {
		if err := try(); !errors.Is(err, configcenter.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// A shared release that would break an heir's schema is refused.
	if _, err := e.s.SetSchema(ctx, "app/a", `{"type":"object","properties":{"port":{"type":"integer","maximum":9999}}}`); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Put(ctx, "common/db", "port", "99999", 0, "", "")
	if !errors.Is(err, configcenter.ErrValidation) || !strings.Contains(err.Error(), `"app/a"`) {
		t.Fatalf("a shared release breaking an heir's schema = %v", err)
	}
}

func publishSecret(e env, ns string) error {
	_, err := e.s.Publish(context.Background(), configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{{Key: "pw", Value: "x", Secret: true}}})
	return err
}

// TestHeirsUnderApprovalAndRollback: a gated namespace cannot be made an
// heir (that would change it without four eyes), an heir cannot be rolled
// back, a proposal in an heir shows what the release will do, and an
// override equal to the inherited value is recorded as an override.
func TestHeirsUnderApprovalAndRollback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	sharedAndHeir(t, e)
	if _, err := e.s.SetApproval(ctx, "gated", configcenter.ApprovalPolicy{Required: true}, "admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Inherit(ctx, "gated", "common/db", configcenter.Setter{}, "", ""); !errors.Is(err, configcenter.ErrApprovalRequired) {
		t.Fatalf("inheriting into a gated namespace = %v", err)
	}
	if _, err := e.s.Rollback(ctx, "app/a", 1, 0, "", ""); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "inherits") {
		t.Fatalf("rolling back an heir = %v", err)
	}
	// Deleting the heir's own timeout: the proposal shows timeout coming
	// from the shared namespace, not a deletion.
	p, err := e.s.Propose(ctx, configcenter.ProposeRequest{Namespace: "app/a", Mutations: []configcenter.Mutation{{Key: "timeout", Delete: true}}, Proposer: "ann"})
	if err != nil || len(p.Changes) != 1 || p.Changes[0].New == nil || *p.Changes[0].New != "5s" {
		t.Fatalf("a proposal in an heir = %+v, %v", p, err)
	}
	if _, err := e.s.Propose(ctx, configcenter.ProposeRequest{Namespace: "app/a", Mutations: []configcenter.Mutation{{Key: "host", Delete: true}}, Proposer: "ann"}); !errors.Is(err, configcenter.ErrInvalid) {
		t.Fatalf("a proposal deleting an inherited key = %v", err)
	}
	// Overriding host with the value it inherits pins it: a later shared
	// change of host does not reach the heir.
	if _, err := e.s.Put(ctx, "app/a", "host", "db1", 0, "", "pin"); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "app/a", 0); snap.Inherited["host"] {
		t.Fatal("the pinned host is still marked inherited")
	}
	if _, err := e.s.Put(ctx, "common/db", "host", "db2", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "app/a", 0); snap.Content["host"] != "db1" {
		t.Fatalf("a shared change reached a pinned key: %q", snap.Content["host"])
	}
}

// An heir that requires approval takes no shared release by itself: it
// keeps what it carries and says why; a proposal there shows the shared
// changes it would bring, and its approval by another principal brings
// them.
func TestAGatedHeirTakesSharedReleasesOnlyByApproval(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	sharedAndHeir(t, e)
	if _, err := e.s.SetApproval(ctx, "app/a", configcenter.ApprovalPolicy{Required: true}, "admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "common/db", "host", "db2", 0, "ops", "move"); err != nil {
		t.Fatal(err)
	}
	snap, err := e.s.Snapshot(ctx, "app/a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Content["host"] != "db1" || !strings.Contains(snap.InheritanceSuspended, "approved") {
		t.Fatalf("the gated heir after a shared release: host %q, suspended %q; want db1 kept and why", snap.Content["host"], snap.InheritanceSuspended)
	}
	p, err := e.s.Propose(ctx, configcenter.ProposeRequest{Namespace: "app/a", Proposer: "ann"})
	if err != nil || len(p.Changes) != 1 || p.Changes[0].Key != "host" || *p.Changes[0].New != "db2" {
		t.Fatalf("an empty proposal in the gated heir = %+v, %v; want the shared host change", p, err)
	}
	if _, _, err := e.s.Approve(ctx, "app/a", p.Number, "bo", "ok"); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "app/a", 0); snap.Content["host"] != "db2" || snap.InheritanceSuspended != "" {
		t.Fatalf("after the approval: host %q, suspended %q; want db2, none", snap.Content["host"], snap.InheritanceSuspended)
	}
}
