package configcenter_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// follower applies a subscription's events to the content it believes in,
// and records every value it was ever given.
type follower struct {
	t    *testing.T
	name string

	mu      sync.Mutex
	rev     int64
	content map[string]string
	release int64
	gray    int64
	seen    map[string]bool // every value ever received
	events  []configcenter.Event
}

func follow(t *testing.T, c *configcenter.Cache, name string, who *configcenter.Identity, ns string) *follower {
	t.Helper()
	sub, err := c.SubscribeAs(t.Context(), []string{ns}, 0, who)
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{t: t, name: name, content: map[string]string{}, seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				return
			}
			f.apply(ev)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; sub.Close() })
	return f
}

func (f *follower) apply(ev configcenter.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev = ev.Revision
	switch ev.Type {
	case configcenter.EventSnapshot:
		s := ev.Snapshots[0]
		f.content, f.release, f.gray = maps.Clone(s.Content), s.Release, s.Gray
		for _, v := range s.Content {
			f.seen[v] = true
		}
	case configcenter.EventChange:
		if ev.Release.Number != f.release+1 {
			f.t.Errorf("%s: release %d after %d", f.name, ev.Release.Number, f.release)
		}
		f.release, f.gray = ev.Release.Number, ev.Gray
		for _, ch := range ev.Release.Changes {
			if ch.New == nil {
				delete(f.content, ch.Key)
			} else {
				f.content[ch.Key] = *ch.New
				f.seen[*ch.New] = true
			}
		}
	default:
		return
	}
	f.events = append(f.events, ev)
}

// state returns what the follower holds, as "key=value ..." sorted, with
// its release and gray.
func (f *follower) state() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(f.content)) {
		fmt.Fprintf(&b, "%s=%s ", k, f.content[k])
	}
	return fmt.Sprintf("%sr%d g%d", b.String(), f.release, f.gray)
}

func (f *follower) seenValue(v string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[v]
}

func (f *follower) waitFor(t *testing.T, want string) {
	t.Helper()
	wait.For(t, f.name+" to hold "+want, func() bool { return f.state() == want })
}

// eventsAfter returns the events received after revision rev.
func (f *follower) eventsAfter(rev int64) []configcenter.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []configcenter.Event
	for _, ev := range f.events {
		if ev.Revision > rev {
			out = append(out, ev)
		}
	}
	return out
}

// TestGrayReleases: matching instances see a gray's overrides through the
// same events, others never do; normal releases reach both; update,
// promote and abandon each switch every subscriber at one revision.
func TestGrayReleases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	c := e.startCache(t, configcenter.CacheOptions{})
	const ns = "shop/web"
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{
		{Key: "a", Value: "1"}, {Key: "b", Value: "1"}, {Key: "flag", Value: "off"},
	}}); err != nil {
		t.Fatal(err)
	}
	canary := follow(t, c, "canary", &configcenter.Identity{Instance: "c1"}, ns)
	eu := follow(t, c, "eu", &configcenter.Identity{Instance: "x1", Labels: map[string]string{"zone": "eu", "v": "2"}}, ns)
	us := follow(t, c, "us", &configcenter.Identity{Instance: "o1", Labels: map[string]string{"zone": "us"}}, ns)
	anon := follow(t, c, "anonymous", nil, ns)
	plain := "a=1 b=1 flag=off r1 g0"
	for _, f := range []*follower{canary, eu, us, anon} {
		f.waitFor(t, plain)
	}

	// Create: the canary by id and the eu instance by label.
	g, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: ns, Author: "ops", Message: "try flag",
		Selector:  &configcenter.GraySelector{Instances: []string{"c1"}, Labels: map[string]string{"zone": "eu"}},
		Mutations: []configcenter.Mutation{{Key: "flag", Value: "on"}, {Key: "b", Delete: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Number != 1 || g.Base != 1 || len(g.Changes) != 2 {
		t.Fatalf("created %+v", g)
	}
	canary.waitFor(t, "a=1 flag=on r1 g1")
	eu.waitFor(t, "a=1 flag=on r1 g1")
	if _, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: ns, Selector: &configcenter.GraySelector{Percent: 5},
		Mutations: []configcenter.Mutation{{Key: "x", Value: "y"}}}); !errors.Is(err, configcenter.ErrGrayRunning) {
		t.Fatalf("a second gray: %v, want ErrGrayRunning", err)
	}

	// A normal release reaches everyone; the overridden key keeps its
	// gray value for the gray's instances.
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{
		{Key: "a", Value: "2"}, {Key: "flag", Value: "off2"},
	}}); err != nil {
		t.Fatal(err)
	}
	canary.waitFor(t, "a=2 flag=on r2 g1")
	eu.waitFor(t, "a=2 flag=on r2 g1")
	us.waitFor(t, "a=2 b=1 flag=off2 r2 g0")
	anon.waitFor(t, "a=2 b=1 flag=off2 r2 g0")

	// Update: only the canary now; the eu instance returns to normal.
	up, err := e.s.UpdateGray(ctx, configcenter.GrayRequest{Namespace: ns, Expected: 1, Selector: &configcenter.GraySelector{Instances: []string{"c1"}}})
	if err != nil {
		t.Fatal(err)
	}
	canary.waitFor(t, "a=2 flag=on r2 g2")
	eu.waitFor(t, "a=2 b=1 flag=off2 r2 g0")
	if _, err := e.s.UpdateGray(ctx, configcenter.GrayRequest{Namespace: ns, Expected: 1, Selector: &configcenter.GraySelector{Percent: 1}}); !errors.Is(err, configcenter.ErrGrayNotFound) {
		t.Fatalf("updating gray 1 after it became 2: %v, want ErrGrayNotFound", err)
	}

	// A resume of an identified subscriber while the gray runs gets a
	// snapshot with the overrides, not the normal releases since.
	resumed, err := c.SubscribeAs(ctx, []string{ns}, up.Revision-3, &configcenter.Identity{Instance: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := resumed.Next(ctx)
	resumed.Close()
	if err != nil || ev.Type != configcenter.EventSnapshot || ev.Snapshots[0].Content["flag"] != "on" || ev.Snapshots[0].Gray != 2 {
		t.Fatalf("resume with a gray running: %+v, %v; want a snapshot with flag=on, gray 2", ev, err)
	}

	for _, f := range []*follower{us, anon} {
		if f.seenValue("on") {
			t.Errorf("%s was given the gray's value before the promote", f.name)
		}
	}

	// Promote: one transaction; nothing changes for the canary, the rest
	// get the gray's changes in one event at the promote's revision.
	before := e.rev(t)
	pg, rel, err := e.s.PromoteGray(ctx, ns, 2, "ops", "")
	if err != nil {
		t.Fatal(err)
	}
	if rel.Number != 3 || rel.PromotedGray != 2 || pg.PromotedTo != 3 || pg.Number != 3 || pg.Revision != rel.Revision {
		t.Fatalf("promote: gray %+v, release %+v", pg, rel)
	}
	promoted := "a=2 flag=on r3 g0"
	for _, f := range []*follower{canary, eu, us, anon} {
		f.waitFor(t, promoted)
		evs := f.eventsAfter(before)
		if len(evs) != 1 || evs[0].Revision != rel.Revision {
			t.Errorf("%s got %d events for the promote (want one at revision %d): %+v", f.name, len(evs), rel.Revision, evs)
		}
	}
	if _, err := e.s.CurrentGray(ctx, ns); !errors.Is(err, configcenter.ErrGrayNotFound) {
		t.Fatalf("after the promote: %v, want ErrGrayNotFound", err)
	}

	// Abandon: the canary returns to the normal content in one event.
	if _, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: ns, Selector: &configcenter.GraySelector{Instances: []string{"c1"}},
		Mutations: []configcenter.Mutation{{Key: "a", Value: "canary-only"}}}); err != nil {
		t.Fatal(err)
	}
	canary.waitFor(t, "a=canary-only flag=on r3 g4")
	before = e.rev(t)
	ab, err := e.s.AbandonGray(ctx, ns, 0, "ops", "bad idea")
	if err != nil {
		t.Fatal(err)
	}
	canary.waitFor(t, promoted)
	if evs := canary.eventsAfter(before); len(evs) != 1 || evs[0].Revision != ab.Revision {
		t.Errorf("canary got %d events for the abandon (want one at %d): %+v", len(evs), ab.Revision, evs)
	}

	// Nobody outside the selection was ever given a gray value.
	for _, f := range []*follower{us, anon, eu} {
		if f.seenValue("canary-only") {
			t.Errorf("%s was given the canary's value", f.name)
		}
	}

	// History and diff include the gray releases.
	hist, err := e.s.GrayReleases(ctx, ns, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, h := range hist {
		actions = append(actions, fmt.Sprintf("%d:%s", h.Number, h.Action))
	}
	if got := strings.Join(actions, " "); got != "5:abandon 4:create 3:promote 2:update 1:create" {
		t.Fatalf("gray history: %s", got)
	}
	d, err := e.s.DiffRefs(ctx, ns, configcenter.Ref{Number: 1}, configcenter.Ref{Number: 1, Gray: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 2 || d[0].Key != "b" || d[0].New != nil || d[1].Key != "flag" || *d[1].New != "on" {
		t.Fatalf("diff release 1 -> gray 1: %+v", d)
	}
}

// TestGrayValidation: bad selectors and content that breaks the schema
// change nothing.
func TestGrayValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	const ns = "v"
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{{Key: "port", Value: "80"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetSchema(ctx, ns, `{"type":"object","properties":{"port":{"type":"integer"}}}`); err != nil {
		t.Fatal(err)
	}
	set := []configcenter.Mutation{{Key: "port", Value: "81"}}
	for _, tc := range []struct {
		name string
		req  configcenter.GrayRequest
		want error
	}{
		{"no selector", configcenter.GrayRequest{Selector: &configcenter.GraySelector{}, Mutations: set}, configcenter.ErrInvalid},
		{"percent over 100", configcenter.GrayRequest{Selector: &configcenter.GraySelector{Percent: 101}, Mutations: set}, configcenter.ErrInvalid},
		{"bad instance", configcenter.GrayRequest{Selector: &configcenter.GraySelector{Instances: []string{"a b"}}, Mutations: set}, configcenter.ErrInvalid},
		{"no changes", configcenter.GrayRequest{Selector: &configcenter.GraySelector{Percent: 10}, Mutations: []configcenter.Mutation{}}, configcenter.ErrInvalid},
		{"schema", configcenter.GrayRequest{Selector: &configcenter.GraySelector{Percent: 10}, Mutations: []configcenter.Mutation{{Key: "port", Value: `"eighty"`}}}, configcenter.ErrValidation},
	} {
		tc.req.Namespace = ns
		if _, err := e.s.CreateGray(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := e.s.CurrentGray(ctx, ns); !errors.Is(err, configcenter.ErrGrayNotFound) {
		t.Fatalf("after refused creates: %v", err)
	}
	if _, err := e.s.AbandonGray(ctx, ns, 0, "", ""); !errors.Is(err, configcenter.ErrGrayNotFound) {
		t.Fatalf("abandon with none running: %v", err)
	}
	// With a gray running, a normal release or a schema that its content
	// would break is refused too.
	if _, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: ns, Selector: &configcenter.GraySelector{Percent: 10},
		Mutations: []configcenter.Mutation{{Key: "extra", Value: "1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetSchema(ctx, ns, `{"type":"object","properties":{"extra":{"type":"string"}}}`); !errors.Is(err, configcenter.ErrValidation) {
		t.Fatalf("a schema the gray's content breaks: %v", err)
	}
	if _, err := e.s.SetSchema(ctx, ns, `{"type":"object","properties":{"port":{"type":"integer"}},"additionalProperties":{"type":"integer"}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{{Key: "other", Value: `"x"`}}}); !errors.Is(err, configcenter.ErrValidation) {
		t.Fatalf("a normal release that breaks the schema: %v", err)
	}
}

// TestGrayPercentIsStableAndProportionate: a percentage selects about that
// share of instances, and raising it only adds instances.
func TestGrayPercentIsStableAndProportionate(t *testing.T) {
	t.Parallel()
	const n = 20000
	ten, twenty := configcenter.GraySelector{Percent: 10}, configcenter.GraySelector{Percent: 20}
	in10, in20 := 0, 0
	for i := range n {
		who := &configcenter.Identity{Instance: fmt.Sprintf("web-%d", i)}
		a, b := ten.Matches("ns", who), twenty.Matches("ns", who)
		if a && !b {
			t.Fatalf("%s is in 10%% but not in 20%%", who.Instance)
		}
		if a {
			in10++
		}
		if b {
			in20++
		}
	}
	if in10 < n*8/100 || in10 > n*12/100 || in20 < n*18/100 || in20 > n*22/100 {
		t.Fatalf("10%% selected %d of %d, 20%% selected %d", in10, n, in20)
	}
	if (configcenter.GraySelector{Percent: 100}).Matches("ns", nil) {
		t.Fatal("an anonymous subscriber matched")
	}
}
