package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// grayApp is one subscribed instance: it records every value its
// callbacks and snapshots were ever given.
type grayApp struct {
	name string
	sub  *clientlib.Subscription
	ns   string

	mu   sync.Mutex
	seen map[string]bool
}

func newGrayApp(t *testing.T, c *clientlib.Client, ns, instance string, labels map[string]string) *grayApp {
	t.Helper()
	sub, err := c.ConfigCenter().Subscribe(t.Context(), []string{ns}, append(fast, clientlib.WithInstance(instance, labels))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	a := &grayApp{name: instance, sub: sub, ns: ns, seen: map[string]bool{}}
	a.record(sub.Snapshot())
	sub.OnNamespace(ns, func(ch clientlib.ConfigUpdate) { a.record(ch.Snapshot) })
	return a
}

func (a *grayApp) record(s *clientlib.ConfigSnapshot) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, v := range s.Values(a.ns) {
		a.seen[v] = true
	}
}

func (a *grayApp) saw(v string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[v]
}

// holds waits until the app's snapshot has key=value under gray release
// gray (0: none).
func (a *grayApp) holds(t *testing.T, key, value string, gray int64) {
	t.Helper()
	wait.Within(t, 15*time.Second, fmt.Sprintf("%s to hold %s=%s with gray %d", a.name, key, value, gray), func() bool {
		s := a.sub.Snapshot()
		a.record(s)
		v, _ := s.Get(a.ns, key)
		return v == value && s.Gray(a.ns) == gray
	})
}

// TestGrayReleaseEndToEnd: a gray release created over REST reaches the
// SDK subscribers it selects (by instance and by label; two subscriptions
// of one client with different identities included) and no other; the
// applied status shows who runs it and who rejected it; it survives a
// daemon restart and normal releases; promote and abandon reach everyone;
// history and diff include it.
func TestGrayReleaseEndToEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts etcd and the daemon")
	}
	cfg := configTestConfig(t)
	cfg.GRPCAddr, cfg.HTTPAddr = freeport.Addr(t), freeport.Addr(t) // kept across the restart
	ctx := t.Context()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	base := "http://" + cfg.HTTPAddr
	admin := newClient(t, cfg.GRPCAddr)
	const ns = "shop/checkout"
	if _, err := admin.ConfigCenter().Publish(ctx, ns, []clientlib.ConfigMutation{
		{Key: "flag", Value: `"off"`}, {Key: "timeout", Value: `"5s"`}, {Key: "retries", Value: "3"},
	}, clientlib.PublishOptions{Author: "ops"}); err != nil {
		t.Fatal(err)
	}

	shared, other := newClient(t, cfg.GRPCAddr), newClient(t, cfg.GRPCAddr)
	canary := newGrayApp(t, shared, ns, "pod-1", map[string]string{"zone": "us"}) // selected by id
	plain := newGrayApp(t, shared, ns, "pod-2", map[string]string{"zone": "us"})  // not selected
	eu := newGrayApp(t, other, ns, "pod-3", map[string]string{"zone": "eu"})      // selected by label
	// pod-4 is selected too, but refuses flag "on".
	picky := newGrayApp(t, other, ns, "pod-4", map[string]string{"zone": "eu"})
	type flags struct {
		Flag string `json:"flag"`
	}
	bound, err := clientlib.Bind(picky.sub, ns, clientlib.JSON, clientlib.BindValidate(func(f flags) error {
		if f.Flag == "on" {
			return errors.New("flag on is not supported here")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}

	r := call(t, "POST", base+"/v1/config:createGray", `{"namespace":"`+ns+`","author":"ana","message":"try the flag",
		"selector":{"instances":["pod-1"],"labels":{"zone":"eu"}},"overrides":[{"key":"flag","value":"\"on\""}]}`)
	if r.status != 200 || r.body["gray"].(map[string]any)["number"] != "1" || r.body["gray"].(map[string]any)["action"] != "GRAY_ACTION_CREATE" {
		t.Fatalf("createGray = %d %v", r.status, r.body)
	}
	canary.holds(t, "flag", `"on"`, 1)
	eu.holds(t, "flag", `"on"`, 1)
	picky.holds(t, "flag", `"on"`, 1)
	plain.holds(t, "flag", `"off"`, 0)
	if got := bound.Load().Flag; got != "off" {
		t.Fatalf("the binding that refuses the gray holds %q", got)
	}
	if r := call(t, "POST", base+"/v1/config:createGray", `{"namespace":"`+ns+`","selector":{"percent":10},"overrides":[{"key":"x","value":"1"}]}`); r.status != http.StatusBadRequest || reason(r) != "REVISION_MISMATCH" {
		t.Fatalf("a second gray = %d %v, want FailedPrecondition (REVISION_MISMATCH)", r.status, r.body)
	}

	// Who runs it, who refused it.
	wait.Within(t, 15*time.Second, "the applied status to show the gray", func() bool {
		st, err := admin.ConfigCenter().AppliedStatus(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		by := map[string]clientlib.InstanceApplyStatus{}
		for _, in := range st.Instances {
			by[in.Instance] = in
		}
		return st.AppliedGray[1] == 2 && st.RejectedGray[1] == 1 &&
			by["pod-1"].AppliedGray == 1 && by["pod-3"].AppliedGray == 1 && by["pod-2"].AppliedGray == 0 && by["pod-2"].Applied == 1 &&
			by["pod-4"].RejectedGray == 1 && by["pod-4"].Reason != ""
	})

	// A normal release reaches everyone; the gray's key stays overridden.
	if _, err := admin.ConfigCenter().Publish(ctx, ns, []clientlib.ConfigMutation{{Key: "timeout", Value: `"10s"`}, {Key: "flag", Value: `"off2"`}}, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	canary.holds(t, "timeout", `"10s"`, 1)
	canary.holds(t, "flag", `"on"`, 1)
	plain.holds(t, "flag", `"off2"`, 0)

	// Restart the daemon: the subscriptions resume with the right content.
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, err = daemon.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ConfigCenter().Put(ctx, ns, "retries", "4", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	canary.holds(t, "retries", "4", 1)
	canary.holds(t, "flag", `"on"`, 1)
	eu.holds(t, "retries", "4", 1)
	plain.holds(t, "retries", "4", 0)
	plain.holds(t, "flag", `"off2"`, 0)
	late := newGrayApp(t, newClient(t, cfg.GRPCAddr), ns, "pod-1", nil)
	late.holds(t, "flag", `"on"`, 1)

	// REST: the running gray, and a watch as an instance.
	if r := call(t, "GET", base+"/v1/config:gray?namespace="+url.QueryEscape(ns), ""); r.status != 200 || r.body["gray"].(map[string]any)["number"] != "1" {
		t.Fatalf("GET config:gray = %d %v", r.status, r.body)
	}
	restFlag := func(query string) (string, string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
		defer cancel()
		req, _ := http.NewRequestWithContext(wctx, "GET", base+"/v1/config:watch?namespaces="+url.QueryEscape(ns)+query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		line := bufio.NewScanner(resp.Body)
		if !line.Scan() {
			t.Fatalf("REST watch%s: no line (%d)", query, resp.StatusCode)
		}
		var m struct {
			Result struct {
				Snapshots []struct {
					Gray    string `json:"gray"`
					Entries []struct{ Key, Value string }
				}
			}
		}
		if err := json.Unmarshal(line.Bytes(), &m); err != nil || len(m.Result.Snapshots) != 1 {
			t.Fatalf("REST watch%s: %q: %v", query, line.Text(), err)
		}
		for _, e := range m.Result.Snapshots[0].Entries {
			if e.Key == "flag" {
				return e.Value, m.Result.Snapshots[0].Gray
			}
		}
		return "", m.Result.Snapshots[0].Gray
	}
	if v, g := restFlag("&instance=pod-9&labels%5Bzone%5D=eu"); v != `"on"` || g != "1" {
		t.Fatalf("REST watch as a matching instance: flag %s, gray %s", v, g)
	}
	if v, g := restFlag(""); v != `"off2"` || g != "0" {
		t.Fatalf("REST watch without an instance: flag %s, gray %s", v, g)
	}

	// Nobody else was ever given the gray's value.
	if plain.saw(`"on"`) {
		t.Fatal("pod-2 was given the gray's value")
	}

	// Promote: everyone runs it, as a normal release.
	pg, rel, err := admin.ConfigCenter().PromoteGray(ctx, ns, clientlib.GrayOptions{ExpectedGray: 1, Author: "ana"})
	if err != nil {
		t.Fatal(err)
	}
	if rel.PromotedGray != 1 || pg.PromotedTo != rel.Number || pg.Action != "promote" {
		t.Fatalf("promote: %+v, %+v", pg, rel)
	}
	for _, a := range []*grayApp{canary, plain, eu, late} {
		a.holds(t, "flag", `"on"`, 0)
	}
	if _, err := admin.ConfigCenter().Gray(ctx, ns); !errors.Is(err, clientlib.ErrReleaseNotFound) {
		t.Fatalf("the gray after its promote: %v, want ErrReleaseNotFound", err)
	}

	// Abandon: a gray for pod-2 only, then its end.
	if _, err := admin.ConfigCenter().CreateGray(ctx, ns, clientlib.GraySelector{Instances: []string{"pod-2"}},
		[]clientlib.ConfigMutation{{Key: "retries", Value: "9"}}, clientlib.GrayOptions{}); err != nil {
		t.Fatal(err)
	}
	plain.holds(t, "retries", "9", 3)
	if _, err := admin.ConfigCenter().AbandonGray(ctx, ns, clientlib.GrayOptions{Message: "too many"}); err != nil {
		t.Fatal(err)
	}
	plain.holds(t, "retries", "4", 0)
	for _, a := range []*grayApp{canary, eu, picky, late} {
		if a.saw("9") {
			t.Fatalf("%s was given the second gray's value", a.name)
		}
	}

	// History and diff include the gray releases.
	hist, err := admin.ConfigCenter().GrayReleases(ctx, ns, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 4 || hist[0].Action != "abandon" || hist[1].Action != "create" || hist[2].Action != "promote" || hist[3].Action != "create" {
		t.Fatalf("gray history: %+v", hist)
	}
	changes, err := admin.ConfigCenter().DiffGray(ctx, ns, 1, false, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0].Key != "flag" || *changes[0].New != `"on"` {
		t.Fatalf("diff release 1 -> gray 1: %+v", changes)
	}
}
