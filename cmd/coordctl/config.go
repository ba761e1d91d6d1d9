package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/configvalue"
)

// changeLine prints a change as + (added), - (removed) or ~ (changed); a
// secret's values as (secret).
func changeLine(c clientlib.KeyChange) string {
	if c.Secret {
		hidden := "(secret)"
		c.Old, c.New = hideValue(c.Old, hidden), hideValue(c.New, hidden)
	}
	switch {
	case c.Old == nil:
		return fmt.Sprintf("+ %s = %s", c.Key, *c.New)
	case c.New == nil:
		return fmt.Sprintf("- %s (was %s)", c.Key, *c.Old)
	default:
		return fmt.Sprintf("~ %s = %s (was %s)", c.Key, *c.New, *c.Old)
	}
}

func (a *app) printRelease(r clientlib.ConfigRelease) error {
	return a.print(releaseOut(r), func(w *bytes.Buffer) {
		if len(r.Changes) == 0 {
			fmt.Fprintf(w, "%s: nothing changed (release %d in effect)\n", r.Namespace, r.Number)
			return
		}
		verb := "release"
		if r.Revision == 0 {
			verb = "dry run: would be release"
		}
		fmt.Fprintf(w, "%s %s %d at revision %d\n", r.Namespace, verb, r.Number, r.Revision)
		if r.InheritedFrom != "" {
			fmt.Fprintf(w, "(with %s release %d)\n", r.InheritedFrom, r.InheritedRelease)
		}
		for _, c := range r.Changes {
			fmt.Fprintln(w, changeLine(c))
		}
	})
}

// hideValue is hidden in place of a value that is set.
func hideValue(v *string, hidden string) *string {
	if v == nil {
		return nil
	}
	return &hidden
}

// readInput reads a file, or stdin for "-".
func (a *app) readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(a.stdin)
	}
	return os.ReadFile(path)
}

// jsonKind names what a JSON text holds, for a message.
func jsonKind(t []byte) string {
	switch {
	case len(t) == 0:
		return "nothing"
	case t[0] == '[':
		return "an array"
	case t[0] == '"':
		return "a string"
	case t[0] == 't' || t[0] == 'f':
		return "a boolean"
	case t[0] == 'n':
		return "null"
	case t[0] == '-' || t[0] >= '0' && t[0] <= '9':
		return "a number"
	}
	return "text that is not JSON"
}

// markSecrets marks the puts of keys secret.
func markSecrets(ms []clientlib.ConfigMutation, keys []string) ([]clientlib.ConfigMutation, error) {
	for _, k := range keys {
		i := slices.IndexFunc(ms, func(m clientlib.ConfigMutation) bool { return m.Key == k && !m.Delete })
		if i < 0 {
			return nil, usagef("--secret %s: the file sets no key %s", k, k)
		}
		ms[i].Secret = true
	}
	return ms, nil
}

// valueFlags choose how a publish file's members become values: the
// flags of publish, propose and gray.
type valueFlags struct {
	jsonValues bool
	raw        bool // deprecated: what the default now does
}

func (f *valueFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.jsonValues, "json-values", false, "store every member as its JSON text (\"web\" with its quotes; objects and arrays allowed)")
	cmd.Flags().BoolVar(&f.raw, "raw", false, "no longer needed: string members are stored without their quotes")
	_ = cmd.Flags().MarkDeprecated("raw", "string members are now stored without their quotes by default (see --json-values)")
}

// valuesHelp is the publish file's rule, for the commands' long help.
const valuesHelp = `The file (or stdin with -f -) is one JSON object of keys and values, such
as {"timeout": "5s", "retries": 3}: a string member is stored as its text
(5s, no quotes), a number or a boolean as its JSON text (3, true), and null
deletes the key. A string that would read back as something else keeps its
quotes ("8080" and "true" stay strings for a schema and for Bind; render's
"text" prints them without). Objects and arrays are refused unless
--json-values stores every member as its JSON text, quotes included.`

// mutationsFromJSON reads a publish file: a JSON object whose members are
// the keys to set; null deletes a key. Each value is stored as the text
// that configvalue's rule reads back as the member: a string as itself
// (quoted only when bare it would read as a number, a boolean, null or
// JSON), a number or a boolean as its JSON text; an object or an array is
// refused. With f.jsonValues every member is stored as its JSON text.
func mutationsFromJSON(data []byte, f valueFlags) ([]clientlib.ConfigMutation, error) {
	var doc map[string]json.RawMessage
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' {
		return nil, usagef("the publish file must be one JSON object of keys and values, such as {\"timeout\": \"5s\"}; it holds %s", jsonKind(t))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return nil, usagef("the publish file is not valid JSON at byte %d: %v", syntax.Offset, err)
		}
		return nil, usagef("the publish file must be one JSON object of keys and values: %v", err)
	}
	var out []clientlib.ConfigMutation
	for _, k := range slices.Sorted(maps.Keys(doc)) {
		v := bytes.TrimSpace(doc[k])
		if string(v) == "null" {
			out = append(out, clientlib.ConfigMutation{Key: k, Delete: true})
			continue
		}
		text, err := valueText(k, v, f.jsonValues)
		if err != nil {
			return nil, err
		}
		out = append(out, clientlib.ConfigMutation{Key: k, Value: text})
	}
	return out, nil
}

// valueText is the stored text of one member's JSON value v.
func valueText(key string, v []byte, jsonValues bool) (string, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, v); err != nil {
		return "", err
	}
	switch {
	case jsonValues:
		return compact.String(), nil
	case v[0] == '{' || v[0] == '[':
		return "", usagef("the publish file sets %q to a JSON %s: a value is text (a string, a number or a boolean); write it as a string, or store JSON text with --json-values", key, jsonKind(v))
	case v[0] != '"':
		return compact.String(), nil // a number or a boolean: its text
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", err
	}
	return configvalue.Text(s), nil
}

func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Read, write, publish, watch, render, export, import, inspect history of, roll back and validate config namespaces"}
	get, put, del := a.configGetCommand(), a.configPutCommand(), a.configDeleteCommand()
	publish, snapshot, watch := a.configPublishCommand(), a.configSnapshotCommand(), a.configWatchCommand()
	poll, render := a.configPollCommand(), a.configRenderCommand()
	export, imp := a.configExportCommand(), a.configImportCommand()
	history, diff, rollback := a.configHistoryCommand(), a.configDiffCommand(), a.configRollbackCommand()
	schema, status, gray := a.configSchemaCommand(), a.configStatusCommand(), a.configGrayCommand()
	namespaces := a.listCommand("namespaces [PREFIX]", "List namespaces", "namespace", namespaceNames)
	for _, c := range []*cobra.Command{get, put, del, publish, snapshot, poll, history, diff, rollback, schema, status, namespaces} {
		c.ValidArgsFunction = a.completeFirst(namespaceNames, cobra.ShellCompDirectiveNoFileComp)
	}
	watch.ValidArgsFunction = a.completeEach(namespaceNames)
	export.ValidArgsFunction = a.completeEach(namespaceNames)
	cmd.AddCommand(get, put, del, publish, snapshot, poll, watch, history, diff, rollback, schema, status, namespaces, gray, render, export, imp, a.configRewrapCommand())
	propose, proposals, proposal, approval := a.configProposeCommand(), a.configProposalsCommand(), a.configProposalCommand(), a.configApprovalCommand()
	approve := a.configDecideCommand("approve", "Approve another's proposal: its release is made (four eyes; config.approve)")
	reject := a.configDecideCommand("reject", "Reject another's proposal: no release (config.approve)")
	withdraw := a.configDecideCommand("withdraw", "Withdraw your own proposal (config.propose)")
	inherit := a.configInheritCommand()
	for _, c := range []*cobra.Command{propose, proposals, proposal, approval, approve, reject, withdraw, inherit} {
		c.ValidArgsFunction = a.completeFirst(namespaceNames, cobra.ShellCompDirectiveNoFileComp)
	}
	cmd.AddCommand(propose, proposals, proposal, approval, approve, reject, withdraw, inherit)
	return cmd
}

// releaseFlags are the flags of the commands that publish a release: put,
// delete, publish and rollback.
type releaseFlags struct {
	expect          int64
	author, message string
}

func (f *releaseFlags) add(cmd *cobra.Command) {
	cmd.Flags().Int64Var(&f.expect, "expect", 0, "compare-and-set: fail (exit 4) if the namespace changed after this revision")
	cmd.Flags().StringVar(&f.author, "author", "", "recorded with the release (default: your OS user name)")
	cmd.Flags().StringVarP(&f.message, "message", "m", "", "recorded with the release")
}

// options are the flags as publish options, the author defaulting to osUser.
func (f *releaseFlags) options() clientlib.PublishOptions {
	return clientlib.PublishOptions{ExpectedRevision: f.expect, Author: cmp.Or(f.author, osUser()), Message: f.message}
}

// osUser names the author of a release made without --author: the OS
// user, else $USER, else "coordctl".
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return cmp.Or(os.Getenv("USER"), "coordctl")
}

// configCenter is c's config calls, revealing secrets if reveal.
func configCenter(c *clientlib.Client, reveal bool) *clientlib.ConfigCenter {
	if reveal {
		return c.ConfigCenter().RevealSecrets()
	}
	return c.ConfigCenter()
}

func (a *app) configGetCommand() *cobra.Command {
	var revision int64
	var reveal bool
	get := &cobra.Command{
		Use:   "get NAMESPACE KEY [--reveal]",
		Short: "Print a key's value (exit 3 if missing; a secret needs --reveal)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				v, mod, err := configCenter(c, reveal).Get(ctx, args[0], args[1], revision)
				if errors.Is(err, clientlib.ErrSecretHidden) {
					return usagef("%s in %s is a secret: add --reveal to print it (you need config.read-secret on the namespace)", args[1], args[0])
				}
				if err != nil {
					return err
				}
				return a.print(valueJSON{Key: args[1], Value: v, ModRevision: i64(mod)}, func(w *bytes.Buffer) { fmt.Fprintln(w, v) })
			})
		},
	}
	get.Flags().Int64Var(&revision, "revision", 0, "read at this past revision")
	get.Flags().BoolVar(&reveal, "reveal", false, "print a secret's value in clear (needs config.read-secret)")
	return get
}

func (a *app) configPutCommand() *cobra.Command {
	var rf releaseFlags
	var secret bool
	put := &cobra.Command{
		Use:   "put NAMESPACE KEY VALUE [--secret]",
		Short: "Set one key (VALUE - reads stdin; --secret stores it encrypted)",
		Long: `Set one key: a release of one change. VALUE - reads the value from stdin
(use it for secrets, so they stay out of the shell's history).

--secret stores the value encrypted at rest (the daemon needs
--secret-key-file): only callers allowed config.read-secret read it, with
--reveal, and history, diffs, logs and the console show only that it
changed. A secret key stays secret until it is deleted.`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			value := args[2]
			if value == "-" {
				data, err := io.ReadAll(a.stdin)
				if err != nil {
					return err
				}
				value = string(data)
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				put := c.ConfigCenter().Put
				if secret {
					put = c.ConfigCenter().PutSecret
				}
				r, err := put(ctx, args[0], args[1], value, rf.options())
				if err != nil {
					return err
				}
				return a.printRelease(r)
			})
		},
	}
	rf.add(put)
	put.Flags().BoolVar(&secret, "secret", false, "store the value encrypted; readable only with config.read-secret")
	return put
}

func (a *app) configDeleteCommand() *cobra.Command {
	var rf releaseFlags
	del := &cobra.Command{
		Use:   "delete NAMESPACE KEY",
		Short: "Remove one key",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				r, err := c.ConfigCenter().Delete(ctx, args[0], args[1], rf.options())
				if err != nil {
					return err
				}
				return a.printRelease(r)
			})
		},
	}
	rf.add(del)
	return del
}

func (a *app) configPublishCommand() *cobra.Command {
	var rf releaseFlags
	var file string
	var vf valueFlags
	var dryRun bool
	var secrets []string
	publish := &cobra.Command{
		Use:   "publish NAMESPACE -f FILE",
		Short: "Publish many changes as one atomic release, from a JSON file or stdin (-f -)",
		Long:  "Publish many changes as one atomic release.\n\n" + valuesHelp + "\n\n--secret KEY (repeatable) stores that key's value as a secret.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usagef("-f FILE (or -f - for stdin) is required")
			}
			data, err := a.readInput(file)
			if err != nil {
				return err
			}
			ms, err := mutationsFromJSON(data, vf)
			if err != nil {
				return err
			}
			if ms, err = markSecrets(ms, secrets); err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				o := rf.options()
				o.DryRun = dryRun
				r, err := c.ConfigCenter().Publish(ctx, args[0], ms, o)
				if err != nil {
					return err
				}
				return a.printRelease(r)
			})
		},
	}
	rf.add(publish)
	publish.Flags().StringVarP(&file, "file", "f", "", "JSON object of keys to set (null deletes); - for stdin")
	vf.add(publish)
	publish.Flags().BoolVar(&dryRun, "dry-run", false, "validate and show the changes, write nothing")
	publish.Flags().StringArrayVar(&secrets, "secret", nil, "store this key's value as a secret (repeatable)")
	return publish
}

func (a *app) configSnapshotCommand() *cobra.Command {
	var revision int64
	var reveal bool
	snapshot := &cobra.Command{
		Use:   "snapshot NAMESPACE [--reveal]",
		Short: "Print every key of a namespace, at one revision (secrets as (secret) unless --reveal)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				s, err := configCenter(c, reveal).Snapshot(ctx, args[0], revision)
				if err != nil {
					return err
				}
				return a.print(snapshotOut(s), snapshotTable(s))
			})
		},
	}
	snapshot.Flags().Int64Var(&revision, "revision", 0, "read at this past revision")
	snapshot.Flags().BoolVar(&reveal, "reveal", false, "print secrets in clear (needs config.read-secret)")
	return snapshot
}

// snapshotTable prints a snapshot as its header line and its keys in order.
func snapshotTable(s clientlib.NamespaceSnapshot) func(w *bytes.Buffer) {
	return func(w *bytes.Buffer) {
		fmt.Fprintf(w, "# %s release %d at revision %d\n", s.Namespace, s.Release, s.Revision)
		if s.Inherits != "" {
			fmt.Fprintf(w, "# inherits from %s: keys marked (from %s) come from it\n", s.Inherits, s.Inherits)
		}
		if s.InheritanceSuspended != "" {
			fmt.Fprintf(w, "# inheritance suspended: %s\n", s.InheritanceSuspended)
		}
		keys := make([]string, 0, len(s.Values)+len(s.Hidden))
		for k := range s.Values {
			keys = append(keys, k)
		}
		keys = append(keys, s.Hidden...)
		slices.Sort(keys)
		for _, k := range keys {
			v, ok := s.Values[k]
			if !ok {
				v = "(secret)"
			}
			if slices.Contains(s.Inherited, k) {
				v += "\t(from " + s.Inherits + ")"
			}
			fmt.Fprintf(w, "%s\t%s\n", k, v)
		}
	}
}

func (a *app) configPollCommand() *cobra.Command {
	var after int64
	var wait time.Duration
	poll := &cobra.Command{
		Use:   "poll NAMESPACE --after REVISION",
		Short: "Wait for a release after a revision, then print the snapshot (exit 124 if none came within --wait)",
		Long: `Wait until NAMESPACE has a release after --after (the changedRevision
of the last snapshot you read; 0 answers at once), then print its snapshot
as config snapshot does. If no release comes within --wait, print nothing
and exit 124, so that a shell loop polls again:

  rev=0
  while :; do
    out=$(coordctl config poll app --after "$rev" -o json) || { [ $? = 124 ] && continue; exit 1; }
    rev=$(printf '%s' "$out" | jq -r .changedRevision)
    # ... apply $out ...
  done

A program that can hold a stream follows the namespace with config watch
or the SDK's Subscribe instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wait <= 0 {
				return usagef("--wait must be positive (at most 5m)")
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			// The server answers within wait plus its jitter (wait/16);
			// the call's own deadline leaves room for both and the trip.
			ctx, cancel := context.WithTimeout(cmd.Context(), wait+wait/8+10*time.Second)
			defer cancel()
			s, modified, err := c.ConfigCenter().Poll(ctx, args[0], after, wait)
			if err != nil {
				return err
			}
			if !modified {
				return withCode(exitTimeout, fmt.Errorf("%s had no release after revision %d within %s", args[0], after, wait))
			}
			return a.print(snapshotOut(s), snapshotTable(s))
		},
	}
	poll.Flags().Int64Var(&after, "after", 0, "answer once the namespace has a release after this revision (the last snapshot's changedRevision)")
	poll.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long the server waits for a release (at most 5m)")
	return poll
}

func (a *app) configWatchCommand() *cobra.Command {
	var from int64
	var count int
	var bookmarks bool
	var instance string
	var labels []string
	watch := &cobra.Command{
		Use:   "watch NAMESPACE...",
		Short: "Follow namespaces: the snapshot, then every release (until interrupted, or --count messages)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			lm := map[string]string{}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return usagef("--label %q: want KEY=VALUE", l)
				}
				lm[k] = v
			}
			if len(lm) > 0 && instance == "" {
				return usagef("--label needs --instance")
			}
			n := 0
			stop := errors.New("enough")
			err = c.ConfigCenter().WatchAs(ctx, args, from, instance, lm, func(ev clientlib.ConfigWatchEvent) error {
				if ev.Type == "BOOKMARK" && !bookmarks {
					return nil
				}
				var text string
				switch ev.Type {
				case "SNAPSHOT":
					text = fmt.Sprintf("%d SNAPSHOT", ev.Revision)
					for _, s := range ev.Snapshots {
						text += fmt.Sprintf(" %s@%d(%d keys)", s.Namespace, s.Release, len(s.Values))
						if s.Gray != 0 {
							text += fmt.Sprintf("+gray %d", s.Gray)
						}
					}
				case "CHANGE":
					r := ev.Release
					text = fmt.Sprintf("%d CHANGE %s release %d by %s", ev.Revision, r.Namespace, r.Number, cell(r.Author))
					if ev.Gray != 0 {
						text += fmt.Sprintf(" (under gray %d: the keys it overrides left out)", ev.Gray)
					}
					for _, ch := range r.Changes {
						text += "\n  " + changeLine(ch)
					}
				default:
					text = fmt.Sprintf("%d BOOKMARK", ev.Revision)
				}
				if err := a.printLine(watchOut(ev), text); err != nil {
					return err
				}
				if n++; count > 0 && n >= count {
					return stop
				}
				return nil
			})
			if errors.Is(err, stop) || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	watch.Flags().Int64Var(&from, "from", 0, "resume from this revision (the last seen + 1)")
	watch.Flags().IntVar(&count, "count", 0, "stop after this many messages")
	watch.Flags().BoolVar(&bookmarks, "bookmarks", false, "also print bookmarks")
	watch.Flags().StringVar(&instance, "instance", "", "watch as this instance id: see the gray release whose selector picks it")
	watch.Flags().StringArrayVar(&labels, "label", nil, "with --instance, the instance's label KEY=VALUE (repeatable)")
	return watch
}

func (a *app) configSchemaCommand() *cobra.Command {
	var setFile string
	var remove bool
	schema := &cobra.Command{
		Use:   "schema NAMESPACE [--set FILE | --remove]",
		Short: "Show, set (from a file or stdin) or remove a namespace's JSON Schema",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				switch {
				case remove:
					return c.ConfigCenter().SetSchema(ctx, args[0], "")
				case setFile != "":
					data, err := a.readInput(setFile)
					if err != nil {
						return err
					}
					return c.ConfigCenter().SetSchema(ctx, args[0], string(data))
				}
				s, err := c.ConfigCenter().Schema(ctx, args[0])
				if err != nil {
					return err
				}
				return a.print(schemaJSON{Namespace: args[0], Schema: s}, func(w *bytes.Buffer) { fmt.Fprintln(w, s) })
			})
		},
	}
	schema.Flags().StringVar(&setFile, "set", "", "set the schema from this file (- for stdin)")
	schema.Flags().BoolVar(&remove, "remove", false, "remove the schema")
	return schema
}
