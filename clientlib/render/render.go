// Package render keeps a file rendered from config namespaces, as
// consul-template does from Consul's KV: a Go text/template is executed
// against a consistent snapshot of the namespaces it reads, the result
// replaces the file atomically after each release, and a command (a
// reload) runs after each change of the file.
//
// Guarantees:
//   - One render reads one snapshot: every namespace it reads is at one
//     etcd revision, each at a complete release (the SDK's Subscription).
//   - The file is replaced by rename: a reader sees the old content or the
//     new, never a part. A render that fails (a template error, a key that
//     `key` requires and the namespace lacks, a namespace that cannot be
//     subscribed) leaves the last good file as it was, and the command does
//     not run.
//   - The command runs only after the file's content changed, one run at a
//     time, never concurrently with a render.
//   - Releases that arrive within the debounce window are rendered once.
//     The last release is always rendered (at the latest MaxWait after the
//     first one of a burst).
//
// Not guaranteed: that the command ran for every content the file had
// (releases coalesce); that the file is current while coordd is
// unreachable (with a cache file it starts from the last state seen).
//
// A template calls, besides text/template's own functions (and, or, eq,
// index, len, printf, ...):
//
//	ns "NS"             the namespace's keys and values, a map[string]string
//	                    (empty when it has no release yet)
//	key "NS" "K"        the key's value; the render fails when it is missing
//	keyOr "NS" "K" "D"  the key's value, or D when it is missing
//	keys "NS"           the namespace's keys, sorted
//	release "NS"        the namespace's release number (0: none yet)
//	parseJSON "S"       S decoded from JSON (for a value that holds JSON)
//	toJSON V            V encoded as JSON
//	env "NAME"          an environment variable of the renderer
//	split "S" "SEP", join LIST "SEP", trimSpace "S", upper "S", lower "S"
//
// The namespaces a template reads are found by executing it: a render that
// names a namespace not followed yet subscribes to it too and runs again.
package render

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// Options configure a Renderer.
type Options struct {
	// Template is the path of the Go text/template to execute (see Funcs).
	Template string
	// Out is the file to keep rendered. Its directory must exist.
	Out string
	// Mode is the rendered file's permission bits; 0 keeps an existing
	// file's (without its group's and others' with RevealSecrets), else
	// 0644 (0600 with RevealSecrets).
	Mode os.FileMode
	// Namespaces are subscribed from the start, beside those the template
	// is found to read (it is executed to find them).
	Namespaces []string
	// Command, if not empty, runs with sh -c after each change of the
	// file, with COORDD_RENDERED set to Out.
	Command string
	// CommandTimeout bounds one run of Command (default 30s); past it the
	// command's process group is killed.
	CommandTimeout time.Duration
	// Debounce is how long a burst of releases must be quiet before a
	// render (default 250ms); MaxWait bounds the wait from the burst's
	// first release (default 2s).
	Debounce, MaxWait time.Duration
	// Subscribe are passed to every subscription (a cache file, an
	// instance name).
	Subscribe []clientlib.SubscribeOption
	// RevealSecrets subscribes with secrets in clear (the caller needs
	// config.read-secret); else secret keys are missing from the data the
	// template sees. A new file is then made mode 0600, and an existing
	// one loses its group's and others' bits, unless Mode says otherwise.
	RevealSecrets bool
	// OnResult, if set, is called after every render attempt, on the
	// renderer's goroutine.
	OnResult func(Result)
	// Logger receives one line per render and command run (default: none).
	Logger *slog.Logger
	// Stdout and Stderr receive the command's output (default: the
	// process's).
	Stdout, Stderr io.Writer
}

// Result is what one render did.
type Result struct {
	// Releases is the release of every namespace the render read.
	Releases map[string]int64
	// Revision is the snapshot's etcd revision.
	Revision int64
	// Changed is true when the file's content changed (and was written).
	Changed bool
	// Err is why the render failed; the file was left as it was.
	Err error
	// Ran is true when the command ran; CommandErr is its failure.
	Ran        bool
	CommandErr error
	// Stale is true when the snapshot came from the cache file, coordd
	// being unreachable.
	Stale bool
}

// Renderer keeps one file rendered. Create it with New, then call Run or
// Once.
type Renderer struct {
	c    *clientlib.Client
	opts Options

	mu   sync.Mutex
	tmpl *template.Template // replaced by Reload
	sub  *clientlib.Subscription
	nss  []string // what sub follows, sorted
	// wake is signalled by the subscription's callbacks.
	wake chan struct{}
}

// New parses the template and checks the options; nothing is subscribed
// or written yet.
func New(c *clientlib.Client, opts Options) (*Renderer, error) {
	if opts.Template == "" || opts.Out == "" {
		return nil, errors.New("render: a template and an output file are needed")
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = 30 * time.Second
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 250 * time.Millisecond
	}
	if opts.MaxWait < opts.Debounce {
		opts.MaxWait = max(2*time.Second, opts.Debounce)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if fi, err := os.Stat(filepath.Dir(opts.Out)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("render: the output file's directory %s does not exist", filepath.Dir(opts.Out))
	}
	r := &Renderer{c: c, opts: opts, wake: make(chan struct{}, 1)}
	if err := r.parse(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Renderer) parse() error {
	src, err := os.ReadFile(r.opts.Template)
	if err != nil {
		return fmt.Errorf("render: reading the template: %w", err)
	}
	// The functions are bound per execution (Funcs again on a clone);
	// parsing needs their names only.
	t, err := template.New(filepath.Base(r.opts.Template)).Option("missingkey=error").Funcs((&reader{}).funcs()).Parse(string(src))
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	r.mu.Lock()
	r.tmpl = t
	r.mu.Unlock()
	return nil
}

// Reload reads the template file again (as consul-template does on
// SIGHUP) and has Run render with it at once. A template that no longer
// parses is refused with its error, and the one before stays in use.
func (r *Renderer) Reload() error {
	if err := r.parse(); err != nil {
		return err
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

// Once renders the file once from the current configuration (subscribing
// as needed) and returns what it did; the command runs if the file
// changed. It fails if the render does.
func (r *Renderer) Once(ctx context.Context) (Result, error) {
	defer r.close()
	res := r.render(ctx)
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// Run renders the file now and after every release of the namespaces the
// template reads, until ctx ends. A render that fails is logged (and
// given to OnResult) and the file kept; the next release tries again.
// It returns ctx's end, or an error if it cannot subscribe at first.
func (r *Renderer) Run(ctx context.Context) error {
	defer r.close()
	res := r.render(ctx)
	if r.current() == nil { // it could not subscribe, or reads no namespace
		if res.Err != nil {
			return res.Err
		}
		<-ctx.Done()
		return nil
	}
	for {
		if err := r.waitForChange(ctx); err != nil {
			return nil // ctx ended: a normal stop
		}
		r.render(ctx)
	}
}

// waitForChange returns after a release and the debounce, or with ctx's
// error.
func (r *Renderer) waitForChange(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.wake:
	}
	deadline := time.NewTimer(r.opts.MaxWait)
	defer deadline.Stop()
	quiet := time.NewTimer(r.opts.Debounce)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.wake:
			quiet.Reset(r.opts.Debounce)
		case <-quiet.C:
			return nil
		case <-deadline.C:
			return nil
		}
	}
}

// render executes the template on the current snapshot (subscribing to
// the namespaces it turns out to read), writes the file if its content
// changed, and runs the command then.
func (r *Renderer) render(ctx context.Context) Result {
	res := r.execute(ctx)
	if res.Err == nil {
		res.Changed, res.Err = r.write(res.out)
	}
	if res.Err != nil {
		r.opts.Logger.Warn("render failed; the last good file is kept", "out", r.opts.Out, "error", res.Err)
	} else {
		r.opts.Logger.Info("rendered", "out", r.opts.Out, "changed", res.Changed, "releases", releasesText(res.Releases), "stale", res.Stale)
	}
	if res.Err == nil && res.Changed && r.opts.Command != "" {
		res.Ran = true
		start := time.Now()
		res.CommandErr = r.runCommand(ctx)
		if res.CommandErr != nil {
			r.opts.Logger.Warn("the command failed", "command", r.opts.Command, "error", res.CommandErr, "took", time.Since(start).Round(time.Millisecond))
		} else {
			r.opts.Logger.Info("ran the command", "command", r.opts.Command, "took", time.Since(start).Round(time.Millisecond))
		}
	}
	if r.opts.OnResult != nil {
		r.opts.OnResult(res.Result)
	}
	return res.Result
}

type rendered struct {
	Result
	out []byte
}

// execute runs the template on the subscription's snapshot. When it reads
// a namespace the subscription does not follow, the subscription is
// replaced by one that follows it too, and the template runs again.
func (r *Renderer) execute(ctx context.Context) rendered {
	want := slices.Clone(r.opts.Namespaces)
	for range 8 { // each round adds at least one namespace
		if err := r.follow(ctx, want); err != nil {
			return rendered{Result: Result{Err: err}}
		}
		sub, followed := r.following()
		snap, stale := new(clientlib.ConfigSnapshot), false
		if sub != nil {
			snap, stale = sub.Snapshot(), sub.Status().State != clientlib.StateLive
		}
		rd := &reader{snap: snap, followed: followed, read: map[string]bool{}}
		r.mu.Lock()
		t, err := r.tmpl.Clone()
		r.mu.Unlock()
		if err != nil {
			return rendered{Result: Result{Err: err}}
		}
		var buf bytes.Buffer
		err = t.Funcs(rd.funcs()).Execute(&buf, nil)
		if len(rd.missing) > 0 {
			want = append(want, rd.missing...)
			continue
		}
		res := rendered{Result: Result{Revision: snap.Revision(), Releases: map[string]int64{}, Stale: stale}, out: buf.Bytes()}
		for ns := range rd.read {
			res.Releases[ns] = snap.Release(ns)
		}
		if err != nil {
			res.Err = fmt.Errorf("render: %w", err)
		}
		return res
	}
	return rendered{Result: Result{Err: errors.New("render: the template kept naming namespaces not read before (more than 8 rounds)")}}
}

// follow makes sure the subscription follows every namespace in want.
func (r *Renderer) follow(ctx context.Context, want []string) error {
	_, have := r.following()
	all := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(have), want...))))
	if slices.Equal(all, have) {
		return nil // also when the template reads no namespace: nothing to follow
	}
	cc := r.c.ConfigCenter()
	if r.opts.RevealSecrets {
		cc = cc.RevealSecrets()
	}
	sub, err := cc.Subscribe(ctx, all, r.opts.Subscribe...)
	if err != nil {
		return fmt.Errorf("render: subscribing to %s: %w", strings.Join(all, ", "), err)
	}
	for _, ns := range all {
		sub.OnNamespace(ns, func(clientlib.ConfigUpdate) {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		})
	}
	r.mu.Lock()
	old := r.sub
	r.sub, r.nss = sub, all
	r.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

func (r *Renderer) current() *clientlib.Subscription {
	sub, _ := r.following()
	return sub
}

// following is the subscription and the namespaces it follows.
func (r *Renderer) following() (*clientlib.Subscription, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sub, r.nss
}

func (r *Renderer) close() {
	r.mu.Lock()
	sub := r.sub
	r.sub, r.nss = nil, nil
	r.mu.Unlock()
	if sub != nil {
		sub.Close()
	}
}

// write replaces Out with b unless it holds b already: a temporary file in
// the same directory, synced, then renamed over it, and the directory
// synced.
func (r *Renderer) write(b []byte) (changed bool, err error) {
	mode := r.opts.Mode
	if old, err := os.ReadFile(r.opts.Out); err == nil {
		if bytes.Equal(old, b) {
			return false, nil
		}
		if fi, err := os.Stat(r.opts.Out); err == nil && mode == 0 {
			mode = fi.Mode().Perm()
			if r.opts.RevealSecrets {
				// A file that may now hold secrets keeps its owner's
				// bits only (a 0644 file of before becomes 0600).
				mode &^= 0o077
			}
		}
	}
	switch {
	case mode == 0 && r.opts.RevealSecrets:
		mode = 0o600 // it may hold secrets
	case mode == 0:
		mode = 0o644
	}
	dir := filepath.Dir(r.opts.Out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(r.opts.Out)+".render-*")
	if err != nil {
		return false, fmt.Errorf("render: writing %s: %w", r.opts.Out, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(b); err == nil {
		if err = f.Chmod(mode); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, r.opts.Out)
	}
	if err != nil {
		return false, fmt.Errorf("render: writing %s: %w", r.opts.Out, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename is durable once the directory is
		_ = d.Close()
	}
	return true, nil
}

// runCommand runs Command in its own process group, killed past the
// timeout or when ctx ends.
func (r *Renderer) runCommand(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "sh", "-c", r.opts.Command)
	cmd.Env = append(os.Environ(), "COORDD_RENDERED="+r.opts.Out)
	cmd.Stdout, cmd.Stderr = r.opts.Stdout, r.opts.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if cctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%q ran past its timeout of %s and was killed", r.opts.Command, r.opts.CommandTimeout)
	}
	if err != nil {
		return fmt.Errorf("%q: %w", r.opts.Command, err)
	}
	return nil
}

func releasesText(m map[string]int64) string {
	var b strings.Builder
	for _, ns := range slices.Sorted(maps.Keys(m)) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s release %d", ns, m[ns])
	}
	return b.String()
}
