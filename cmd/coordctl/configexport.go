package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) configExportCommand() *cobra.Command {
	var out, secretsKey string
	var prefixes []string
	var history int
	cmd := &cobra.Command{
		Use:   "export [NAMESPACE...] [--prefix P]... --out FILE [--secrets-key KEYFILE] [--history N]",
		Short: "Write namespaces (values and schemas) to one JSON file, all as of one revision",
		Long: `Write namespaces to one JSON file, for config import into another cluster
(or back into this one): each namespace's values, its release number and
its JSON Schema, all as of one etcd revision, however many releases others
make meanwhile. Name namespaces, or --prefix P for every namespace
starting with P; neither exports every namespace. --out - writes to
stdout.

Secrets are left out (listed as hidden_secrets; import leaves them as they
are) unless --secrets-key names a transfer key file (coordd keygen --id
transfer > KEYFILE): each secret is then read in clear (you need
config.read-secret) and sealed with that key before it is written. Give the
same key file to config import, and keep it apart from the export.

--history N adds each namespace's last N releases (author, message, time
and changes; a secret's change without its value): config import makes
them again, so the target keeps who changed what and why.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef("--out FILE is needed (- for stdout)")
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				names := args
				for _, p := range prefixes {
					more, err := c.ConfigCenter().Namespaces(ctx, p)
					if err != nil {
						return err
					}
					names = append(names, more...)
				}
				if len(args) == 0 && len(prefixes) == 0 {
					names = nil // every namespace
				}
				eo := clientlib.ExportOptions{History: history}
				cc := c.ConfigCenter()
				if secretsKey != "" {
					key, err := readTransferKey(secretsKey)
					if err != nil {
						return err
					}
					eo.SecretsKey, cc = key, cc.RevealSecrets()
				}
				exp, err := cc.Export(ctx, names, eo)
				if err != nil {
					return err
				}
				data, err := json.MarshalIndent(exp, "", "  ")
				if err != nil {
					return err
				}
				data = append(data, '\n')
				if out == "-" {
					_, err := a.stdout.Write(data)
					return err
				}
				if err := writeFileAtomically(out, data); err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stderr, "exported %d namespaces as of revision %d to %s\n", len(exp.Namespaces), exp.Revision, out)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the file to write (- for stdout)")
	cmd.Flags().StringSliceVar(&prefixes, "prefix", nil, "export every namespace starting with this")
	cmd.Flags().StringVar(&secretsKey, "secrets-key", "", "export secrets too, sealed with this transfer key file (needs config.read-secret)")
	cmd.Flags().IntVar(&history, "history", 0, fmt.Sprintf("export each namespace's last N releases too (at most %d)", clientlib.MaxExportHistory))
	_ = cmd.MarkFlagFilename("out")
	return cmd
}

// importJSON is one namespace's import under -o json.
type importJSON struct {
	Namespace          string       `json:"namespace"`
	Changes            []changeJSON `json:"changes"`
	SchemaChanged      bool         `json:"schemaChanged"`
	ApprovalChanged    bool         `json:"approvalChanged"`
	InheritanceChanged bool         `json:"inheritanceChanged"`
	Release            string       `json:"release"` // "0": none made
	Revision           string       `json:"revision"`
	Replayed           int          `json:"replayed"` // releases of the file's history made again
}

func (a *app) configImportCommand() *cobra.Command {
	var rf releaseFlags
	var dryRun, merge bool
	var only []string
	var secretsKey string
	cmd := &cobra.Command{
		Use:   "import FILE [--dry-run] [--merge] [--namespace NS]... [--secrets-key KEYFILE]",
		Short: "Make namespaces what an export file says: one release per namespace (--dry-run prints the diff)",
		Long: `Make each namespace of a config export file what the file says: one
release per namespace with every change at once, and the file's schema.
By default a namespace becomes exactly the file's content (keys it has
that the file lacks are deleted); --merge keeps them. Each release is a
compare-and-set against what import read, so a publish made meanwhile
fails the import (exit 4) rather than being overwritten. --dry-run prints
what would change and writes nothing. --namespace imports only those
namespaces of the file. FILE - reads stdin. Namespaces are imported one
after another: on an error, those printed before it were imported.

A file with secrets needs --secrets-key, the transfer key it was exported
with: each secret is opened here and stored as a secret (encrypted by the
target's own keys). Secrets the file left out are kept as they are.

A file exported with --history makes its releases again, each with its
author and message (plus its number and time), after one release to the
content before them; a namespace already as the file says is left alone,
so importing the same file twice changes nothing the second time.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := a.readInput(args[0])
			if err != nil {
				return err
			}
			var exp clientlib.ConfigExport
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&exp); err != nil {
				return usagef("%s is not a coordd config export: %v", args[0], err)
			}
			if exp.Format != clientlib.ExportFormat {
				return usagef("%s is not a coordd config export (its format is %q, want %q)", args[0], exp.Format, clientlib.ExportFormat)
			}
			if len(only) > 0 {
				var missing []string
				for _, ns := range only {
					if !slices.ContainsFunc(exp.Namespaces, func(n clientlib.ExportedNamespace) bool { return n.Name == ns }) {
						missing = append(missing, ns)
					}
				}
				if len(missing) > 0 {
					return usagef("%s has no namespace %s", args[0], strings.Join(missing, ", "))
				}
				exp.Namespaces = slices.DeleteFunc(exp.Namespaces, func(n clientlib.ExportedNamespace) bool { return !slices.Contains(only, n.Name) })
			}
			o := rf.options()
			io := clientlib.ImportOptions{DryRun: dryRun, Merge: merge, Author: o.Author, Message: cmp.Or(o.Message, "imported from "+filepath.Base(args[0]))}
			if secretsKey != "" {
				if io.SecretsKey, err = readTransferKey(secretsKey); err != nil {
					return err
				}
			} else if exp.SecretsKey != "" {
				return usagef("%s holds secrets sealed with transfer key %q: give it with --secrets-key", args[0], exp.SecretsKey)
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				results, err := c.ConfigCenter().Import(ctx, exp, io)
				if err != nil && len(results) == 0 {
					return err // nothing imported: the error says why
				}
				if perr := a.printImport(results, dryRun); perr != nil {
					return errors.Join(err, perr)
				}
				return err
			})
		},
	}
	rf.add(cmd)
	_ = cmd.Flags().MarkHidden("expect") // each namespace is compared with what import read
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would change; write nothing")
	cmd.Flags().BoolVar(&merge, "merge", false, "keep keys the namespace has that the file lacks")
	cmd.Flags().StringSliceVar(&only, "namespace", nil, "import only this namespace of the file")
	cmd.Flags().StringVar(&secretsKey, "secrets-key", "", "the transfer key file the export's secrets were sealed with")
	return cmd
}

func (a *app) printImport(results []clientlib.ImportResult, dryRun bool) error {
	out := make([]importJSON, 0, len(results))
	for _, r := range results {
		out = append(out, importJSON{Namespace: r.Namespace, Changes: changesOut(r.Changes), SchemaChanged: r.SchemaChanged, ApprovalChanged: r.ApprovalChanged, InheritanceChanged: r.InheritanceChanged, Release: i64(r.Release.Number), Revision: i64(r.Release.Revision), Replayed: r.Replayed})
	}
	return a.print(out, func(w *bytes.Buffer) {
		for _, r := range results {
			schema := ""
			if r.SchemaChanged {
				schema = ", and its schema"
			}
			if r.ApprovalChanged {
				schema += ", and its approval policy"
			}
			if r.InheritanceChanged {
				schema += ", and what it inherits"
			}
			if r.Replayed > 0 {
				verb := "replayed"
				if dryRun {
					verb = "replaying"
				}
				noun := "releases"
				if r.Replayed == 1 {
					noun = "release"
				}
				schema += fmt.Sprintf(", %s %d %s of its history", verb, r.Replayed, noun)
			}
			switch {
			case len(r.Changes) == 0 && !r.SchemaChanged && !r.ApprovalChanged && !r.InheritanceChanged:
				fmt.Fprintf(w, "%s: unchanged\n", r.Namespace)
				continue
			case dryRun:
				fmt.Fprintf(w, "%s: would change %d keys%s\n", r.Namespace, len(r.Changes), schema)
			case len(r.Changes) == 0:
				fmt.Fprintf(w, "%s: content unchanged%s\n", r.Namespace, strings.Replace(schema, ", and its", ", set its", 1))
			default:
				fmt.Fprintf(w, "%s: release %d at revision %d, %d keys changed%s\n", r.Namespace, r.Release.Number, r.Release.Revision, len(r.Changes), schema)
			}
			for _, ch := range r.Changes {
				fmt.Fprintln(w, "  "+changeLine(ch))
			}
			for _, k := range r.Skipped {
				fmt.Fprintf(w, "  ! %s: a secret the file left out, and %s lacks it: not created\n", k, r.Namespace)
			}
		}
		if len(results) == 0 {
			fmt.Fprintln(w, "nothing imported: the file has no namespace")
		}
	})
}

// writeFileAtomically writes data beside path, syncs it and renames it
// over path: a reader sees the old file or the new one.
func writeFileAtomically(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// readTransferKey reads a transfer key file (as coordd keygen writes).
func readTransferKey(path string) (clientlib.TransferKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--secrets-key: %v", err)
	}
	key, err := clientlib.ParseTransferKey(data)
	if err != nil {
		return nil, usagef("--secrets-key %s: %v", path, err)
	}
	return key, nil
}

func (a *app) configRewrapCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rewrap-keys",
		Short: "Rewrap every namespace's secret data key with the member's primary key (after a key rotation)",
		Long: `Have the member rewrap every namespace's data key with the primary (first)
key of its --secret-key-file. Run it after putting a new key first in every
member's key file and sending them SIGHUP; once it reports that no data key
is wrapped by the old key, remove the old key from the files. No value is
encrypted again, and readers never stop. Needs cluster.admin.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				res, err := c.ConfigCenter().RewrapSecretKeys(ctx)
				if err != nil {
					return err
				}
				return a.print(res, func(w *bytes.Buffer) {
					fmt.Fprintf(w, "rewrapped %d data keys with key %s\n", res.Rewrapped, res.Primary)
					for _, k := range slices.Sorted(maps.Keys(res.ByKey)) {
						fmt.Fprintf(w, "%s\twraps %d data keys\n", k, res.ByKey[k])
					}
				})
			})
		},
	}
}
