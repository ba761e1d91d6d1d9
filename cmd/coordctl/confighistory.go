package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) configHistoryCommand() *cobra.Command {
	var limit int
	history := &cobra.Command{
		Use:   "history NAMESPACE",
		Short: "List a namespace's releases, newest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				rels, err := c.ConfigCenter().Releases(ctx, args[0], 0, limit)
				if err != nil {
					return err
				}
				return a.print(releasesOut(rels), func(w *bytes.Buffer) {
					if len(rels) == 0 {
						fmt.Fprintf(w, "%s has no release yet\n", args[0])
						return
					}
					fmt.Fprintln(w, "RELEASE\tREVISION\tTIME\tAUTHOR\tCHANGES\tMESSAGE")
					for _, r := range rels {
						fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%d\t%s\n", r.Number, r.Revision, ts(r.Time), cell(r.Author), len(r.Changes), cell(r.Message))
					}
				})
			})
		},
	}
	history.Flags().IntVar(&limit, "limit", 20, "releases to show (1-100)")
	return history
}

func (a *app) configDiffCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "diff NAMESPACE FROM TO",
		Short: "Show the key changes between two releases (0 is the empty namespace; gN is gray release N)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, fromGray, err := parseRef(args[1])
			if err != nil {
				return err
			}
			to, toGray, err := parseRef(args[2])
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				changes, err := c.ConfigCenter().DiffGray(ctx, args[0], from, fromGray, to, toGray)
				if err != nil {
					return err
				}
				return a.print(changesOut(changes), func(w *bytes.Buffer) {
					for _, ch := range changes {
						fmt.Fprintln(w, changeLine(ch))
					}
				})
			})
		},
	}
}

func (a *app) configRollbackCommand() *cobra.Command {
	var rf releaseFlags
	rollback := &cobra.Command{
		Use:   "rollback NAMESPACE RELEASE",
		Short: "Publish a new release with an earlier release's content",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			to, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return usagef("RELEASE is a release number")
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				r, err := c.ConfigCenter().Rollback(ctx, args[0], to, rf.options())
				if err != nil {
					return err
				}
				return a.printRelease(r)
			})
		},
	}
	rf.add(rollback)
	return rollback
}

func (a *app) configStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status NAMESPACE",
		Short: "Show which release (and gray release) each instance runs or rejected",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				st, err := c.ConfigCenter().AppliedStatus(ctx, args[0])
				if err != nil {
					return err
				}
				return a.print(applyStatusOut(st), func(w *bytes.Buffer) {
					if len(st.Instances) == 0 {
						fmt.Fprintf(w, "no instance has reported on %s (subscribers report unless they opt out)\n", args[0])
						return
					}
					fmt.Fprintln(w, "INSTANCE\tAPPLIED\tREJECTED\tREPORTED\tREASON")
					for _, in := range st.Instances {
						applied, rej := strconv.FormatInt(in.Applied, 10), "-"
						if in.AppliedGray != 0 {
							applied += fmt.Sprintf("+g%d", in.AppliedGray)
						}
						switch {
						case in.RejectedGray != 0 && in.RejectedGray != in.AppliedGray:
							rej = fmt.Sprintf("%d+g%d", in.Rejected, in.RejectedGray)
						case in.RejectedGray == 0 && in.Rejected > in.Applied:
							rej = strconv.FormatInt(in.Rejected, 10)
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", in.Instance, applied, rej, ts(in.Reported), in.Reason)
					}
				})
			})
		},
	}
}
