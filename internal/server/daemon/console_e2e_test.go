package daemon_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/trends"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// The web console, end to end: a real daemon, Debian's Chromium driven
// headless through chromedp, the SDK on the other side. Each step waits for
// what a user would see, without reloading the page. Screenshots of every
// page go to $COORDD_SCREENSHOTS (make screenshots sets it), else to a
// temporary folder.

// browser starts a headless Chromium for the test. Without one installed
// the test is skipped, unless COORDD_REQUIRE_TOOLS is set (CI installs it).
func browser(t *testing.T) context.Context {
	t.Helper()
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		if os.Getenv("COORDD_REQUIRE_TOOLS") != "" {
			t.Fatal("Chromium is not installed (apt-get install chromium) and COORDD_REQUIRE_TOOLS is set")
		}
		t.Skip("Chromium is not installed (apt-get install chromium): the console's browser tests need it")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
		// This machine's network is closed: no background calls home.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser to exit
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium (%s): %v", bin, err)
	}
	return ctx
}

// page is a browser tab on one daemon's console.
type page struct {
	t    *testing.T
	ctx  context.Context
	base string // http://host:port/ui/
	dir  string // screenshots
}

// openConsole opens a tab on the console at base (".../ui/").
func openConsole(t *testing.T, base string) *page {
	dir := os.Getenv("COORDD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &page{t: t, ctx: browser(t), base: base, dir: dir}
}

func (p *page) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, wait.Bound(20*time.Second))
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		body, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.querySelector('main')?.innerText ?? ''`))
		p.t.Fatalf("%s: %v\nthe page shows:\n%s", what, err, body)
	}
}

// until waits for a JavaScript expression to be true.
func (p *page) until(what, js string) {
	p.t.Helper()
	p.run(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second)))
}

// open goes to a console route (a hash such as "#/locks/x") and waits for
// the view's heading.
func (p *page) open(route string) {
	p.t.Helper()
	p.run("open "+route, chromedp.Navigate(p.base+route), chromedp.WaitVisible(chromedp.CSS(`main h1`)))
}

// see waits until the text of the first element matching selector
// contains want (the page updates itself: no reload).
func (p *page) see(selector, want string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => { const el = document.querySelector(%q); return !!el && el.innerText.includes(%q); })()`, selector, want)
	p.until(fmt.Sprintf("see %q in %s", want, selector), js)
}

// gone waits until no element matching selector contains text.
func (p *page) gone(selector, text string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => ![...document.querySelectorAll(%q)].some((el) => el.innerText.includes(%q)))()`, selector, text)
	p.until(fmt.Sprintf("no %q in %s", text, selector), js)
}

// clickRow clicks the button labelled label in the table row that
// contains text.
func (p *page) clickRow(text, label string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => {
		const row = [...document.querySelectorAll('main tr')].find((r) => r.innerText.includes(%q));
		const b = row && [...row.querySelectorAll('button')].find((b) => b.innerText.startsWith(%q));
		if (b) b.click();
		return !!b;
	})()`, text, label)
	p.until(fmt.Sprintf("click %q in the row of %q", label, text), js)
}

// confirm presses the open dialog's confirming button.
func (p *page) confirm() {
	p.t.Helper()
	p.run("confirm the dialog", chromedp.WaitVisible(chromedp.CSS(`dialog[open] button[value="ok"]`)), chromedp.Click(chromedp.CSS(`dialog[open] button[value="ok"]`)))
}

func (p *page) screenshot(name string) {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

func TestConsole(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Trends = trends.Options{Every: 200 * time.Millisecond, Points: 600} // charts drawn within the test's waits
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")

	a, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("billing-1"), clientlib.WithLabels(map[string]string{"zone": "a"}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("billing-2"))
	if err != nil {
		t.Fatal(err)
	}

	// Overview: the member, its role and health, live counts.
	p.open("#/")
	p.see("main table", "leader")
	p.see("#whoami", "open: no policy")
	p.see("main table", "healthy")
	p.see(`[data-metric="coordd_sessions"]`, "2")
	p.see(`figure.chart[data-series="sessions"] figcaption`, "2")
	p.screenshot("overview")

	// Locks: a holder appears without a reload, a waiter queues behind it,
	// and is promoted when the holder releases.
	p.open("#/locks/orders/42")
	p.see("main", "Nobody holds it.")
	la, err := a.Lock(ctx, "orders/42", clientlib.WithMetadata("job 9"))
	if err != nil {
		t.Fatal(err)
	}
	p.see("main table", a.ID())
	p.see("main table", "job 9")
	var lb *clientlib.Lock
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if lb, err = b.Lock(ctx, "orders/42"); err != nil {
			t.Errorf("b.Lock: %v", err)
		}
	}()
	p.see("main", "Waiters, in the order they will be granted (1)")
	p.until("the queue's depth charted", `/now 2\b/.test(document.querySelector('figure.chart[data-series="queue depth"] svg')?.getAttribute('aria-label') || '')`)
	p.screenshot("lock")
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if lb == nil {
		t.FailNow()
	}
	p.see("main", "Waiters, in the order they will be granted (0)")
	p.see("main table", b.ID())
	// Its charts: the grants, and the waiter that queued.
	p.until("the lock's grants charted", `/peak [1-9]/.test(document.querySelector('figure.chart[data-series="grants"] svg')?.getAttribute('aria-label') || '')`)
	p.see("main table", strconv.FormatInt(int64(lb.Token()), 10))
	// The history: the grant handed over from a's, newest first.
	p.see(".history", "handed over from "+strconv.FormatInt(int64(la.Token()), 10))
	p.see(".history", "released")

	// Sessions: the list, and one session with what it holds.
	p.open("#/sessions")
	p.see("main table", "billing-2")
	p.see("main table", "orders/42") // what b holds, in the list
	p.until("a time left counting in the list", `[...document.querySelectorAll('[data-left]')].some((c) => /^[1-9][0-9]*s$/.test(c.innerText))`)
	p.screenshot("sessions")
	p.open("#/sessions/" + b.ID())
	p.see("main", "orders/42")
	p.see("main", "holds")
	p.see(`[data-remaining]`, "s left")
	p.screenshot("session")

	// An operator releases the stuck holder from the console: the SDK
	// holder is told it lost the lock.
	p.open("#/locks/orders/42")
	p.clickRow(b.ID(), "Release")
	p.confirm()
	p.see("main", "Nobody holds it.")
	select {
	case <-lb.Lost():
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the holder was not told that the console released its lock")
	}

	// Elections: the leader, a candidate, and a hand-over in the live
	// timeline.
	p.open("#/elections/sched")
	la1, err := a.Campaign(ctx, "sched", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	p.see("main table", "node-a")
	var lb1 *clientlib.Leadership
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if lb1, err = b.Campaign(ctx, "sched", "node-b"); err != nil {
			t.Errorf("b.Campaign: %v", err)
		}
	}()
	p.see("main", "billing-2") // the candidate
	// An operator hands the seat to the candidate: one commit, a new
	// term; the old leader's SDK is told it no longer leads.
	p.clickRow(b.ID(), "Hand over…")
	p.confirm()
	wg.Wait()
	select {
	case <-la1.Lost():
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the leader was not told that the console handed its seat over")
	}
	if lb1 == nil {
		t.FailNow()
	}
	p.see(".timeline", "resigned")
	p.see(".timeline", "term "+strconv.FormatInt(int64(lb1.Term()), 10))
	p.see("main table", "node-b")
	p.see(".history", "resigned")
	p.see(".history", strconv.FormatInt(int64(lb1.Term()), 10))
	p.screenshot("election")

	// Config: two releases and their diff; a rollback from the console
	// reaches an SDK subscriber as a new release.
	cc := c.ConfigCenter()
	ns := "payments/prod"
	if _, err := cc.Publish(ctx, ns, []clientlib.ConfigMutation{{Key: "timeout", Value: `"10s"`}, {Key: "limits", Value: `{"rps":100,"burst":20}`}}, clientlib.PublishOptions{Author: "ann", Message: "first"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Publish(ctx, ns, []clientlib.ConfigMutation{{Key: "timeout", Value: `"5s"`}}, clientlib.PublishOptions{Author: "bo", Message: "shorter timeout"}); err != nil {
		t.Fatal(err)
	}
	sub, err := cc.Subscribe(ctx, []string{ns})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p.open("#/config/" + ns)
	p.see("main table", `"burst": 20`) // JSON pretty-printed
	p.screenshot("config")
	p.open("#/config/" + ns + "?tab=diff&from=1&to=2")
	p.see(".diff table", `"10s"`)
	p.see(".diff table", `"5s"`)
	p.screenshot("config-diff")
	p.open("#/config/" + ns + "?tab=history")
	p.see("main table", "shorter timeout")
	p.clickRow("first", "Roll back")
	p.see("dialog[open] .diff", `"5s"`) // the diff is shown before anything changes
	p.screenshot("config-rollback")
	p.confirm()
	p.see("main table", "rollback to 1")
	wait.For(t, "the subscriber sees the rollback", func() bool {
		v, ok := sub.Snapshot().Get(ns, "timeout")
		return ok && v == `"10s"` && sub.Snapshot().Release(ns) == 3
	})
	p.screenshot("config-history")

	// Publish from the console: the dry run shows the change and writes
	// nothing; publishing makes release 4.
	p.open("#/config/" + ns + "?tab=publish")
	p.run("fill a change",
		chromedp.SendKeys(chromedp.CSS(`main input[aria-label="Key"]`), "timeout"),
		// Leaving the key field fills in the key's current value to edit.
		chromedp.Click(chromedp.CSS(`main textarea[aria-label="Value"]`)),
		chromedp.Poll[chromedp.Void](`document.querySelector('main textarea[aria-label="Value"]').value === '"10s"'`),
		chromedp.Poll[chromedp.Void](`(() => { document.querySelector('main textarea[aria-label="Value"]').value = ''; return true; })()`),
		chromedp.SendKeys(chromedp.CSS(`main textarea[aria-label="Value"]`), `"7s"`),
		chromedp.Click(chromedp.Search(`//button[text()="Preview (dry run)"]`)))
	p.see("main .diff", `"7s"`)
	if rels, err := cc.Releases(ctx, ns, 0, 10); err != nil || len(rels) != 3 {
		t.Fatalf("after the dry run: %d releases, %v; want 3", len(rels), err)
	}
	p.run("publish", chromedp.Click(chromedp.Search(`//button[text()="Publish"]`)))
	p.see("main table", "Roll back to this")
	wait.For(t, "the subscriber sees the console's release", func() bool {
		v, _ := sub.Snapshot().Get(ns, "timeout")
		return v == `"7s"` && sub.Snapshot().Release(ns) == 4
	})

	// A gray release from the console reaches only the instance it picks;
	// promoting it from the console gives it to everyone.
	canary, err := cc.Subscribe(ctx, []string{ns}, clientlib.WithInstance("canary-1", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	p.open("#/config/" + ns + "?tab=gray")
	p.see("main", "No gray release runs.")
	p.run("fill a gray release",
		chromedp.SendKeys(chromedp.CSS(`main input[aria-label="Instances"]`), "canary-1"),
		chromedp.SendKeys(chromedp.CSS(`main textarea[aria-label="Overrides"]`), `timeout="1s"`),
		chromedp.Click(chromedp.Search(`//button[text()="Preview (dry run)"]`)))
	p.see("main .diff", `"1s"`)
	p.run("start it", chromedp.Click(chromedp.Search(`//button[text()="Start"]`)))
	p.see("main", "Gray release 1, over release 4, for instances canary-1")
	wait.For(t, "the picked instance to run the gray", func() bool {
		v, _ := canary.Snapshot().Get(ns, "timeout")
		return v == `"1s"` && canary.Snapshot().Gray(ns) == 1
	})
	if v, _ := sub.Snapshot().Get(ns, "timeout"); v != `"7s"` {
		t.Fatalf("an instance the gray does not pick has timeout %s", v)
	}
	p.screenshot("config-gray")
	p.run("promote", chromedp.Click(chromedp.Search(`//button[text()="Promote…"]`)))
	p.see("dialog[open] .diff", `"1s"`)
	p.confirm()
	p.see("main", "No gray release runs.")
	p.see("main table", "promote → release 5")
	wait.For(t, "everyone to run the promoted release", func() bool {
		v, _ := sub.Snapshot().Get(ns, "timeout")
		return v == `"1s"` && sub.Snapshot().Release(ns) == 5
	})

	// Dark mode (the system's setting) gets its own colours.
	if _, err := chromedp.Call(p.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	p.open("#/config/" + ns + "?tab=history")
	p.see("main table", "rollback to 1")
	p.until("dark background", `getComputedStyle(document.body).backgroundColor === 'rgb(13, 17, 23)'`)
	p.screenshot("config-history-dark")

	// A phone-sized screen still shows the cluster's members.
	p.run("narrow window", chromedp.EmulateViewport(390, 844))
	p.open("#/")
	p.see("main table", "leader")
	p.screenshot("overview-phone")
}

// With a policy the console signs in with a bearer token, and a denied
// call says why. It runs behind a reverse proxy that serves coordd under
// /coordd/, as an operator's ingress might: every URL the console uses is
// relative, streams included.
func TestConsoleSignsInAndExplainsDenials(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	d := start(t, cfg)
	target, err := url.Parse("http://" + d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // streams pass at once
	mux := http.NewServeMux()
	mux.Handle("/coordd/", http.StripPrefix("/coordd", proxy))
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	p := openConsole(t, front.URL+"/coordd/ui/")

	p.open("#/locks/a/x")
	p.see("main", "Sign in needed")
	p.see("#whoami", "not signed in")
	p.run("sign in as bob",
		chromedp.Click(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`dialog[open] input[type="password"]`)),
		chromedp.SendKeys(chromedp.CSS(`dialog[open] input[type="password"]`), testTokens["bob"]),
		chromedp.Click(chromedp.CSS(`dialog[open] button[value="ok"]`)))
	p.see("main", "Not allowed")
	p.see("main", "bob") // the reason names the principal
	p.see("#whoami", "signed in as bob")
	p.screenshot("denied")

	p.run("sign out", chromedp.Click(chromedp.CSS(`#signin`)))
	p.run("sign in as alice",
		chromedp.Click(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`dialog[open] input[type="password"]`)),
		chromedp.SendKeys(chromedp.CSS(`dialog[open] input[type="password"]`), testTokens["alice"]),
		chromedp.Click(chromedp.CSS(`dialog[open] button[value="ok"]`)))
	p.see("main", "Nobody holds it.")
	p.gone("main", "Not allowed")

	// A stream through the proxy: the namespace's snapshot follows a
	// release published elsewhere.
	p.open("#/config/a/ns")
	p.see("main", "The namespace is empty.")
	if _, err := newClientWithToken(t, d.GRPCAddr(), "alice").ConfigCenter().Put(t.Context(), "a/ns", "k", `"v1"`, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	p.see("main table", `"v1"`)
	p.see("#live", "live")
}

// The console is served under /ui/, / and /ui lead to it with relative
// redirects, and --no-console turns it off.
func TestConsoleRoutes(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/ui"} {
		resp, err := noRedirect.Get("http://" + d.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "ui/" {
			t.Fatalf("GET %s: %d to %q, want 302 to ui/", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	resp, err := httpClient.Get("http://" + d.HTTPAddr() + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("GET /ui/: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}

	cfg := testConfig(t)
	cfg.NoConsole = true
	off := start(t, cfg)
	for _, path := range []string{"/ui/", "/"} {
		resp, err := noRedirect.Get("http://" + off.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("--no-console: GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// Every page paints more than its heading at once (a loading state until
// its first answer), and once loaded shows no stray "null" or
// "undefined"; views that poll say when they last heard from coordd.
func TestConsoleEveryPagePaints(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second), clientlib.WithOwner("painter"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(ctx, "orders/1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Campaign(ctx, "sched", "node-a"); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := c.ConfigCenter().Put(ctx, "app/prod", "limit", v, clientlib.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")
	p.open("#/")
	routes := []string{"#/sessions", "#/sessions/" + s.ID(), "#/locks", "#/locks/orders/1", "#/elections", "#/elections/sched", "#/barriers", "#/barriers/jobs/x", "#/config", "#/config/app/prod"}
	for _, tab := range []string{"history", "diff&from=1&to=2", "publish", "gray", "schema", "status", "snapshot"} {
		routes = append(routes, "#/config/app/prod?tab="+tab)
	}
	routes = append(routes, "#/")
	for _, route := range routes {
		// The first paint: what main holds right after the view puts its
		// heading in, before any answer can arrive (a mutation observer
		// runs before the next task).
		p.run("go to "+route, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
			window.firstPaint = null;
			const main = document.querySelector('main');
			new MutationObserver((_, obs) => {
				const h1 = main.querySelector('h1');
				if (!h1) return;
				window.firstPaint = main.innerText.replace(h1.innerText, '').trim();
				obs.disconnect();
			}).observe(main, { childList: true, subtree: true });
			location.hash = %q;
		})()`, route)))
		p.until("the first paint of "+route, `window.firstPaint !== null`)
		first, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`window.firstPaint`))
		if err != nil {
			t.Fatal(err)
		}
		if first == "" {
			t.Errorf("%s: the first paint is its heading alone (no loading state)", route)
		}
		p.until(route+" loaded", `!document.querySelector('main .loading')`)
		text, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.querySelector('main').innerText`))
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(`\bnull\b|\bundefined\b|\[object Object\]|NaN`).FindString(text); m != "" {
			t.Errorf("%s shows %q:\n%s", route, m, text)
		}
	}
	// The overview polls: it says when it last heard from coordd.
	p.see("#live", "updated ")
}
