package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) configInheritCommand() *cobra.Command {
	var rf releaseFlags
	var off bool
	cmd := &cobra.Command{
		Use:   "inherit NAMESPACE (SHARED | --off)",
		Short: "Make a namespace inherit a shared namespace's keys under its own (or stop)",
		Long: `Make NAMESPACE inherit from SHARED, as Apollo's public namespaces: its
content becomes SHARED's keys under its own (its own key of a name wins).
Each release of SHARED reaches it as one release of NAMESPACE that says
which SHARED release it carries; deleting an override brings the shared
value back. --off stops inheriting: only NAMESPACE's own keys stay. Each is
one release. Needs config.admin on NAMESPACE and config.read on SHARED.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			shared := ""
			switch {
			case off && len(args) == 1:
			case !off && len(args) == 2:
				shared = args[1]
			default:
				return usagef("give SHARED, or --off")
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				r, err := c.ConfigCenter().Inherit(ctx, args[0], shared, rf.options())
				if err != nil {
					return err
				}
				return a.printRelease(r)
			})
		},
	}
	rf.add(cmd)
	_ = cmd.Flags().MarkHidden("expect")
	cmd.Flags().BoolVar(&off, "off", false, "stop inheriting")
	return cmd
}
