// Command coordctl uses coordd from a shell: sessions, locks (and running a
// command under one), elections (and running a command only while
// leading), the config center, and cluster status, members and backups.
//
// Exit codes:
//
//	0    success
//	1    an error (the message says which)
//	2    bad usage (flags, arguments)
//	3    not found: no such session, key, release or member, or no leader
//	4    conflict: lock held, stale token or term, not the holder or
//	     leader, revision mismatch, limit mismatch, a refused member change
//	5    coordd or etcd unavailable, etcd's database full (NOSPACE), or
//	     over a rate limit: retry later
//	6    not allowed: no identity, an unknown token, or the policy (or the
//	     owner of a session) denies the call
//	7    verify: the cluster failed the check (a violation was found)
//	124  a wait timed out (--wait)
//	125  run: the lock or leadership was lost while the command ran; the
//	     command was stopped
//	126, 127, 128+N  run: the command could not be executed, was not
//	     found, or died of signal N; otherwise run exits with its code
//
// An unknown command, also inside a group (coordctl lock bogus), or an
// unsupported shell for completion is bad usage (exit 2).
//
// With -o json the output is the REST API's JSON for the same objects:
// its lowerCamelCase field names, 64-bit integers (ids, tokens, terms,
// revisions, release numbers) as strings, times in RFC 3339, and empty
// lists as [], never null; list commands print an array, and event types
// are the short names (ELECTED, SNAPSHOT) where REST prints
// ELECTION_EVENT_TYPE_ELECTED and WATCH_EVENT_TYPE_SNAPSHOT. An error is then
// one JSON object on stderr:
//
//	{"error":{"code":"NOT_FOUND","reason":"SESSION_NOT_FOUND","message":"...","exitCode":3}}
//
// with the server's problems of a refused config write in "problems".
//
// Releases record an author: --author, or by default the OS user name.
//
// Shell completion (coordctl completion bash|zsh|fish|powershell) offers
// lock names, election names and config namespaces from coordd, or nothing
// when it does not answer within 2s.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// Exit codes; see the package doc.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitConflict    = 4
	exitUnavailable = 5
	exitDenied      = 6
	exitViolation   = 7
	exitTimeout     = 124
	exitLost        = 125
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// codeError carries an exit code through cobra.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *codeError) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &codeError{code: code, err: err} }

// app holds what every command shares.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	endpoints      []string
	output         string
	timeout        time.Duration
	cacert         string
	cert, key      string
	token          string
	client         *clientlib.Client
	noWait         bool
}

// run runs coordctl with args and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if a.client != nil {
		_ = a.client.Close() // the process is ending: the connection goes either way
	}
	if err == nil {
		return exitOK
	}
	var ce *codeError
	if errors.As(err, &ce) && ce.err == nil {
		return ce.code // a child's exit code: nothing to print
	}
	code := exitCode(err)
	a.printError(err, code)
	return code
}

// printError writes err to stderr: a line of text, or with -o json one
// JSON object (see errorOut). A failed write to stderr is not reported:
// there is nowhere left to report it, and the exit code still says that
// the command failed.
func (a *app) printError(err error, code int) {
	if a.output == "json" {
		_ = json.NewEncoder(a.stderr).Encode(errorOut(err, code))
		return
	}
	var u usageError
	if errors.As(err, &u) && u.named {
		_, _ = fmt.Fprintln(a.stderr, u.msg)
		return
	}
	_, _ = fmt.Fprintln(a.stderr, "coordctl:", describe(err))
}

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	var ce *codeError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case isUsage(err):
		return exitUsage
	case errors.Is(err, context.DeadlineExceeded):
		return exitTimeout
	case errors.Is(err, clientlib.ErrSessionNotFound), errors.Is(err, clientlib.ErrKeyNotFound),
		errors.Is(err, clientlib.ErrNoLeader), errors.Is(err, clientlib.ErrReleaseNotFound), errors.Is(err, clientlib.ErrMemberNotFound),
		errors.Is(err, clientlib.ErrProposalNotFound), errors.Is(err, clientlib.ErrCandidateNotFound):
		return exitNotFound
	case errors.Is(err, clientlib.ErrLockHeld), errors.Is(err, clientlib.ErrStaleToken), errors.Is(err, clientlib.ErrNotHolder),
		errors.Is(err, clientlib.ErrNotLeader), errors.Is(err, clientlib.ErrRevisionMismatch), errors.Is(err, clientlib.ErrLimitMismatch),
		errors.Is(err, clientlib.ErrAlreadyLeader), errors.Is(err, clientlib.ErrMemberChangeRefused), errors.Is(err, clientlib.ErrProposalClosed):
		return exitConflict
	case errors.Is(err, clientlib.ErrUnavailable), errors.Is(err, clientlib.ErrNoSpace), errors.Is(err, clientlib.ErrRateLimited),
		errors.Is(err, clientlib.ErrQuotaExceeded):
		return exitUnavailable
	case errors.Is(err, clientlib.ErrUnauthenticated), errors.Is(err, clientlib.ErrPermissionDenied), errors.Is(err, clientlib.ErrApprovalRequired):
		return exitDenied
	}
	return exitError
}

// usageError marks bad arguments. A message that names the command
// itself (named) is printed without coordctl's prefix.
type usageError struct {
	msg   string
	named bool
}

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{msg: fmt.Sprintf(format, args...)} }

func isUsage(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	// cobra's own argument and flag errors
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand flag") ||
		strings.Contains(msg, "arg(s)") || strings.HasPrefix(msg, "invalid argument") || strings.HasPrefix(msg, "flag needs an argument") ||
		strings.HasPrefix(msg, "required flag")
}

// describe turns an error into the user's words, listing a refused
// write's problems.
func describe(err error) string {
	var ce *clientlib.Error
	if errors.As(err, &ce) && len(ce.Problems) > 0 {
		var b strings.Builder
		b.WriteString(ce.Message)
		for _, p := range ce.Problems {
			if p.Key != "" {
				fmt.Fprintf(&b, "\n  %s: %s", p.Key, p.Description)
			} else {
				fmt.Fprintf(&b, "\n  %s", p.Description)
			}
		}
		return b.String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out (" + err.Error() + ")"
	}
	return err.Error()
}

// version is set at build time (-ldflags "-X main.version=v1.2.3"); else
// the module version the binary was built from, or "dev".
var version = ""

func coordctlVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:     "coordctl",
		Version: coordctlVersion(),
		Short:   "coordctl uses coordd from a shell: sessions, locks, elections, config, cluster",
		Long: `coordctl uses coordd from a shell: sessions, locks (and running a command
under one), elections (and running a command only while leading), the config
center, and cluster status, members and backups.

Endpoints come from --endpoints or COORDD_ENDPOINTS (default 127.0.0.1:7420).
Output is a table, or JSON with -o json: the REST API's JSON (its field
names; ids, tokens, terms, revisions and release numbers as strings; empty
lists as []), one JSON object per line for streams. With -o json an error is
one JSON object on stderr: {"error":{"code","reason","message","exitCode"}}.
Exit codes: 0 ok, 1 error, 2 usage (also an unknown command), 3 not found,
4 conflict (held, stale, not holder or leader, revision mismatch),
5 unavailable (or rate limited: retry later), 6 not allowed, 7 verify found
a violation, 124 a wait timed out, 125 run lost its lock or leadership; run
otherwise exits with the command's own code.

Shell completion (see coordctl completion --help) asks coordd for lock names,
election names and config namespaces.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(_ *cobra.Command, _ []string) error {
			if a.output != "table" && a.output != "json" {
				return usagef("-o must be table or json, not %q", a.output)
			}
			return nil
		},
	}
	def := os.Getenv("COORDD_ENDPOINTS")
	if def == "" {
		def = "127.0.0.1:7420"
	}
	f := root.PersistentFlags()
	f.StringSliceVar(&a.endpoints, "endpoints", strings.Split(def, ","), "coordd gRPC endpoints (env COORDD_ENDPOINTS)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "time limit of one call (waits have their own --wait)")
	f.StringVar(&a.cacert, "cacert", "", "verify coordd's TLS certificate with this CA bundle (PEM); enables TLS")
	f.StringVar(&a.cert, "cert", "", "client certificate for TLS (PEM)")
	f.StringVar(&a.key, "key", "", "private key of --cert (PEM)")
	f.StringVar(&a.token, "token", os.Getenv("COORDD_TOKEN"), "bearer token naming your principal (env COORDD_TOKEN); sent only over TLS or to loopback")
	root.AddCommand(a.sessionCommand(), a.lockCommand(), a.electCommand(), a.configCommand(), a.kvCommand(), a.clusterCommand(), a.memberCommand(), a.snapshotCommand(), a.verifyCommand(), a.barrierCommand())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{msg: err.Error()} })
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	// Now, not when cobra would (on Execute), so its group is checked below.
	root.InitDefaultCompletionCmd()
	checkGroups(root)
	return root
}

// checkGroups makes every command group (a command with subcommands and no
// action of its own, the root included) print its help when called alone
// and fail with a usage error (exit 2) when called with a word that is
// none of its commands. Left alone, cobra prints the help and exits 0.
func checkGroups(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which SuggestionsFor does not apply
		cmd.Args = cobra.ArbitraryArgs
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownCommand(cmd, args[0])
		}
	}
	for _, sub := range cmd.Commands() {
		checkGroups(sub)
	}
}

// unknownCommand is the usage error for a word that is none of cmd's
// commands; for completion, a shell it does not support.
func unknownCommand(cmd *cobra.Command, word string) error {
	path := cmd.CommandPath()
	msg := fmt.Sprintf("%s: unknown command %q", path, word)
	if cmd.Name() == "completion" && cmd.Parent() == cmd.Root() {
		var shells []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				shells = append(shells, sub.Name())
			}
		}
		msg = fmt.Sprintf("%s: unsupported shell %q (supported: %s)", path, word, strings.Join(shells, ", "))
	} else if s := cmd.SuggestionsFor(word); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return usageError{msg: fmt.Sprintf("%s\nrun '%s --help'", msg, path), named: true}
}

// connect returns the client, connecting on first use.
func (a *app) connect(ctx context.Context) (*clientlib.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	c, err := a.dial(ctx, a.endpoints)
	if err != nil {
		return nil, err
	}
	a.client = c
	return c, nil
}

// dial connects a new client to endpoints, with the TLS flags. When every
// endpoint refuses a connection, nothing listens there: it says so at
// once instead of waiting --timeout for a daemon that is not running.
func (a *app) dial(ctx context.Context, endpoints []string) (*clientlib.Client, error) {
	if err := refusedEverywhere(ctx, endpoints); err != nil {
		return nil, err
	}
	// A command makes a call or a few, one after another: a unary RPC
	// each costs less than opening the SDK's call stream first.
	cfg := clientlib.Config{Endpoints: endpoints, DialTimeout: a.timeout, NoWait: a.noWait, UnaryCalls: true}
	if a.cacert != "" || a.cert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if a.cacert != "" {
			pem, err := os.ReadFile(a.cacert)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--cacert %s holds no PEM certificate", a.cacert)
			}
			tc.RootCAs = pool
		}
		if a.cert != "" {
			pair, err := tls.LoadX509KeyPair(a.cert, a.key)
			if err != nil {
				return nil, err
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		cfg.TLS = tc
	}
	cfg.BearerToken = a.token
	return clientlib.New(ctx, cfg)
}

// refusedEverywhere returns an error if every endpoint refused a TCP
// connection. Any other outcome (an answer, a timeout, a name that does
// not resolve yet) leaves it to the client, which waits up to --timeout.
func refusedEverywhere(ctx context.Context, endpoints []string) error {
	for _, ep := range endpoints {
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", ep)
		if err == nil {
			_ = conn.Close() // a probe: the client dials its own connections
			return nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
	}
	return fmt.Errorf("%w: nothing listens at %s (connection refused): is coordd running there? (endpoints come from --endpoints or COORDD_ENDPOINTS)",
		clientlib.ErrUnavailable, strings.Join(endpoints, ", "))
}

// call runs fn with a connected client and a context bounded by --timeout.
func (a *app) call(cmd *cobra.Command, fn func(ctx context.Context, c *clientlib.Client) error) error {
	c, err := a.connect(cmd.Context()) // bounded by --timeout as the dial timeout
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
	defer cancel()
	return fn(ctx, c)
}

// print writes v as JSON (-o json) or the text that table writes, aligned
// in columns at its tabs. The output is made in memory and written to
// stdout at once, so that a failed write (a closed pipe) is the command's
// error, not lost.
func (a *app) print(v any, table func(w *bytes.Buffer)) error {
	var out bytes.Buffer
	if a.output == "json" {
		enc := json.NewEncoder(&out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return err
		}
	} else {
		var text bytes.Buffer
		table(&text)
		tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
		if _, err := tw.Write(text.Bytes()); err != nil {
			return err
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := a.stdout.Write(out.Bytes())
	return err
}

// printLine writes one line of a stream: compact JSON (-o json) or text.
func (a *app) printLine(v any, text string) error {
	if a.output == "json" {
		return json.NewEncoder(a.stdout).Encode(v)
	}
	_, err := fmt.Fprintln(a.stdout, text)
	return err
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

// parseLabels reads k=v pairs.
func parseLabels(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, usagef("label %q is not key=value", p)
		}
		out[k] = v
	}
	return out, nil
}
