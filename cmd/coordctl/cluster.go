package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Describe the cluster"}
	cmd.AddCommand(a.clusterStatusCommand(), a.clusterAlarmsCommand(), a.clusterDefragCommand(), a.clusterWhoamiCommand())
	return cmd
}

func (a *app) clusterStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Members with their health, etcd leader, revision, database size, alarms and versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.clusterStatus(cmd)
		},
	}
}

// clusterStatus prints the cluster's status and its members.
func (a *app) clusterStatus(cmd *cobra.Command) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		st, err := c.Admin().ClusterStatus(ctx)
		if err != nil {
			return err
		}
		return a.print(clusterOut(st), func(w *bytes.Buffer) {
			fmt.Fprintf(w, "cluster %s, revision %d, raft term %d, coordd %s, etcd %s\n", st.ClusterID, st.Revision, st.RaftTerm, st.CoorddVersion, st.EtcdVersion)
			quota := ""
			if st.Quota > 0 {
				quota = fmt.Sprintf(", quota %s", bytesStr(st.Quota))
			}
			fmt.Fprintf(w, "database %s (%s in use%s) on the answering member\n", bytesStr(st.DBSize), bytesStr(st.DBSizeInUse), quota)
			for _, al := range st.Alarms {
				fmt.Fprintf(w, "ALARM %s raised by member %s %s\n", al.Type, al.MemberID, al.MemberName)
			}
			membersTable(w, st.Members)
		})
	})
}

func (a *app) clusterAlarmsCommand() *cobra.Command {
	var disarm bool
	cmd := &cobra.Command{
		Use:   "alarms",
		Short: "List etcd's active alarms (NOSPACE, CORRUPT); --disarm clears them",
		Long: `List etcd's active alarms. NOSPACE: the database reached its quota
(--quota-backend-bytes): writes that add data fail, reads and releases work.
Make room first (compaction, then coordctl cluster defrag), then clear it
with --disarm; cleared too early, it comes back at the next write that does
not fit. CORRUPT: a member's data differs from the others'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.clusterAlarms(cmd, disarm)
		},
	}
	cmd.Flags().BoolVar(&disarm, "disarm", false, "clear every active alarm")
	return cmd
}

// clusterAlarms lists etcd's active alarms, or with disarm clears them.
func (a *app) clusterAlarms(cmd *cobra.Command, disarm bool) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		list, verb := c.Admin().Alarms, "active"
		if disarm {
			list, verb = c.Admin().DisarmAlarms, "disarmed"
		}
		as, err := list(ctx)
		if err != nil {
			return err
		}
		return a.print(alarmsOut(as), func(w *bytes.Buffer) {
			if len(as) == 0 {
				fmt.Fprintf(w, "no alarm %s\n", map[bool]string{true: "was active", false: "is active"}[disarm])
				return
			}
			fmt.Fprintln(w, "ALARM\tMEMBER\tNAME\tSTATE")
			for _, al := range as {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", al.Type, al.MemberID, al.MemberName, verb)
			}
		})
	})
}

func (a *app) clusterDefragCommand() *cobra.Command {
	var member string
	cmd := &cobra.Command{
		Use:   "defrag",
		Short: "Defragment each member given in --endpoints, one at a time (or only --member NAME)",
		Long: `Defragment members' databases, giving the space compaction freed back to
the file system. Each endpoint in --endpoints is one member; they are
defragmented one after another, never at once, since a member serves
nothing while it defragments. --member NAME picks one of them by name.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.clusterDefrag(cmd, member)
		},
	}
	cmd.Flags().StringVar(&member, "member", "", "defragment only the member of this name")
	return cmd
}

// clusterDefrag defragments the members at --endpoints one after another,
// or only the one named member.
func (a *app) clusterDefrag(cmd *cobra.Command, member string) error {
	timeout := a.timeout
	if !cmd.Flags().Changed("timeout") {
		timeout = 5 * time.Minute // a large database takes a while
	}
	var done []clientlib.Defrag
	var names []string
	for _, ep := range a.endpoints {
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		d, name, err := a.defragOne(ctx, ep, member)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", ep, err)
		}
		names = append(names, name)
		if d != nil {
			done = append(done, *d)
		}
	}
	if member != "" && len(done) == 0 {
		return usagef("--member %q is none of the members at --endpoints (%s)", member, strings.Join(names, ", "))
	}
	return a.print(defragsOut(done), func(w *bytes.Buffer) {
		fmt.Fprintln(w, "MEMBER\tNAME\tBEFORE\tAFTER\tTOOK")
		for _, d := range done {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", d.MemberID, d.MemberName, bytesStr(d.SizeBefore), bytesStr(d.SizeAfter), d.Took)
		}
	})
}

func (a *app) clusterWhoamiCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Who coordd takes you to be: the principal your token or certificate names, and its groups",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.clusterWhoami(cmd)
		},
	}
}

// clusterWhoami prints the principal coordd takes the caller to be.
func (a *app) clusterWhoami(cmd *cobra.Command) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		id, err := c.Admin().WhoAmI(ctx)
		if err != nil {
			return err
		}
		return a.print(whoAmIOut(id), func(w *bytes.Buffer) {
			switch {
			case id.Principal == "" && !id.Policy:
				fmt.Fprintln(w, "anonymous; no policy is in force, so anyone may do anything")
			case id.Principal == "":
				fmt.Fprintln(w, "anonymous")
			default:
				fmt.Fprintf(w, "%s", id.Principal)
				if len(id.Groups) > 0 {
					fmt.Fprintf(w, " (groups: %s)", strings.Join(id.Groups, ", "))
				}
				if !id.Policy {
					fmt.Fprint(w, "; no policy is in force, so anyone may do anything")
				}
				fmt.Fprintln(w)
			}
		})
	})
}

// defragOne defragments the member at endpoint, unless member is set and
// names another; it returns the member's name either way.
func (a *app) defragOne(ctx context.Context, endpoint, member string) (*clientlib.Defrag, string, error) {
	c, err := a.dial(ctx, []string{endpoint})
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = c.Close() }()
	st, err := c.Admin().ClusterStatus(ctx)
	if err != nil {
		return nil, "", err
	}
	name := ""
	for _, m := range st.Members {
		if m.ID == st.MemberID {
			name = m.Name
		}
	}
	if member != "" && member != name {
		return nil, name, nil
	}
	d, err := c.Admin().Defragment(ctx)
	if err != nil {
		return nil, name, err
	}
	return &d, name, nil
}

func bytesStr(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Back up etcd's database"}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Save a backup of etcd's database to FILE (written whole, or not at all)",
		Long: `Save a backup of etcd's database to FILE. Restore it into a new cluster
with coordd restore --snapshot FILE --data-dir DIR (on every member): it
moves the revision past every token handed out since, so fencing tokens
never go backwards, and ends the snapshot's sessions.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			timeout := a.timeout
			if !cmd.Flags().Changed("timeout") {
				timeout = 5 * time.Minute // a backup takes longer than a call
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			tmp, err := os.CreateTemp(filepath.Dir(args[0]), filepath.Base(args[0])+".part-*")
			if err != nil {
				return err
			}
			// Once renamed there is nothing left to remove: the error is
			// expected then, and before it the write's own error is returned.
			defer func() { _ = os.Remove(tmp.Name()) }()
			n, err := c.Admin().SaveSnapshot(ctx, tmp)
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), args[0]); err != nil {
				return err
			}
			return a.print(map[string]any{"file": args[0], "bytes": n}, func(w *bytes.Buffer) {
				fmt.Fprintf(w, "saved %s (%s)\n", args[0], bytesStr(n))
			})
		},
	}
	cmd.AddCommand(save)
	return cmd
}
