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
	status := &cobra.Command{
		Use:   "status",
		Short: "Members, etcd leader, revision, database size and versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				st, err := c.Admin().ClusterStatus(ctx)
				if err != nil {
					return err
				}
				return a.print(clusterOut(st), func(w *bytes.Buffer) {
					fmt.Fprintf(w, "cluster %s, revision %d, raft term %d, coordd %s, etcd %s\n", st.ClusterID, st.Revision, st.RaftTerm, st.CoorddVersion, st.EtcdVersion)
					fmt.Fprintf(w, "database %s (%s in use) on the answering member\n", bytesStr(st.DBSize), bytesStr(st.DBSizeInUse))
					fmt.Fprintln(w, "MEMBER\tNAME\tROLE\tPEER URLS")
					for _, m := range st.Members {
						role := "follower"
						switch {
						case m.Leader:
							role = "leader"
						case m.Learner:
							role = "learner"
						}
						if m.ID == st.MemberID {
							role += " (answering)"
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.ID, m.Name, role, strings.Join(m.PeerURLs, ","))
					}
				})
			})
		},
	}
	cmd.AddCommand(status)
	return cmd
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
		Long: `Save a backup of etcd's database to FILE. Restore it with
etcdutl snapshot restore FILE --bump-revision 1000000000 --mark-compacted:
bumping the revision keeps fencing tokens from ever going backwards.`,
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
