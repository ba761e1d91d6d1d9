package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) memberCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List, add, promote and remove etcd members",
		Long: `List, add, promote and remove the etcd members under coordd (each coordd
embeds one). Grow a cluster one member at a time: add it (it joins as a
learner, which does not vote), start its coordd with the flags add prints,
then promote it once it has caught up.`,
	}
	cmd.AddCommand(a.memberListCommand(), a.memberAddCommand(), a.memberPromoteCommand(), a.memberRemoveCommand())
	return cmd
}

func (a *app) memberListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Members with role, raft term and index, database size, alarms and versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.memberList(cmd)
		},
	}
}

// memberList prints the members with their health.
func (a *app) memberList(cmd *cobra.Command) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		ms, _, err := c.Admin().Members(ctx)
		if err != nil {
			return err
		}
		out := make([]memberJSON, 0, len(ms))
		for _, m := range ms {
			out = append(out, memberOut(m))
		}
		return a.print(out, func(w *bytes.Buffer) { membersTable(w, ms) })
	})
}

func (a *app) memberAddCommand() *cobra.Command {
	var peerURLs []string
	cmd := &cobra.Command{
		Use:   "add NAME --peer-urls URL",
		Short: "Add a member as a learner and print how to start it",
		Long: `Add a member as a learner: it receives the log but does not vote, so the
quorum does not change while it catches up. Start its coordd with the
--initial-cluster and --initial-cluster-state printed here (and an empty
data dir), then run coordctl member promote NAME. One learner at a time.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.memberAdd(cmd, args[0], peerURLs)
		},
	}
	cmd.Flags().StringSliceVar(&peerURLs, "peer-urls", nil, "URLs where the other members reach the new one (its --initial-advertise-peer-urls)")
	return cmd
}

// memberAdd adds member name as a learner and prints how to start it.
func (a *app) memberAdd(cmd *cobra.Command, name string, peerURLs []string) error {
	if len(peerURLs) == 0 {
		return usagef("--peer-urls is required: where the other members reach the new one, e.g. http://10.0.0.4:7423")
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		added, err := c.Admin().AddMember(ctx, name, peerURLs...)
		if err != nil {
			return err
		}
		return a.print(map[string]any{
			"member": memberOut(added.Member), "initialCluster": added.InitialCluster, "initialClusterState": added.InitialClusterState,
		}, func(w *bytes.Buffer) {
			fmt.Fprintf(w, "added %s (%s) as a learner\n", added.Member.Name, added.Member.ID)
			fmt.Fprintf(w, "start it with an empty data dir and:\n")
			fmt.Fprintf(w, "  --name %s --initial-cluster %s --initial-cluster-state %s --initial-advertise-peer-urls %s\n",
				added.Member.Name, added.InitialCluster, added.InitialClusterState, strings.Join(added.Member.PeerURLs, ","))
			fmt.Fprintf(w, "then: coordctl member promote %s\n", added.Member.Name)
		})
	})
}

func (a *app) memberPromoteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "promote NAME|ID",
		Short: "Make a learner a voting member, once it has caught up",
		Long: `Make a learner a voting member. The call waits (up to --timeout) for the
learner to catch up with the leader's log; if it has not by then, it is
refused and nothing changed: run it again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.memberPromote(cmd, args[0])
		},
	}
}

// memberPromote makes the learner member a voting member.
func (a *app) memberPromote(cmd *cobra.Command, member string) error {
	if !cmd.Flags().Changed("timeout") {
		a.timeout = time.Minute // catching up takes a while for a large database
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		m, err := c.Admin().PromoteMember(ctx, member)
		if err != nil {
			return err
		}
		return a.printLine(memberOut(m), fmt.Sprintf("promoted %s (%s): it votes now", m.Name, m.ID))
	})
}

func (a *app) memberRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME|ID",
		Short: "Remove a member for good (its coordd stops)",
		Long: `Remove a member for good: its etcd and its coordd stop, and its data dir
cannot be used again. Refused, with nothing changed: the last voting
member; the leader while a learner is unpromoted; a removal that would
leave no quorum of started members.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.memberRemove(cmd, args[0])
		},
	}
}

// memberRemove removes member for good.
func (a *app) memberRemove(cmd *cobra.Command, member string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		m, err := c.Admin().RemoveMember(ctx, member)
		if err != nil {
			return err
		}
		return a.printLine(memberOut(m), fmt.Sprintf("removed %s (%s)", m.Name, m.ID))
	})
}

// membersTable prints one line per member with its health.
func membersTable(w *bytes.Buffer, ms []clientlib.ClusterMember) {
	fmt.Fprintln(w, "NAME\tID\tROLE\tHEALTH\tTERM\tINDEX\tAPPLIED\tDB (IN USE)\tVERSION\tPEER URLS")
	for _, m := range ms {
		role := "follower"
		switch {
		case m.Leader:
			role = "leader"
		case m.Learner:
			role = "learner"
		}
		name := m.Name
		if name == "" {
			name = "(not started)"
		}
		h := m.Health
		if h == nil {
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t%s\n", name, m.ID, role, strings.Join(m.PeerURLs, ","))
			continue
		}
		health := "ok"
		switch {
		case h.Stale:
			health = "STALE: " + h.Error
		case len(h.Alarms) > 0:
			var as []string
			for _, al := range h.Alarms {
				as = append(as, al.Type)
			}
			health = "ALARM " + strings.Join(as, ",")
		case !h.ReportedAt.IsZero() && time.Since(h.ReportedAt) > 2*time.Second:
			health = fmt.Sprintf("ok (%s ago)", time.Since(h.ReportedAt).Round(time.Second))
		}
		version := h.EtcdVersion
		if h.CoorddVersion != "" {
			version = "coordd " + h.CoorddVersion + ", etcd " + h.EtcdVersion
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s (%s)\t%s\t%s\n", name, m.ID, role, health, h.RaftTerm, h.RaftIndex, h.AppliedIndex,
			bytesStr(h.DBSize), bytesStr(h.DBSizeInUse), version, strings.Join(m.PeerURLs, ","))
	}
}
