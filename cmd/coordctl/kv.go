package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// keyValueJSON is KeyValue as the REST API writes it (value in base64, as
// protojson writes bytes).
type keyValueJSON struct {
	Key            string `json:"key"`
	Value          []byte `json:"value"`
	CreateRevision string `json:"createRevision"`
	ModRevision    string `json:"modRevision"`
	Version        string `json:"version"`
}

func keyValueOut(kv clientlib.KeyValue) keyValueJSON {
	return keyValueJSON{Key: kv.Key, Value: kv.Value, CreateRevision: i64(kv.CreateRevision), ModRevision: i64(kv.ModRevision), Version: i64(kv.Version)}
}

type kvEventJSON struct {
	Type string       `json:"type"`
	KV   keyValueJSON `json:"kv"`
}

type getKVJSON struct {
	KV       keyValueJSON `json:"kv"`
	Revision string       `json:"revision"`
}

// kvWriteJSON is FencedPutResponse and FencedDeleteResponse.
type kvWriteJSON struct {
	Revision string `json:"revision"`
}

func (a *app) kvCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "Read coordd's fenced KV; write it under a lock's token or a leadership term"}
	cmd.AddCommand(a.kvGetCommand(), a.kvListCommand(), a.kvWatchCommand(), a.kvPutCommand(), a.kvDeleteCommand())
	return cmd
}

func (a *app) kvGetCommand() *cobra.Command {
	var rev int64
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print a key's value (exit 3 if there is no such key)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.kvGet(cmd, args[0], rev)
		},
	}
	cmd.Flags().Int64Var(&rev, "revision", 0, "read the key as it was at this revision")
	return cmd
}

// kvGet prints the value of key, as of revision rev if not 0.
func (a *app) kvGet(cmd *cobra.Command, key string, rev int64) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		kv, at, err := c.KV().Get(ctx, key, rev)
		if err != nil {
			return err
		}
		if a.output == "json" {
			return a.print(getKVJSON{KV: keyValueOut(kv), Revision: i64(at)}, nil)
		}
		_, err = a.stdout.Write(append(kv.Value, '\n'))
		return err
	})
}

// kvListOptions are the flags of kv list.
type kvListOptions struct {
	rev      int64
	keysOnly bool
}

func (a *app) kvListCommand() *cobra.Command {
	var o kvListOptions
	cmd := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List the keys under a prefix with their revisions and values, one snapshot",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.kvList(cmd, args, o)
		},
	}
	cmd.Flags().Int64Var(&o.rev, "revision", 0, "list the keys as they were at this revision")
	cmd.Flags().BoolVar(&o.keysOnly, "keys-only", false, "leave values out")
	return cmd
}

// kvList lists the keys under the prefix in args (all keys if none), every
// page from one snapshot.
func (a *app) kvList(cmd *cobra.Command, args []string, o kvListOptions) error {
	prefix := ""
	if len(args) == 1 {
		prefix = args[0]
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		var all []clientlib.KeyValue
		lo := clientlib.ListOptions{PageSize: 1000, Revision: o.rev, KeysOnly: o.keysOnly}
		for {
			p, err := c.KV().List(ctx, prefix, lo)
			if err != nil {
				return err
			}
			all = append(all, p.KVs...)
			if p.Next == "" {
				break
			}
			lo.PageToken, lo.Revision = p.Next, p.Revision // the same snapshot
		}
		out := make([]keyValueJSON, 0, len(all))
		for _, kv := range all {
			out = append(out, keyValueOut(kv))
		}
		return a.print(out, func(w *bytes.Buffer) {
			if len(all) == 0 {
				fmt.Fprintln(w, "no key")
				return
			}
			fmt.Fprintln(w, "KEY\tMOD-REVISION\tVERSION\tVALUE")
			for _, kv := range all {
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", kv.Key, kv.ModRevision, kv.Version, printable(kv.Value))
			}
		})
	})
}

// kvWatchOptions are the flags of kv watch.
type kvWatchOptions struct {
	from  int64
	count int
}

func (a *app) kvWatchCommand() *cobra.Command {
	var o kvWatchOptions
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Follow the changes under a prefix: one line per change, until interrupted (or --count changes)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.kvWatch(cmd, args, o)
		},
	}
	cmd.Flags().Int64Var(&o.from, "from", 0, "start at this revision (the last seen + 1); 0: changes from now on")
	cmd.Flags().IntVar(&o.count, "count", 0, "stop after this many changes")
	return cmd
}

// kvWatch prints the changes under the prefix in args (all keys if none),
// one a line, until interrupted or --count changes.
func (a *app) kvWatch(cmd *cobra.Command, args []string, o kvWatchOptions) error {
	prefix := ""
	if len(args) == 1 {
		prefix = args[0]
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	c, err := a.connect(ctx)
	if err != nil {
		return err
	}
	w := c.KV().Watch(ctx, prefix, o.from)
	n := 0
	for ev := range w.Events() {
		typ, text := "KV_EVENT_TYPE_PUT", fmt.Sprintf("%d PUT %s %s", ev.KV.ModRevision, ev.KV.Key, printable(ev.KV.Value))
		if ev.Deleted {
			typ, text = "KV_EVENT_TYPE_DELETE", fmt.Sprintf("%d DELETE %s", ev.KV.ModRevision, ev.KV.Key)
		}
		if err := a.printLine(kvEventJSON{Type: typ, KV: keyValueOut(ev.KV)}, text); err != nil {
			return err
		}
		if n++; o.count > 0 && n >= o.count {
			return nil
		}
	}
	if err := w.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// fenceFlags are the flags kv put and delete share: the fence of the write.
type fenceFlags struct {
	f     clientlib.Fence
	token string
}

func (ff *fenceFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&ff.f.Lock, "lock", "", "the lock whose grant fences the write")
	cmd.Flags().StringVar(&ff.f.Election, "election", "", "the election whose leadership fences the write (instead of --lock)")
	cmd.Flags().StringVar(&ff.token, "token", "", "the grant's fencing token, or the leader's term (required)")
}

// fence checks the flags and returns the fence they give.
func (ff *fenceFlags) fence() (clientlib.Fence, error) {
	f := ff.f
	if (f.Lock == "") == (f.Election == "") {
		return f, usagef("give exactly one of --lock and --election")
	}
	if ff.token == "" {
		return f, usagef("--token is required: the grant's token (coordctl lock acquire) or the leader's term")
	}
	t, err := parseToken(ff.token)
	f.Token = t
	return f, err
}

func (a *app) kvPutCommand() *cobra.Command {
	var ff fenceFlags
	cmd := &cobra.Command{
		Use:   "put KEY VALUE --lock NAME --token N",
		Short: "Write a key, only if the token still holds the lock (or leads the election); VALUE - reads stdin",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.kvPut(cmd, args[0], args[1], ff)
		},
	}
	ff.add(cmd)
	return cmd
}

// kvPut writes key, fenced; a value of - is read from stdin.
func (a *app) kvPut(cmd *cobra.Command, key, valueArg string, ff fenceFlags) error {
	f, err := ff.fence()
	if err != nil {
		return err
	}
	value := []byte(valueArg)
	if valueArg == "-" {
		if value, err = io.ReadAll(a.stdin); err != nil {
			return err
		}
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		rev, err := c.Admin().FencedPut(ctx, f, key, value)
		if err != nil {
			return err
		}
		return a.printLine(kvWriteJSON{Revision: i64(rev)}, fmt.Sprintf("written at revision %d", rev))
	})
}

func (a *app) kvDeleteCommand() *cobra.Command {
	var ff fenceFlags
	cmd := &cobra.Command{
		Use:   "delete KEY --lock NAME --token N",
		Short: "Delete a key, only if the token still holds the lock (or leads the election)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.kvDelete(cmd, args[0], ff)
		},
	}
	ff.add(cmd)
	return cmd
}

// kvDelete deletes key, fenced.
func (a *app) kvDelete(cmd *cobra.Command, key string, ff fenceFlags) error {
	f, err := ff.fence()
	if err != nil {
		return err
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		rev, err := c.Admin().FencedDelete(ctx, f, key)
		if err != nil {
			return err
		}
		return a.printLine(kvWriteJSON{Revision: i64(rev)}, fmt.Sprintf("deleted at revision %d", rev))
	})
}

// printable is a value for a table: as is when it is printable UTF-8, else
// its size.
func printable(v []byte) string {
	for _, r := range string(v) {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return fmt.Sprintf("(%d bytes)", len(v))
		}
	}
	return string(v)
}
