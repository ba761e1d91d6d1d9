package configcenter_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	s   *configcenter.Store
	cli *clientv3.Client
	// local is the member's store, for caches that watch it in place
	// (CacheOptions.Local).
	local configcenter.LocalStore
}

func newEnv(tb testing.TB, limits configcenter.Limits) env {
	tb.Helper()
	m := etcdtest.Start(tb)
	cli := m.Client(tb)
	return env{s: configcenter.NewStore(cli, "/coordd/", limits), cli: cli, local: m.Etcd.Server.KV()}
}

func (e env) rev(t *testing.T) int64 {
	t.Helper()
	resp, err := e.cli.Get(t.Context(), "probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func ptr(s string) *string { return &s }

func TestPublishAndRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	snap, err := e.s.Snapshot(ctx, "payments/prod", 0)
	if err != nil || snap.Release != 0 || len(snap.Content) != 0 {
		t.Fatalf("empty namespace = %+v, %v", snap, err)
	}
	r1, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "payments/prod", Author: "ana", Message: "first",
		Mutations: []configcenter.Mutation{{Key: "db.url", Value: "postgres://a"}, {Key: "timeout", Value: "5s"}}})
	if err != nil || r1.Number != 1 || r1.Revision == 0 || len(r1.Changes) != 2 {
		t.Fatalf("Publish = %+v, %v", r1, err)
	}
	r2, err := e.s.Put(ctx, "payments/prod", "timeout", "10s", 0, "bo", "")
	if err != nil || r2.Number != 2 || len(r2.Changes) != 1 || *r2.Changes[0].Old != "5s" || *r2.Changes[0].New != "10s" {
		t.Fatalf("Put = %+v, %v", r2, err)
	}
	// A put that changes nothing makes no release.
	same, err := e.s.Put(ctx, "payments/prod", "timeout", "10s", 0, "bo", "")
	if err != nil || same.Number != 2 || len(same.Changes) != 0 || same.Revision != r2.Revision {
		t.Fatalf("no-op Put = %+v, %v", same, err)
	}
	got, _, err := e.s.Get(ctx, "payments/prod", "timeout", 0)
	if err != nil || got.Value != "10s" || got.ModRevision != r2.Revision {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	old, _, err := e.s.Get(ctx, "payments/prod", "timeout", r1.Revision)
	if err != nil || old.Value != "5s" {
		t.Fatalf("Get at release 1's revision = %+v, %v", old, err)
	}
	snap, err = e.s.Snapshot(ctx, "payments/prod", 0)
	if err != nil || snap.Release != 2 || snap.Changed != r2.Revision || snap.Content["db.url"] != "postgres://a" || snap.Content["timeout"] != "10s" {
		t.Fatalf("Snapshot = %+v, %v", snap, err)
	}
	if _, err := e.s.Delete(ctx, "payments/prod", "nope", 0, "", ""); !errors.Is(err, configcenter.ErrKeyNotFound) {
		t.Fatalf("Delete of a missing key = %v", err)
	}
	r3, err := e.s.Delete(ctx, "payments/prod", "db.url", 0, "", "")
	if err != nil || r3.Number != 3 || r3.Changes[0].New != nil {
		t.Fatalf("Delete = %+v, %v", r3, err)
	}
	if _, _, err := e.s.Get(ctx, "payments/prod", "db.url", 0); !errors.Is(err, configcenter.ErrKeyNotFound) {
		t.Fatalf("Get after Delete = %v", err)
	}
	// "payments/prod" and "payments/prod/eu" do not mix.
	if _, err := e.s.Put(ctx, "payments/prod/eu", "timeout", "1s", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if snap, _ := e.s.Snapshot(ctx, "payments/prod", 0); len(snap.Content) != 1 {
		t.Fatalf("payments/prod after a put to payments/prod/eu: %v", snap.Content)
	}
	// Pages follow one stable order and do not overlap.
	nss, err := e.s.Namespaces(ctx, "payments/", "", 10)
	if err != nil || len(nss) != 2 {
		t.Fatalf("Namespaces = %v, %v", nss, err)
	}
	first, err := e.s.Namespaces(ctx, "", "", 1)
	if err != nil || len(first) != 1 || first[0] != nss[0] {
		t.Fatalf("first page = %v, %v", first, err)
	}
	if page, err := e.s.Namespaces(ctx, "", first[0], 10); err != nil || len(page) != 1 || page[0] != nss[1] {
		t.Fatalf("Namespaces after %s = %v, %v", first[0], page, err)
	}
}

func TestCompareAndSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	r1, err := e.s.Put(ctx, "app", "a", "1", 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	base := e.rev(t) // a snapshot read after release 1
	if _, err := e.s.Put(ctx, "app", "a", "2", base, "", ""); err != nil {
		t.Fatalf("CAS at a revision after the last release: %v", err)
	}
	before := e.rev(t)
	if _, err := e.s.Put(ctx, "app", "a", "3", r1.Revision, "", ""); !errors.Is(err, configcenter.ErrRevisionMismatch) {
		t.Fatalf("CAS at a stale revision = %v, want ErrRevisionMismatch", err)
	}
	if e.rev(t) != before {
		t.Fatal("a failed CAS wrote something")
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{MaxValueBytes: 16, MaxKeysPerRelease: 3, MaxReleaseBytes: 200})
	ctx := t.Context()
	if _, err := e.s.Put(ctx, "app", "ok", "1", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if err := func() error {
		_, err := e.s.SetSchema(ctx, "typed", `{"type":"object","properties":{"port":{"type":"integer"},"name":{"type":"string"},"retries":{"type":"integer"}}}`)
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	before := e.rev(t)
	pub := func(ns string, ms ...configcenter.Mutation) error {
		_, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: ms})
		return err
	}
	cases := []struct {
		what     string
		err      error
		want     error
		problems int
	}{
		{"bad namespace", pub("a//b", configcenter.Mutation{Key: "k", Value: "v"}), configcenter.ErrInvalid, 0},
		{"namespace with ..", pub("a/../b", configcenter.Mutation{Key: "k", Value: "v"}), configcenter.ErrInvalid, 0},
		{"no changes", pub("app"), configcenter.ErrInvalid, 1},
		{"every problem at once", pub("app",
			configcenter.Mutation{Key: "bad key", Value: "v"},
			configcenter.Mutation{Key: "big", Value: strings.Repeat("x", 17)},
			configcenter.Mutation{Key: "utf", Value: "\xff"},
			configcenter.Mutation{Key: "utf", Value: "x"}), configcenter.ErrTooLarge, 5},
		{"release too large", pub("app",
			configcenter.Mutation{Key: "a", Value: strings.Repeat("x", 16)},
			configcenter.Mutation{Key: "b", Value: strings.Repeat("y", 16)},
			configcenter.Mutation{Key: "c", Value: strings.Repeat("z", 16)}), nil, 0},
		{"schema: wrong types, plain text a string", pub("typed",
			configcenter.Mutation{Key: "port", Value: `"80"`},
			configcenter.Mutation{Key: "name", Value: `web`}, // a string: fine
			configcenter.Mutation{Key: "retries", Value: `three`}), configcenter.ErrValidation, 2},
		{"compacted read", func() error { _, err := e.s.Snapshot(ctx, "app", 1); return err }(), nil, 0},
		{"future read", func() error { _, err := e.s.Snapshot(ctx, "app", 1<<40); return err }(), configcenter.ErrInvalid, 0},
		{"bad schema", func() error { _, err := e.s.SetSchema(ctx, "app", `{"type": 12}`); return err }(), configcenter.ErrInvalid, 0},
		{"schema the content breaks", func() error {
			_, err := e.s.SetSchema(ctx, "app", `{"type":"object","required":["port"]}`)
			return err
		}(), configcenter.ErrValidation, 1},
		{"schema with a remote ref", func() error {
			_, err := e.s.SetSchema(ctx, "app", `{"$ref":"https://example.com/s.json"}`)
			return err
		}(), configcenter.ErrInvalid, 0},
		{"rollback to a missing release", func() error { _, err := e.s.Rollback(ctx, "app", 7, 0, "", ""); return err }(), configcenter.ErrReleaseNotFound, 0},
	}
	// The release limit counts the record too: 48 bytes of values plus
	// their record exceed 200.
	cases[4].want = configcenter.ErrTooLarge
	for _, tc := range cases {
		if tc.what == "compacted read" {
			continue
		}
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.want)
			continue
		}
		var ve *configcenter.ValidationError
		if tc.problems > 0 && (!errors.As(tc.err, &ve) || len(ve.Problems()) != tc.problems) {
			t.Errorf("%s: %v: want %d problems", tc.what, tc.err, tc.problems)
		}
	}
	if e.rev(t) != before {
		t.Fatal("bad input wrote something")
	}
	if _, err := e.cli.Compact(ctx, before); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Snapshot(ctx, "app", 2); !errors.Is(err, configcenter.ErrCompacted) {
		t.Fatalf("Snapshot at a compacted revision = %v", err)
	}
}

func TestHistoryDiffRollback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{HistoryReleases: 3})
	ctx := t.Context()
	for _, ms := range [][]configcenter.Mutation{
		{{Key: "a", Value: "1"}, {Key: "b", Value: "1"}},
		{{Key: "a", Value: "2"}},
		{{Key: "b", Delete: true}, {Key: "c", Value: "3"}},
		{{Key: "a", Value: "4"}},
	} {
		if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "app", Mutations: ms, Author: "ana"}); err != nil {
			t.Fatal(err)
		}
	}
	rels, err := e.s.Releases(ctx, "app", 0, 10)
	if err != nil || len(rels) != 3 || rels[0].Number != 4 || rels[2].Number != 2 || rels[0].Author != "ana" {
		t.Fatalf("Releases = %+v, %v (want 4, 3, 2: three kept)", rels, err)
	}
	if page, _ := e.s.Releases(ctx, "app", 4, 1); len(page) != 1 || page[0].Number != 3 {
		t.Fatalf("Releases before 4 = %+v", page)
	}
	d, err := e.s.Diff(ctx, "app", 2, 4)
	want := []configcenter.Change{{Key: "a", Old: ptr("2"), New: ptr("4")}, {Key: "b", Old: ptr("1")}, {Key: "c", New: ptr("3")}}
	if err != nil || !sameChanges(d, want) {
		t.Fatalf("Diff 2..4 = %v, %v", d, err)
	}
	if _, err := e.s.Diff(ctx, "app", 0, 4); err != nil {
		t.Fatalf("Diff from the empty namespace: %v", err)
	}
	if _, err := e.s.Diff(ctx, "app", 1, 4); err != nil {
		t.Fatalf("Diff from release 1, rebuilt from the records of 2..4: %v", err)
	}
	dry, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "app", DryRun: true, Mutations: []configcenter.Mutation{{Key: "a", Value: "5"}}})
	if err != nil || dry.Number != 5 || dry.Revision != 0 || len(dry.Changes) != 1 {
		t.Fatalf("dry run = %+v, %v", dry, err)
	}
	r, err := e.s.Rollback(ctx, "app", 2, 0, "bo", "")
	if err != nil || r.Number != 5 || r.RollbackOf != 2 || !strings.Contains(r.Message, "rollback") {
		t.Fatalf("Rollback = %+v, %v", r, err)
	}
	snap, _ := e.s.Snapshot(ctx, "app", 0)
	if len(snap.Content) != 2 || snap.Content["a"] != "2" || snap.Content["b"] != "1" {
		t.Fatalf("content after rollback to 2 = %v", snap.Content)
	}
	// Release 2's record is gone now (3, 4, 5 are kept): 1 cannot be rebuilt.
	if _, err := e.s.Diff(ctx, "app", 1, 5); !errors.Is(err, configcenter.ErrReleaseNotFound) {
		t.Fatalf("Diff from a release beyond the history = %v", err)
	}
}

func sameChanges(a, b []configcenter.Change) bool {
	if len(a) != len(b) {
		return false
	}
	eq := func(x, y *string) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	for i := range a {
		if a[i].Key != b[i].Key || !eq(a[i].Old, b[i].Old) || !eq(a[i].New, b[i].New) {
			return false
		}
	}
	return true
}

var _ = context.Background

// TestReleasesPlannedOnACopyThatIsBehind: a release's first attempt plans
// on the member's own copy of the namespace, which may be behind. Nothing
// answered may rest on that copy: a change the copy already shows is still
// made, a schema the copy still has does not refuse, an expected revision
// is checked against the current state, and releases stay numbered without
// gaps.
func TestReleasesPlannedOnACopyThatIsBehind(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	const ns = "behind"
	strict := `{"type":"object","additionalProperties":{"type":"integer"}}`
	if _, err := e.s.SetSchema(ctx, ns, strict); err != nil {
		t.Fatal(err)
	}
	r1, err := e.s.Put(ctx, ns, "port", "80", 0, "ana", "")
	if err != nil || r1.Number != 1 {
		t.Fatalf("release 1 = %+v, %v", r1, err)
	}
	// From here on every first attempt sees release 1 under the strict
	// schema.
	configcenter.SetLocalCopyAt(e.s, r1.Revision)
	if _, err := e.s.SetSchema(ctx, ns, `{"type":"object"}`); err != nil {
		t.Fatal(err)
	}
	r2, err := e.s.Put(ctx, ns, "port", `"eighty"`, 0, "ana", "a value only the current schema allows")
	if err != nil || r2.Number != 2 {
		t.Fatalf("a put the stale schema refuses: %+v, %v; want release 2", r2, err)
	}
	r3, err := e.s.Put(ctx, ns, "port", "80", 0, "ana", "the value the copy still shows")
	if err != nil || r3.Number != 3 || len(r3.Changes) != 1 {
		t.Fatalf("a put of the copy's value = %+v, %v; want release 3 with one change", r3, err)
	}
	if _, err := e.s.Put(ctx, ns, "port", "81", r2.Revision, "ana", ""); !errors.Is(err, configcenter.ErrRevisionMismatch) {
		t.Fatalf("a put expecting release 2's revision after release 3: %v; want ErrRevisionMismatch", err)
	}
	r4, err := e.s.Put(ctx, ns, "port", "81", r3.Revision, "ana", "")
	if err != nil || r4.Number != 4 {
		t.Fatalf("a put expecting the current revision = %+v, %v; want release 4", r4, err)
	}
	same, err := e.s.Put(ctx, ns, "port", "81", 0, "ana", "")
	if err != nil || same.Number != 4 || len(same.Changes) != 0 || same.Revision != r4.Revision {
		t.Fatalf("a put of the current value = %+v, %v; want release 4 in effect, nothing changed", same, err)
	}
	if _, err := e.s.Delete(ctx, ns, "gone", 0, "ana", ""); !errors.Is(err, configcenter.ErrKeyNotFound) {
		t.Fatalf("deleting a missing key: %v", err)
	}
	snap, err := e.s.Snapshot(ctx, ns, 0)
	if err != nil || snap.Release != 4 || snap.Content["port"] != "81" {
		t.Fatalf("snapshot = %+v, %v; want release 4, port 81", snap, err)
	}
}

// Free text a person reads later in a terminal carries no control
// characters: an escape sequence in a release's author or message could
// clear an operator's screen, a carriage return or a bidi override redraw a
// line of `config history` ("release 99 by ops"). Messages keep newlines
// (and CRLF) and tabs; an author is one line. Refused with nothing written.
func TestFreeTextHasNoTerminalControls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	for _, c := range []struct{ author, message string }{
		{"mallory\x1b[2J", ""},
		{"ops", "fix\rrelease 99 by ops"},
		{"ops", "fix\x1b]0;title\x07"},
		{"ops", "fix \u202erevo"},
		{"ops\nrelease 99 by ops", ""},
		{"ops\tops", ""},
		{"ops", "\u009b2J"}, // C1 CSI
	} {
		before := e.rev(t)
		if _, err := e.s.Put(ctx, "texts", "k", "v", 0, c.author, c.message); !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "at byte") {
			t.Errorf("author %q, message %q: %v; want it refused", c.author, c.message, err)
		}
		if e.rev(t) != before {
			t.Fatalf("author %q, message %q: a refused release wrote something", c.author, c.message)
		}
	}
	if _, err := e.s.Put(ctx, "texts", "k", "v", 0, "Ann Ops", "two lines:\n\tindented\r\nand CRLF"); err != nil {
		t.Fatalf("a message with newlines, a tab and CRLF: %v", err)
	}
}
