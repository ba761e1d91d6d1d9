package sdk_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/clientlib/render"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// renderClient is a client of a real single-member daemon of the test's own.
func renderClient(t *testing.T) *clientlib.Client {
	t.Helper()
	return newClient(t, start(t, testConfig(t)).GRPCAddr())
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func put(t *testing.T, c *clientlib.Client, ns string, kv ...string) int64 {
	t.Helper()
	var ms []clientlib.ConfigMutation
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<delete>" {
			ms = append(ms, clientlib.ConfigMutation{Key: kv[i], Delete: true})
		} else {
			ms = append(ms, clientlib.ConfigMutation{Key: kv[i], Value: kv[i+1]})
		}
	}
	r, err := c.ConfigCenter().Publish(t.Context(), ns, ms, clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Number
}

// results collects what the renderer reports.
type results struct {
	mu  sync.Mutex
	all []render.Result
}

func (r *results) add(res render.Result) {
	r.mu.Lock()
	r.all = append(r.all, res)
	r.mu.Unlock()
}

func (r *results) list() []render.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]render.Result(nil), r.all...)
}

func (r *results) last() render.Result {
	l := r.list()
	if len(l) == 0 {
		return render.Result{}
	}
	return l[len(l)-1]
}

// The file follows the releases; one that makes the render fail (a key
// the template requires was deleted) leaves the last good file and does
// not run the command; the next good release renders again. A namespace
// the template reads only in some branch is found and followed.
func TestRenderFollowsReleasesAndKeepsTheLastGoodFile(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out, ran := filepath.Join(dir, "app.tmpl"), filepath.Join(dir, "app.conf"), filepath.Join(dir, "ran")
	writeFile(t, tmpl, `color={{ key "shop/web" "color" }}
size={{ keyOr "shop/web" "size" "10" }}
{{- if eq (keyOr "shop/web" "db" "") "on" }}
db={{ key "shop/db" "url" }}
{{- end }}
release={{ release "shop/web" }}
`)
	put(t, c, "shop/web", "color", "blue")
	put(t, c, "shop/db", "url", "postgres://db1")
	var rs results
	r, err := render.New(c, render.Options{
		Template: tmpl, Out: out, Mode: 0o600,
		Command:  "echo run >> " + ran,
		Debounce: 20 * time.Millisecond, MaxWait: 200 * time.Millisecond,
		OnResult: rs.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	wait.Within(t, 10*time.Second, "the first render", func() bool { return len(rs.list()) >= 1 })
	if got, want := readFile(t, out), "color=blue\nsize=10\nrelease=1\n"; got != want {
		t.Fatalf("first render:\n%s\nwant:\n%s", got, want)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if got := readFile(t, ran); got != "run\n" {
		t.Fatalf("command ran %q times after the first render, want once", got)
	}

	// A branch that reads another namespace: followed from now on.
	put(t, c, "shop/web", "db", "on")
	wait.Within(t, 10*time.Second, "the render with shop/db", func() bool { return rs.last().Releases["shop/db"] == 1 })
	if got := readFile(t, out); !strings.Contains(got, "db=postgres://db1") {
		t.Fatalf("render with shop/db:\n%s", got)
	}
	put(t, c, "shop/db", "url", "postgres://db2")
	wait.Within(t, 10*time.Second, "a release of shop/db rendered", func() bool { return rs.last().Releases["shop/db"] == 2 })
	good := readFile(t, out)
	if !strings.Contains(good, "db=postgres://db2") {
		t.Fatalf("render of shop/db's release 2:\n%s", good)
	}
	runs := readFile(t, ran)

	// A release that breaks the render: the good file stays, no command.
	n := len(rs.list())
	put(t, c, "shop/web", "color", "<delete>")
	wait.Within(t, 10*time.Second, "the failed render", func() bool { return len(rs.list()) > n && rs.last().Err != nil })
	if err := rs.last().Err; !strings.Contains(err.Error(), `key "color" is not in namespace shop/web`) {
		t.Errorf("failed render's error: %v", err)
	}
	if got := readFile(t, out); got != good {
		t.Fatalf("a failed render changed the file:\n%s\nwant the last good one:\n%s", got, good)
	}
	if got := readFile(t, ran); got != runs {
		t.Fatalf("the command ran after a failed render")
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".app.conf.render-*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}

	// Fixed: rendered again.
	put(t, c, "shop/web", "color", "green")
	wait.Within(t, 10*time.Second, "the render after the fix", func() bool { return rs.last().Releases["shop/web"] == 4 })
	if got := readFile(t, out); !strings.HasPrefix(got, "color=green\n") {
		t.Fatalf("render after the fix:\n%s", got)
	}
	if last := rs.last(); last.Err != nil || !last.Changed || !last.Ran || last.CommandErr != nil || last.Releases["shop/web"] != 4 || last.Releases["shop/db"] != 2 {
		t.Errorf("last result %+v, want changed, the command run, shop/web release 4 and shop/db release 2", last)
	}
}

// A burst of releases is rendered once the burst is quiet, with the last
// release; the command runs once for it.
func TestRenderDebouncesABurst(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out, ran := filepath.Join(dir, "t"), filepath.Join(dir, "out"), filepath.Join(dir, "ran")
	writeFile(t, tmpl, `n={{ key "burst" "n" }}`)
	put(t, c, "burst", "n", "0")
	var rs results
	r, err := render.New(c, render.Options{Template: tmpl, Out: out, Command: "echo run >> " + ran,
		Debounce: 300 * time.Millisecond, MaxWait: 5 * time.Second, OnResult: rs.add})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait.Within(t, 10*time.Second, "the first render", func() bool { return len(rs.list()) == 1 })
	for i := 1; i <= 5; i++ {
		put(t, c, "burst", "n", fmt.Sprint(i))
	}
	wait.Within(t, 10*time.Second, "the burst rendered", func() bool { return rs.last().Releases["burst"] == 6 })
	if got := readFile(t, out); got != "n=5" {
		t.Fatalf("after the burst: %q, want n=5", got)
	}
	// Nothing more is coming: exactly one render and one run for the burst
	// (five releases published well within one debounce window of each
	// other on an idle machine; a slow machine may split it in two).
	if n := len(rs.list()); n < 2 || n > 3 {
		t.Errorf("%d renders for one start and a burst of 5 releases, want 2 (or 3 on a slow machine)", n)
	}
	if runs := strings.Count(readFile(t, ran), "run"); runs != len(rs.list()) {
		t.Errorf("the command ran %d times for %d renders that changed the file", runs, len(rs.list()))
	}
}

// Once renders and returns; a failing render is an error and writes
// nothing; a command that runs past its timeout is killed and reported.
func TestRenderOnce(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out := filepath.Join(dir, "t"), filepath.Join(dir, "out")
	writeFile(t, tmpl, `{{ range $k, $v := ns "once" }}{{ $k }}={{ $v }};{{ end }}{{ toJSON (keys "once") }}`)
	r, err := render.New(c, render.Options{Template: tmpl, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.Once(t.Context()); err != nil || !res.Changed || res.Releases["once"] != 0 {
		t.Fatalf("Once on a namespace with no release: %+v, %v; want an empty render", res, err)
	}
	if got := readFile(t, out); got != "null" {
		t.Fatalf("render of an empty namespace: %q", got)
	}
	put(t, c, "once", "b", "2", "a", "1")
	if _, err := r.Once(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, out), `a=1;b=2;["a","b"]`; got != want {
		t.Fatalf("Once: %q, want %q", got, want)
	}
	// Unchanged content: not written again, the command not run.
	r2, err := render.New(c, render.Options{Template: tmpl, Out: out, Command: "false"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r2.Once(t.Context()); err != nil || res.Changed || res.Ran {
		t.Fatalf("Once with nothing new: %+v, %v; want no change and no command", res, err)
	}

	writeFile(t, tmpl, `{{ key "once" "missing" }}`)
	r3, err := render.New(c, render.Options{Template: tmpl, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r3.Once(t.Context()); err == nil || !strings.Contains(err.Error(), `key "missing" is not in namespace once`) {
		t.Fatalf("Once of a failing render: %v", err)
	}
	if got := readFile(t, out); got != `a=1;b=2;["a","b"]` {
		t.Fatalf("a failing Once changed the file to %q", got)
	}

	writeFile(t, tmpl, `{{ key "once" "a" }} slow`)
	r4, err := render.New(c, render.Options{Template: tmpl, Out: out, Command: "sleep 30", CommandTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	res, err := r4.Once(t.Context())
	if err != nil || !res.Ran || res.CommandErr == nil || !strings.Contains(res.CommandErr.Error(), "past its timeout") {
		t.Fatalf("a command past its timeout: %+v, %v", res, err)
	}
	if took := time.Since(begin); took > wait.Bound(10*time.Second) {
		t.Errorf("the killed command held Once for %s", took)
	}

	if _, err := render.New(c, render.Options{Template: tmpl, Out: filepath.Join(dir, "no", "such", "dir", "f")}); err == nil {
		t.Error("New with an output directory that does not exist succeeded")
	}
	writeFile(t, tmpl, `{{ key "once" }`)
	if _, err := render.New(c, render.Options{Template: tmpl, Out: out}); err == nil {
		t.Error("New with a template that does not parse succeeded")
	}
}

// text prints a value as text (a string stored quoted, to stay a string,
// without its quotes); value reads it as a schema and Bind do.
func TestRenderReadsValuesByTheOneRule(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out := filepath.Join(dir, "t"), filepath.Join(dir, "out")
	writeFile(t, tmpl, `{{ text (key "v" "port") }} {{ text (key "v" "timeout") }} {{ text (key "v" "limits") }} {{ (value (key "v" "limits")).cpu }} {{ value (key "v" "timeout") }}`)
	put(t, c, "v", "port", `"8080"`, "timeout", "5s", "limits", `{"cpu":2}`)
	r, err := render.New(c, render.Options{Template: tmpl, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, out), `8080 5s {"cpu":2} 2 5s`; got != want {
		t.Errorf("render = %q, want %q", got, want)
	}
}

// Reload reads the template again and renders with it at once; one that
// does not parse is refused and the one before stays.
func TestRenderReload(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out := filepath.Join(dir, "t"), filepath.Join(dir, "out")
	writeFile(t, tmpl, `a={{ key "reload" "k" }}`)
	put(t, c, "reload", "k", "1")
	var rs results
	r, err := render.New(c, render.Options{Template: tmpl, Out: out, Debounce: 10 * time.Millisecond, OnResult: rs.add})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait.Within(t, 10*time.Second, "the first render", func() bool { return len(rs.list()) == 1 })
	writeFile(t, tmpl, `b={{ key "reload" "k" }}`)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 10*time.Second, "the render with the new template", func() bool { return len(rs.list()) == 2 })
	if got := readFile(t, out); got != "b=1" {
		t.Fatalf("after Reload: %q, want b=1", got)
	}
	writeFile(t, tmpl, `{{ broken`)
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a template that does not parse succeeded")
	}
	put(t, c, "reload", "k", "2")
	wait.Within(t, 10*time.Second, "the render of release 2", func() bool { return rs.last().Releases["reload"] == 2 })
	if got := readFile(t, out); got != "b=2" {
		t.Fatalf("after a refused Reload and a release: %q, want b=2 (the template before)", got)
	}
}

// A render that reveals secrets never leaves them readable by others: an
// existing output file of mode 0644 (rendered before without secrets, or
// made by hand) is replaced by one of mode 0600; without secrets its mode
// is kept.
func TestRenderWithSecretsNarrowsAnExistingFilesMode(t *testing.T) {
	c := renderClient(t)
	dir := t.TempDir()
	tmpl, out := filepath.Join(dir, "t"), filepath.Join(dir, "out")
	writeFile(t, tmpl, `{{ range $k, $v := ns "modes" }}{{ $k }}={{ $v }};{{ end }}`)
	writeFile(t, out, "old")
	if err := os.Chmod(out, 0o644); err != nil {
		t.Fatal(err)
	}
	put(t, c, "modes", "a", "1")
	plain, err := render.New(c, render.Options{Template: tmpl, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Once(t.Context()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode without secrets %v, want the file's 0644 kept", fi.Mode().Perm())
	}
	put(t, c, "modes", "a", "2")
	revealing, err := render.New(c, render.Options{Template: tmpl, Out: out, RevealSecrets: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := revealing.Once(t.Context()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode with secrets revealed %v, want 0600", fi.Mode().Perm())
	}
}
