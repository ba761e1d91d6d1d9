package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func labelString(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (a *app) sessionCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Create, renew, list, describe and close sessions"}
	cmd.AddCommand(a.sessionCreateCommand(), a.sessionKeepaliveCommand(), a.sessionListCommand(), a.sessionGetCommand(), a.sessionCloseCommand())
	return cmd
}

// sessionCreateOptions are the flags of session create.
type sessionCreateOptions struct {
	ttl    time.Duration
	owner  string
	labels []string
}

func (a *app) sessionCreateCommand() *cobra.Command {
	var o sessionCreateOptions
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a session (nobody keeps it alive: renew it with keepalive)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.sessionCreate(cmd, o)
		},
	}
	cmd.Flags().DurationVar(&o.ttl, "ttl", 60*time.Second, "time to live without a renewal (2s to 1h)")
	cmd.Flags().StringVar(&o.owner, "owner", "coordctl", "who owns the session")
	cmd.Flags().StringArrayVar(&o.labels, "label", nil, "key=value label (repeatable)")
	return cmd
}

// sessionCreate creates a session and prints it.
func (a *app) sessionCreate(cmd *cobra.Command, o sessionCreateOptions) error {
	lbl, err := parseLabels(o.labels)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		s, err := c.Admin().CreateSession(ctx, o.ttl, o.owner, host, lbl)
		if err != nil {
			return err
		}
		return a.print(sessionOut(s), func(w *bytes.Buffer) {
			fmt.Fprintf(w, "ID\tTTL\tOWNER\n%s\t%s\t%s\n", s.ID, s.TTL, s.Owner)
		})
	})
}

func (a *app) sessionKeepaliveCommand() *cobra.Command {
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "keepalive ID",
		Short: "Renew a session once, or every --every until interrupted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.sessionKeepalive(cmd, args[0], every)
		},
	}
	cmd.Flags().DurationVar(&every, "every", 0, "renew repeatedly at this interval (for example a third of the TTL)")
	return cmd
}

// sessionKeepalive renews session id once, or every every until
// interrupted.
func (a *app) sessionKeepalive(cmd *cobra.Command, id string, every time.Duration) error {
	for {
		err := a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
			granted, err := c.Admin().KeepAliveSession(ctx, id)
			if err != nil {
				return err
			}
			return a.printLine(keepAliveJSON{SessionID: id, TTL: duration(granted)}, fmt.Sprintf("%s renewed for %s", id, granted))
		})
		if err != nil || every == 0 {
			return err
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(every):
		}
	}
}

func (a *app) sessionListCommand() *cobra.Command {
	var long bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List live sessions (with -l, each one's time left and what it holds)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.sessionList(cmd, long)
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "also each session's time left and the locks and elections it holds or waits for (one lease read per session)")
	return cmd
}

// sessionList lists the live sessions; with long, also each one's time
// left and holdings.
func (a *app) sessionList(cmd *cobra.Command, long bool) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		list := c.Admin().ListSessions
		if long {
			list = c.Admin().ListSessionsDetailed
		}
		ss, err := list(ctx)
		if err != nil {
			return err
		}
		out := make([]sessionJSON, 0, len(ss))
		for _, s := range ss {
			out = append(out, sessionOut(s))
		}
		return a.print(out, func(w *bytes.Buffer) {
			if len(ss) == 0 {
				fmt.Fprintln(w, "no live session")
				return
			}
			if !long {
				fmt.Fprintln(w, "ID\tTTL\tOWNER\tHOST\tCREATED\tLABELS")
				for _, s := range ss {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.TTL, s.Owner, s.Hostname, ts(s.Created), labelString(s.Labels))
				}
				return
			}
			fmt.Fprintln(w, "ID\tTTL\tLEFT\tOWNER\tHOST\tLOCKS\tELECTIONS\tLABELS")
			for _, s := range ss {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.TTL, s.Remaining, s.Owner, s.Hostname,
					orDash(strings.Join(s.Locks, ",")), orDash(strings.Join(s.Elections, ",")), labelString(s.Labels))
			}
		})
	})
}

func (a *app) sessionGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Describe a session, with its remaining TTL",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.sessionGet(cmd, args[0])
		},
	}
}

// sessionGet prints session id with its remaining TTL.
func (a *app) sessionGet(cmd *cobra.Command, id string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		s, err := c.Admin().GetSession(ctx, id)
		if err != nil {
			return err
		}
		return a.print(sessionOut(s), func(w *bytes.Buffer) {
			fmt.Fprintf(w, "ID\t%s\nTTL\t%s\nREMAINING\t%s\nOWNER\t%s\nHOST\t%s\nCREATED\t%s\nLABELS\t%s\nLOCKS\t%s\nELECTIONS\t%s\n",
				s.ID, s.TTL, s.Remaining, s.Owner, s.Hostname, ts(s.Created), labelString(s.Labels), strings.Join(s.Locks, " "), strings.Join(s.Elections, " "))
		})
	})
}

func (a *app) sessionCloseCommand() *cobra.Command {
	var rf revokeFlags
	var byOwner bool
	cmd := &cobra.Command{
		Use:   "close ID",
		Short: "Close a session: from outside, the holders of its locks and leaderships are asked to let go first",
		Long: `Close a session and end everything attached to it. With --owner the
caller is the session's owner (the script that created it), which has
stopped acting on its locks and leaderships: they end at once. Without it
the close is from outside: each holder is asked to let go first, as by
lock release (the next holder is granted once it does, or at the bound).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.sessionClose(cmd, args[0], rf, byOwner)
		},
	}
	cmd.Flags().BoolVar(&byOwner, "owner", false, "the caller owns the session and has stopped acting on its holdings: end them at once")
	cmd.Flags().BoolVar(&rf.force, "force", false, "end them at once without asking the holders (a hung process): only fencing protects")
	cmd.Flags().DurationVar(&rf.within, "within", 0, "how long each holder may take to let go (default and at most: the session's TTL)")
	return cmd
}

// sessionClose closes session id; byOwner, as its owner.
func (a *app) sessionClose(cmd *cobra.Command, id string, rf revokeFlags, byOwner bool) error {
	if byOwner {
		rf.holder = id
	}
	return rf.call(a, cmd, func(ctx context.Context, c *clientlib.Client) error {
		return c.Admin().CloseSession(ctx, id, rf.options()...)
	})
}

// orDash is s, or "-" when empty (a table cell must not be blank).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
