package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/internal/server/daemon"
)

// restoreCommand is coordd restore: a member's data dir from a snapshot.
func restoreCommand() *cobra.Command {
	var (
		cfg  daemon.Config
		opts daemon.RestoreOptions
	)
	cmd := &cobra.Command{
		Use:   "restore --snapshot FILE --data-dir DIR [member flags]",
		Short: "Make a new data dir from a snapshot (coordctl snapshot save), for a new cluster",
		Long: `Make --data-dir the data of a member of a new cluster restored from a
snapshot that coordctl snapshot save wrote. Every member of the new cluster
restores the same snapshot into its own, new data dir, with the member flags
it will start with (--name, --initial-cluster, --initial-advertise-peer-urls
or --listen-peer-urls, --initial-cluster-token); then start them all as usual.

etcd's revision jumps by --bump-revision (a trillion by default) and the
history before it is marked compacted, so no fencing token, term or config
revision handed out after the snapshot is ever handed out again. The
snapshot's sessions are ended when the member first starts, before it
serves: what they held is free, and their owners see their sessions gone.
Everything written after the snapshot is lost.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return usageError{err}
			}
			if opts.Snapshot == "" {
				return usageError{fmt.Errorf("--snapshot is required")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := daemon.Restore(cfg, opts)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s; its %d leases (sessions, and the history recorder's claim) end when the member starts\n", opts.Snapshot, r.DataDir, r.Sessions)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Snapshot, "snapshot", "", "the snapshot file (coordctl snapshot save)")
	f.Uint64Var(&opts.RevisionBump, "bump-revision", daemon.DefaultRevisionBump, "how far etcd's revision jumps past the snapshot's: more than any revisions written since it")
	f.BoolVar(&opts.SkipHashCheck, "skip-hash-check", false, "accept a database file copied from a data dir (it has no hash)")
	f.StringVar(&cfg.DataDir, "data-dir", daemon.DefaultDataDir, "the new member's data dir: must not exist or be empty")
	f.StringVar(&cfg.Name, "name", daemon.DefaultName, "the member's name, as it will start")
	f.StringVar(&cfg.InitialCluster, "initial-cluster", "", `all members as name=peer-url,... (default "<name>=<first advertise peer URL>")`)
	f.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", daemon.DefaultClusterToken, "the new cluster's token")
	f.StringSliceVar(&cfg.ListenPeerURLs, "listen-peer-urls", []string{daemon.DefaultPeerURL}, "URLs this member listens on for its peers")
	f.StringSliceVar(&cfg.AdvertisePeerURLs, "initial-advertise-peer-urls", nil, "URLs peers use to reach this member (default --listen-peer-urls)")
	return cmd
}
