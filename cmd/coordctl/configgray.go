package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// grayJSON is REST's GrayRelease.
type grayJSON struct {
	Namespace   string         `json:"namespace"`
	Number      string         `json:"number"`
	Action      string         `json:"action"`
	Selector    selectorJSON   `json:"selector"`
	Overrides   []mutationJSON `json:"overrides"`
	BaseRelease string         `json:"baseRelease"`
	Changes     []changeJSON   `json:"changes"`
	PromotedTo  string         `json:"promotedTo"`
	Author      string         `json:"author"`
	Message     string         `json:"message"`
	Time        string         `json:"time,omitempty"`
	Revision    string         `json:"revision"`
}

// selectorJSON is REST's GraySelector.
type selectorJSON struct {
	Instances []string          `json:"instances"`
	Labels    map[string]string `json:"labels"`
	Percent   int               `json:"percent"`
}

// mutationJSON is REST's ConfigMutation.
type mutationJSON struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Delete bool   `json:"delete"`
}

func grayOut(g clientlib.GrayRelease) grayJSON {
	out := grayJSON{Namespace: g.Namespace, Number: i64(g.Number), Action: "GRAY_ACTION_" + strings.ToUpper(g.Action),
		Selector:    selectorJSON{Instances: append([]string{}, g.Selector.Instances...), Labels: orEmpty(g.Selector.Labels), Percent: g.Selector.Percent},
		Overrides:   make([]mutationJSON, 0, len(g.Overrides)),
		BaseRelease: i64(g.BaseRelease), Changes: changesOut(g.Changes), PromotedTo: i64(g.PromotedTo),
		Author: g.Author, Message: g.Message, Time: timestamp(g.Time), Revision: i64(g.Revision)}
	for _, m := range g.Overrides {
		out.Overrides = append(out.Overrides, mutationJSON{Key: m.Key, Value: m.Value, Delete: m.Delete})
	}
	return out
}

func graysOut(gs []clientlib.GrayRelease) []grayJSON {
	out := make([]grayJSON, 0, len(gs))
	for _, g := range gs {
		out = append(out, grayOut(g))
	}
	return out
}

// selectorText says whom a selector picks, in words.
func selectorText(s clientlib.GraySelector) string {
	var parts []string
	if len(s.Instances) > 0 {
		parts = append(parts, "instances "+strings.Join(s.Instances, ", "))
	}
	if len(s.Labels) > 0 {
		var ls []string
		for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
			ls = append(ls, k+"="+s.Labels[k])
		}
		parts = append(parts, "labels "+strings.Join(ls, ","))
	}
	if s.Percent > 0 {
		parts = append(parts, fmt.Sprintf("%d%% of instances", s.Percent))
	}
	return strings.Join(parts, "; or ")
}

func (a *app) printGray(g clientlib.GrayRelease) error {
	return a.print(grayOut(g), func(w *bytes.Buffer) {
		what := "gray release"
		if g.Revision == 0 {
			what = "dry run: would be gray release"
		}
		fmt.Fprintf(w, "%s %s %d (%s) at revision %d, over release %d\n", g.Namespace, what, g.Number, g.Action, g.Revision, g.BaseRelease)
		switch g.Action {
		case "promote":
			fmt.Fprintf(w, "promoted to release %d; everyone now runs it\n", g.PromotedTo)
		case "abandon":
			fmt.Fprintf(w, "ended; its instances (%s) returned to release %d:\n", selectorText(g.Selector), g.BaseRelease)
		default:
			fmt.Fprintf(w, "for %s; they see:\n", selectorText(g.Selector))
		}
		for _, c := range g.Changes {
			fmt.Fprintln(w, changeLine(c))
		}
	})
}

// grayFlags are the flags that define a gray release: its selector and
// its overrides.
type grayFlags struct {
	instances []string
	labels    []string
	percent   int
	file      string
	values    valueFlags
	set       []string
	del       []string
	expect    int64
	author    string
	message   string
	dryRun    bool
}

func (f *grayFlags) addDefinition(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.instances, "instance", nil, "select this instance id (repeatable)")
	cmd.Flags().StringArrayVar(&f.labels, "label", nil, "select instances with this label, KEY=VALUE (repeatable: all must match)")
	cmd.Flags().IntVar(&f.percent, "percent", 0, "select this percentage of instances (a stable hash of their ids)")
	cmd.Flags().StringVarP(&f.file, "file", "f", "", "overrides as a JSON object, as config publish takes; - for stdin")
	f.values.add(cmd)
	cmd.Flags().StringArrayVar(&f.set, "set", nil, "override KEY=VALUE, the value stored as given (repeatable)")
	cmd.Flags().StringArrayVar(&f.del, "delete", nil, "the gray deletes KEY (repeatable)")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "validate and show what the instances would see, write nothing")
}

func (f *grayFlags) addRecord(cmd *cobra.Command, expect bool) {
	if expect {
		cmd.Flags().Int64Var(&f.expect, "expect-gray", 0, "fail (exit 3) unless this gray release number is the one running")
	}
	cmd.Flags().StringVar(&f.author, "author", "", "recorded with it (default: your OS user name)")
	cmd.Flags().StringVarP(&f.message, "message", "m", "", "recorded with it")
}

func (f *grayFlags) options() clientlib.GrayOptions {
	return clientlib.GrayOptions{ExpectedGray: f.expect, Author: cmp.Or(f.author, osUser()), Message: f.message, DryRun: f.dryRun}
}

// selector is the selector the flags give, nil if none.
func (f *grayFlags) selector() (*clientlib.GraySelector, error) {
	if len(f.instances) == 0 && len(f.labels) == 0 && f.percent == 0 {
		return nil, nil
	}
	sel := &clientlib.GraySelector{Instances: f.instances, Percent: f.percent}
	if len(f.labels) > 0 {
		sel.Labels = map[string]string{}
		for _, l := range f.labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return nil, usagef("--label %q: want KEY=VALUE", l)
			}
			sel.Labels[k] = v
		}
	}
	return sel, nil
}

// overrides are the overrides the flags give, nil if none.
func (a *app) overrides(f *grayFlags) ([]clientlib.ConfigMutation, error) {
	var out []clientlib.ConfigMutation
	if f.file != "" {
		data, err := a.readInput(f.file)
		if err != nil {
			return nil, err
		}
		if out, err = mutationsFromJSON(data, f.values); err != nil {
			return nil, err
		}
	}
	for _, s := range f.set {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, usagef("--set %q: want KEY=VALUE", s)
		}
		out = append(out, clientlib.ConfigMutation{Key: k, Value: v})
	}
	for _, k := range f.del {
		out = append(out, clientlib.ConfigMutation{Key: k, Delete: true})
	}
	return out, nil
}

func (a *app) configGrayCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gray",
		Short: "Canary a change: publish it to some instances first, then promote or abandon it",
		Long: `A gray (canary) release gives overrides to the instances a selector picks
(by instance id, labels, or a percentage), on top of the namespace's normal
content; subscribers see it through the same snapshots and callbacks. Watch
"config status" for who runs it and who rejected it, then promote it (it
becomes the next normal release, for everyone, in one step) or abandon it.
One runs per namespace at a time.`,
	}
	for _, c := range []*cobra.Command{
		a.configGrayCreateCommand(), a.configGrayUpdateCommand(), a.configGrayPromoteCommand(),
		a.configGrayAbandonCommand(), a.configGrayGetCommand(), a.configGrayHistoryCommand(),
	} {
		c.ValidArgsFunction = a.completeFirst(namespaceNames, cobra.ShellCompDirectiveNoFileComp)
		cmd.AddCommand(c)
	}
	return cmd
}

func (a *app) configGrayCreateCommand() *cobra.Command {
	var f grayFlags
	cmd := &cobra.Command{
		Use:   "create NAMESPACE (--instance ID | --label K=V | --percent N)... (--set K=V | --delete K | -f FILE)...",
		Short: "Start a gray release",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayCreate(cmd, args[0], f)
		},
	}
	f.addDefinition(cmd)
	f.addRecord(cmd, false)
	return cmd
}

// configGrayCreate starts a gray release of namespace ns.
func (a *app) configGrayCreate(cmd *cobra.Command, ns string, f grayFlags) error {
	sel, err := f.selector()
	if err != nil {
		return err
	}
	if sel == nil {
		return usagef("say whom it is for: --instance, --label or --percent")
	}
	ms, err := a.overrides(&f)
	if err != nil {
		return err
	}
	if len(ms) == 0 {
		return usagef("say what it changes: --set, --delete or -f")
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		g, err := c.ConfigCenter().CreateGray(ctx, ns, *sel, ms, f.options())
		if err != nil {
			return err
		}
		return a.printGray(g)
	})
}

func (a *app) configGrayUpdateCommand() *cobra.Command {
	var f grayFlags
	cmd := &cobra.Command{
		Use:   "update NAMESPACE [selector flags] [override flags]",
		Short: "Replace the running gray's selector (if any selector flag is given), overrides (if any are given), or both",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayUpdate(cmd, args[0], f)
		},
	}
	f.addDefinition(cmd)
	f.addRecord(cmd, true)
	return cmd
}

// configGrayUpdate replaces the selector, the overrides or both of the gray
// release running in namespace ns.
func (a *app) configGrayUpdate(cmd *cobra.Command, ns string, f grayFlags) error {
	sel, err := f.selector()
	if err != nil {
		return err
	}
	ms, err := a.overrides(&f)
	if err != nil {
		return err
	}
	if sel == nil && len(ms) == 0 {
		return usagef("give a new selector (--instance, --label, --percent) or new overrides (--set, --delete, -f)")
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		g, err := c.ConfigCenter().UpdateGray(ctx, ns, sel, ms, f.options())
		if err != nil {
			return err
		}
		return a.printGray(g)
	})
}

func (a *app) configGrayPromoteCommand() *cobra.Command {
	var f grayFlags
	cmd := &cobra.Command{
		Use:   "promote NAMESPACE",
		Short: "Make the running gray's overrides the next normal release, for everyone, and end the gray",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayPromote(cmd, args[0], f)
		},
	}
	f.addRecord(cmd, true)
	return cmd
}

// configGrayPromote makes the gray release running in namespace ns the
// next normal release.
func (a *app) configGrayPromote(cmd *cobra.Command, ns string, f grayFlags) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		g, _, err := c.ConfigCenter().PromoteGray(ctx, ns, f.options())
		if err != nil {
			return err
		}
		return a.printGray(g)
	})
}

func (a *app) configGrayAbandonCommand() *cobra.Command {
	var f grayFlags
	cmd := &cobra.Command{
		Use:   "abandon NAMESPACE",
		Short: "End the running gray: its instances return to the normal content",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayAbandon(cmd, args[0], f)
		},
	}
	f.addRecord(cmd, true)
	return cmd
}

// configGrayAbandon ends the gray release running in namespace ns.
func (a *app) configGrayAbandon(cmd *cobra.Command, ns string, f grayFlags) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		g, err := c.ConfigCenter().AbandonGray(ctx, ns, f.options())
		if err != nil {
			return err
		}
		return a.printGray(g)
	})
}

func (a *app) configGrayGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAMESPACE",
		Short: "Show the running gray release (exit 3 if none runs)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayGet(cmd, args[0])
		},
	}
}

// configGrayGet prints the gray release running in namespace ns.
func (a *app) configGrayGet(cmd *cobra.Command, ns string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		g, err := c.ConfigCenter().Gray(ctx, ns)
		if err != nil {
			return err
		}
		return a.printGray(g)
	})
}

func (a *app) configGrayHistoryCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "history NAMESPACE",
		Short: "List the gray releases of a namespace, newest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.configGrayHistory(cmd, args[0], limit)
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 20, "records to show (1-100)")
	return cmd
}

// configGrayHistory lists up to limit gray releases of namespace ns,
// newest first.
func (a *app) configGrayHistory(cmd *cobra.Command, ns string, limit int) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		gs, err := c.ConfigCenter().GrayReleases(ctx, ns, 0, limit)
		if err != nil {
			return err
		}
		return a.print(graysOut(gs), func(w *bytes.Buffer) {
			if len(gs) == 0 {
				fmt.Fprintf(w, "%s has had no gray release\n", ns)
				return
			}
			fmt.Fprintln(w, "GRAY\tACTION\tREVISION\tTIME\tAUTHOR\tOVER\tFOR\tOVERRIDES\tMESSAGE")
			for _, g := range gs {
				fmt.Fprintf(w, "g%d\t%s\t%d\t%s\t%s\t%d\t%s\t%d\t%s\n", g.Number, g.Action, g.Revision, ts(g.Time), cell(g.Author), g.BaseRelease, selectorText(g.Selector), len(g.Overrides), cell(g.Message))
			}
		})
	})
}

// parseRef reads a release number, or gN for gray release N.
func parseRef(s string) (int64, bool, error) {
	gray := strings.HasPrefix(s, "g")
	n, err := strconv.ParseInt(strings.TrimPrefix(s, "g"), 10, 64)
	if err != nil || n < 0 {
		return 0, false, usagef("%q: want a release number, or gN for gray release N", s)
	}
	return n, gray, nil
}
