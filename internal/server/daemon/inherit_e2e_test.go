package daemon_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// TestSharedNamespaceReachesEveryHeir: two heirs of one shared namespace,
// one overriding a key; each shared release reaches each heir's SDK
// subscriber as one change, numbered in the heir's releases and naming the
// shared release, with only the keys the heir does not override; REST
// shows where each value comes from.
func TestSharedNamespaceReachesEveryHeir(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	cc := newClient(t, d.GRPCAddr()).ConfigCenter()
	ctx := t.Context()
	o := clientlib.PublishOptions{}
	if _, err := cc.Publish(ctx, "common/db", []clientlib.ConfigMutation{{Key: "host", Value: "db1"}, {Key: "port", Value: "5432"}}, o); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Put(ctx, "app/b", "host", "db-b", o); err != nil {
		t.Fatal(err)
	}
	for _, heir := range []string{"app/a", "app/b"} {
		if r, err := cc.Inherit(ctx, heir, "common/db", o); err != nil || r.InheritedFrom != "common/db" {
			t.Fatalf("Inherit(%s) = %+v, %v", heir, r, err)
		}
	}
	type seen struct {
		release int64
		keys    []string
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	subs := map[string]*clientlib.Subscription{}
	for _, heir := range []string{"app/a", "app/b"} {
		sub, err := cc.Subscribe(ctx, []string{heir}, clientlib.WithStartTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		subs[heir] = sub
		sub.OnNamespace(heir, func(ch clientlib.ConfigUpdate) {
			mu.Lock()
			defer mu.Unlock()
			var keys []string
			for _, k := range ch.Keys {
				keys = append(keys, k.Key)
			}
			got[heir] = append(got[heir], seen{ch.Release, keys})
		})
	}
	shared, err := cc.Publish(ctx, "common/db", []clientlib.ConfigMutation{{Key: "host", Value: "db2"}, {Key: "port", Value: "6000"}}, o)
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "both heirs' subscribers' callbacks to get the shared release", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["app/a"]) > 0 && len(got["app/b"]) > 0
	})
	mu.Lock()
	if a := got["app/a"]; len(a) != 1 || a[0].release != 2 || strings.Join(a[0].keys, ",") != "host,port" {
		t.Errorf("app/a's subscriber saw %+v, want one change, release 2, of host and port", a)
	}
	if b := got["app/b"]; len(b) != 1 || b[0].release != 3 || strings.Join(b[0].keys, ",") != "port" {
		t.Errorf("app/b's subscriber saw %+v, want one change, release 3, of port (host is its own)", b)
	}
	mu.Unlock()
	if v, _ := subs["app/b"].Snapshot().Get("app/b", "host"); v != "db-b" {
		t.Errorf("app/b's override became %q", v)
	}
	for heir, n := range map[string]int64{"app/a": 2, "app/b": 3} {
		rels, err := cc.Releases(ctx, heir, 0, 1)
		if err != nil || rels[0].Number != n || rels[0].InheritedFrom != "common/db" || rels[0].InheritedRelease != shared.Number {
			t.Errorf("%s's last release = %+v, %v; want %d carrying common/db release %d", heir, rels, err, n, shared.Number)
		}
	}
	code, body := httpAs(t, "GET", "http://"+d.HTTPAddr()+"/v1/config:snapshot?namespace=app%2Fb", "", "")
	var rest struct {
		Snapshot struct {
			Inherits string
			Entries  []struct {
				Key, Value string
				Inherited  bool
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &rest); err != nil || code != 200 {
		t.Fatalf("REST snapshot: %d %s", code, body)
	}
	from := map[string]bool{}
	for _, e := range rest.Snapshot.Entries {
		from[e.Key+"="+e.Value] = e.Inherited
	}
	if inh, ok := from["port=6000"]; rest.Snapshot.Inherits != "common/db" || !ok || !inh || from["host=db-b"] || len(from) != 2 {
		t.Errorf("REST snapshot: %s", body)
	}
	if _, err := cc.Delete(ctx, "app/a", "host", o); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Errorf("deleting an inherited key = %v", err)
	}
}

// TestInheritingNeedsReadingTheShared: making a namespace show another's
// content needs config.read on that one.
func TestInheritingNeedsReadingTheShared(t *testing.T) {
	t.Parallel()
	d := start(t, authConfig(t, `
rules:
  - principals: [alice]
    actions: [config.admin, config.read, config.write]
    namespaces: ["a/*"]
  - principals: [root]
    actions: [config.read, config.write]
    namespaces: ["*"]
`))
	ctx := t.Context()
	if _, err := newClientWithToken(t, d.GRPCAddr(), "root").ConfigCenter().Put(ctx, "secret-team/db", "host", "x", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	alice := newClientWithToken(t, d.GRPCAddr(), "alice").ConfigCenter()
	if _, err := alice.Inherit(ctx, "a/app", "secret-team/db", clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("inheriting from a namespace alice may not read = %v", err)
	}
	if _, err := alice.Inherit(ctx, "a/app", "a/common", clientlib.PublishOptions{}); err != nil {
		t.Fatalf("inheriting from one she may read: %v", err)
	}
}

// TestConsoleShowsWhereValuesComeFrom: an heir's snapshot tab names its
// shared namespace and marks each value inherited or own, also after a
// shared release and after an override is deleted.
func TestConsoleShowsWhereValuesComeFrom(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	cc := newClient(t, d.GRPCAddr()).ConfigCenter()
	ctx := t.Context()
	o := clientlib.PublishOptions{}
	if _, err := cc.Publish(ctx, "common/db", []clientlib.ConfigMutation{{Key: "host", Value: "db1"}, {Key: "pool", Value: "10"}}, o); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Put(ctx, "web/prod", "pool", "99", o); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Inherit(ctx, "web/prod", "common/db", o); err != nil {
		t.Fatal(err)
	}
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")
	p.open("#/config/web/prod")
	p.see("main", "Inherits from common/db")
	rowIs := func(key, text string) {
		t.Helper()
		p.until(key+" "+text, fmt.Sprintf(`(() => [...document.querySelectorAll('main tr')].some((r) => r.innerText.startsWith(%q) && r.innerText.includes(%q)))()`, key, text))
	}
	rowIs("host", "common/db")
	rowIs("pool", "own")
	p.screenshot("config-inherits")
	if _, err := cc.Put(ctx, "common/db", "host", "db2", o); err != nil {
		t.Fatal(err)
	}
	rowIs("host", "db2")
	if _, err := cc.Delete(ctx, "web/prod", "pool", o); err != nil {
		t.Fatal(err)
	}
	rowIs("pool", "10")
	rowIs("pool", "common/db")
}

// TestRevokedReadRightStopsTheInheritance: the right to read the shared
// namespace, checked when alice makes her namespace inherit, is checked
// again at every shared release: once the policy no longer gives it to
// her, later shared releases stop reaching her heir (whose readers, like
// bob, need no right on the shared namespace), and the heir says why;
// given back, the heir catches up. Before, the right was checked once and
// the releases kept flowing.
func TestRevokedReadRightStopsTheInheritance(t *testing.T) {
	t.Parallel()
	const policy = `
rules:
  - principals: [alice]
    actions: [config.admin, config.read, config.write]
    namespaces: ["a/*"%s]
  - principals: [bob]
    actions: [config.read]
    namespaces: ["a/app"]
  - principals: [root]
    actions: [config.read, config.write]
    namespaces: ["*"]
`
	cfg := authConfig(t, fmt.Sprintf(policy, `, "team/db"`))
	d := start(t, cfg)
	ctx := t.Context()
	root := newClientWithToken(t, d.GRPCAddr(), "root").ConfigCenter()
	alice := newClientWithToken(t, d.GRPCAddr(), "alice").ConfigCenter()
	bob := newClientWithToken(t, d.GRPCAddr(), "bob").ConfigCenter()
	o := clientlib.PublishOptions{}
	if _, err := root.Put(ctx, "team/db", "host", "db-1", o); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Inherit(ctx, "a/app", "team/db", o); err != nil {
		t.Fatal(err)
	}
	hostFor := func(who *clientlib.ConfigCenter) (string, clientlib.NamespaceSnapshot) {
		s, err := who.Snapshot(ctx, "a/app", 0)
		if err != nil {
			t.Fatal(err)
		}
		return s.Values["host"], s
	}
	if _, err := root.Put(ctx, "team/db", "host", "db-2", o); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 30*time.Second, "the shared release to reach the heir", func() bool { h, _ := hostFor(bob); return h == "db-2" })

	writePolicy := func(extra string) {
		if err := os.WriteFile(cfg.PolicyFile, []byte(fmt.Sprintf(policy, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := d.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	writePolicy("") // alice may no longer read team/db
	if _, err := root.Put(ctx, "team/db", "host", "db-3-secret", o); err != nil {
		t.Fatal(err)
	}
	// The catch-up runs every 2 s on every member: once it ran, the heir
	// records the suspension and still shows db-2.
	wait.Within(t, 30*time.Second, "the heir to say its inheritance is suspended", func() bool {
		_, s := hostFor(bob)
		return strings.Contains(s.InheritanceSuspended, "alice may no longer read")
	})
	if _, err := root.Put(ctx, "team/db", "port", "5432", o); err != nil { // and one more, for good measure
		t.Fatal(err)
	}
	if _, err := alice.Put(ctx, "a/app", "own", "1", o); err != nil { // an heir's own release carries nothing either
		t.Fatal(err)
	}
	if h, s := hostFor(bob); h != "db-2" || s.Values["port"] != "" || s.Values["own"] != "1" {
		t.Fatalf("bob reads host %q, port %q, own %q after alice lost the right; want db-2, nothing, 1", h, s.Values["port"], s.Values["own"])
	}

	writePolicy(`, "team/db"`) // given back
	wait.Within(t, 30*time.Second, "the heir to catch up", func() bool {
		h, s := hostFor(bob)
		return h == "db-3-secret" && s.Values["port"] == "5432" && s.InheritanceSuspended == ""
	})
}
