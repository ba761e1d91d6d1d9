package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/clientlib/render"
)

// renderOut is one render's line under -o json.
type renderOut struct {
	Out        string           `json:"out"`
	Revision   int64            `json:"revision"`
	Releases   map[string]int64 `json:"releases"`
	Changed    bool             `json:"changed"`
	Error      string           `json:"error,omitempty"`
	Ran        bool             `json:"ran"`
	CommandErr string           `json:"commandError,omitempty"`
	Stale      bool             `json:"stale,omitempty"`
}

func renderText(out string, r render.Result) string {
	var releases []string
	for _, ns := range slices.Sorted(maps.Keys(r.Releases)) {
		releases = append(releases, fmt.Sprintf("%s release %d", ns, r.Releases[ns]))
	}
	from := strings.Join(releases, ", ")
	if from == "" {
		from = "no namespace"
	}
	if r.Stale {
		from += "; coordd unreachable, from the cache file"
	}
	var line string
	switch {
	case r.Err != nil:
		return fmt.Sprintf("render failed, %s kept as it was: %v", out, r.Err)
	case r.Changed:
		line = fmt.Sprintf("rendered %s (%s)", out, from)
	default:
		line = fmt.Sprintf("%s unchanged (%s)", out, from)
	}
	switch {
	case r.CommandErr != nil:
		line += "; the command failed: " + r.CommandErr.Error()
	case r.Ran:
		line += "; ran the command"
	}
	return line
}

// renderFlags are config render's flags.
type renderFlags struct {
	o               render.Options
	mode, cacheFile string
	once            bool
}

func (f *renderFlags) add(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.o.Template, "template", "", "the Go text/template to render")
	fs.StringVar(&f.o.Out, "out", "", "the file to keep rendered (its directory must exist)")
	fs.StringVar(&f.o.Command, "exec", "", "a shell command to run after each change of the file (a reload)")
	fs.DurationVar(&f.o.CommandTimeout, "exec-timeout", 30*time.Second, "kill the command (its process group) past this")
	fs.DurationVar(&f.o.Debounce, "debounce", 250*time.Millisecond, "render once releases have been quiet this long")
	fs.DurationVar(&f.o.MaxWait, "max-wait", 2*time.Second, "but no later than this after the first release of a burst")
	fs.StringSliceVar(&f.o.Namespaces, "namespace", nil, "a namespace to follow from the start (those the template reads are found by rendering it)")
	fs.StringVar(&f.mode, "mode", "", "the file's permission bits, in octal (default: an existing file's, else 0644; with --reveal, 0600 and never group or world bits)")
	fs.StringVar(&f.cacheFile, "cache-file", "", "keep the namespaces in this file, to render from it while coordd is unreachable at start")
	fs.BoolVar(&f.o.RevealSecrets, "reveal", false, "render secrets in clear (needs config.read-secret); a new file is then mode 600 unless --mode says otherwise")
	fs.BoolVar(&f.once, "once", false, "render once and exit (non-zero if the render or the command failed)")
	for _, name := range []string{"template", "out", "cache-file"} {
		_ = cmd.MarkFlagFilename(name)
	}
}

// options checks the flags and returns the render options they give.
func (f *renderFlags) options() (render.Options, error) {
	o := f.o
	if o.Template == "" || o.Out == "" {
		return o, usagef("--template and --out are both needed")
	}
	if f.mode != "" {
		m, err := strconv.ParseUint(f.mode, 8, 32)
		if err != nil || m > 0o777 {
			return o, usagef("--mode %q is not octal permission bits such as 0640", f.mode)
		}
		o.Mode = os.FileMode(m)
	}
	if f.cacheFile != "" {
		o.Subscribe = append(o.Subscribe, clientlib.WithCacheFile(f.cacheFile))
	}
	if o.Debounce < 0 || o.MaxWait < 0 || o.CommandTimeout < 0 {
		return o, usagef("--debounce, --max-wait and --exec-timeout cannot be negative")
	}
	return o, nil
}

func (a *app) configRenderCommand() *cobra.Command {
	var f renderFlags
	cmd := &cobra.Command{
		Use:   "render --template FILE --out FILE [--exec COMMAND]",
		Short: "Keep a file rendered from a template of namespaces; run a command after each change (like consul-template)",
		Long: `Render a Go text/template from config namespaces into --out, then again
after every release of the namespaces it reads, until interrupted (or once,
with --once). The file is replaced atomically (written beside it, then
renamed): readers see the old content or the new, never a part. A render
that fails (a template error, a key that "key" requires and the namespace
lacks) leaves the last good file as it was and says so; the next release
tries again. --exec runs after each change of the file's content, with
COORDD_RENDERED set to the file; releases within --debounce of each other
are rendered once.

Template functions (besides text/template's and, or, eq, index, len, printf):
  ns "NS"             the namespace's keys and values (a map)
  key "NS" "K"        the key's value; the render fails when it is missing
  keyOr "NS" "K" "D"  the key's value, or D when it is missing
  keys "NS"           the namespace's keys, sorted
  release "NS"        the namespace's release number (0: none yet)
  parseJSON "S", toJSON V, env "NAME", split, join, trimSpace, upper, lower

Example:
  # app.conf.tmpl
  listen = {{ keyOr "shop/web" "port" "8080" }}
  {{- range $k, $v := ns "shop/flags" }}
  flag.{{ $k }} = {{ $v }}
  {{- end }}

  coordctl config render --template app.conf.tmpl --out /etc/app.conf \
      --exec 'systemctl reload app' --cache-file /var/cache/app.render

One line per render goes to stdout (-o json: one JSON object); the
command's own output goes to stderr. SIGHUP reads the template again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.configRender(cmd, f)
		},
	}
	f.add(cmd)
	return cmd
}

// configRender renders the template once (--once), or again after every
// release until interrupted, printing a line per render.
func (a *app) configRender(cmd *cobra.Command, f renderFlags) error {
	o, err := f.options()
	if err != nil {
		return err
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	o.Stdout, o.Stderr = a.stderr, a.stderr
	var printErr error
	o.OnResult = func(r render.Result) {
		if err := a.printLine(renderLine(o.Out, r), renderText(o.Out, r)); err != nil && printErr == nil {
			printErr = err
		}
	}
	r, err := render.New(c, o)
	if err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), "render: "))
	}
	if f.once {
		res, err := r.Once(cmd.Context())
		if err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), "render: ") + " (" + o.Out + " kept as it was)")
		}
		if res.CommandErr != nil {
			return fmt.Errorf("rendered %s, but the command failed: %w", o.Out, res.CommandErr)
		}
		return printErr
	}
	if err := a.renderUntilDone(cmd.Context(), r); err != nil {
		return err
	}
	return printErr
}

// renderLine is a render's line under -o json.
func renderLine(out string, r render.Result) renderOut {
	v := renderOut{Out: out, Revision: r.Revision, Releases: r.Releases, Changed: r.Changed, Ran: r.Ran, Stale: r.Stale}
	if r.Err != nil {
		v.Error = r.Err.Error()
	}
	if r.CommandErr != nil {
		v.CommandErr = r.CommandErr.Error()
	}
	return v
}

// renderUntilDone runs r until ctx ends, reading the template again on
// SIGHUP, as consul-template does.
func (a *app) renderUntilDone(ctx context.Context, r *render.Renderer) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := r.Reload(); err != nil {
					_, _ = fmt.Fprintf(a.stderr, "SIGHUP: %s; rendering with the template before\n", strings.TrimPrefix(err.Error(), "render: "))
				} else {
					_, _ = fmt.Fprintln(a.stderr, "SIGHUP: read the template again")
				}
			}
		}
	})
	return r.Run(ctx)
}
