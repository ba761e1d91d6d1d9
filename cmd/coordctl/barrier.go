package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

type barrierParticipantJSON struct {
	SessionID   string `json:"sessionId"`
	Participant string `json:"participant"`
	Count       int    `json:"count"`
	Entered     string `json:"entered"`
}

type barrierJSON struct {
	Name             string                   `json:"name"`
	Open             bool                     `json:"open"`
	ParticipantCount int                      `json:"participantCount"`
	Participants     []barrierParticipantJSON `json:"participants"`
	Revision         string                   `json:"revision"`
	NextPageToken    string                   `json:"nextPageToken,omitempty"`
}

func (a *app) barrierCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "barrier", Short: "Barriers and double barriers: wait until N participants are in, leave together"}
	cmd.AddCommand(a.barrierEnterCommand(), a.barrierLeaveCommand(), a.barrierOpenCommand(), a.barrierStatusCommand())
	return cmd
}

// barrierFlags are the flags barrier enter and leave share.
type barrierFlags struct {
	sessionID, participant string
	wait                   time.Duration
}

func (f *barrierFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.sessionID, "session", "", "the participant's session (required)")
	cmd.Flags().StringVar(&f.participant, "participant", "", "which of the session's participants (default \"default\")")
	cmd.Flags().DurationVar(&f.wait, "wait", 0, "give up after this long (exit 124); 0 waits as long as it takes")
}

func (a *app) barrierEnterCommand() *cobra.Command {
	var f barrierFlags
	var count int
	cmd := &cobra.Command{
		Use:   "enter NAME --count N --session ID",
		Short: "Enter a barrier and wait until it is open: N participants in, or opened (exit 124 if --wait runs out)",
		Long: `Enter the barrier as the session's participant and wait until it opens:
--count participants in it at one revision, or coordctl barrier open.
A participant is bound to its session: when the session ends, it leaves.
If --wait runs out first, the participant is taken out again (exit 124).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.barrierEnter(cmd, args[0], f, count)
		},
	}
	f.add(cmd)
	cmd.Flags().IntVarP(&count, "count", "n", 0, "how many participants open the barrier (required)")
	return cmd
}

// barrierEnter enters barrier name and waits until it is open.
func (a *app) barrierEnter(cmd *cobra.Command, name string, f barrierFlags, count int) error {
	if f.sessionID == "" || count < 1 {
		return usagef("--session and --count (at least 1) are required")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(cmd.Context(), f.wait)
	defer cancel()
	n, err := c.Admin().EnterBarrier(ctx, f.sessionID, name, count, f.participant)
	if err != nil {
		return err
	}
	return a.printLine(map[string]any{"name": name, "participants": n}, fmt.Sprintf("%s is open (%d participants in)", name, n))
}

func (a *app) barrierLeaveCommand() *cobra.Command {
	var f barrierFlags
	cmd := &cobra.Command{
		Use:   "leave NAME --session ID",
		Short: "Leave a barrier and wait until every participant has left (a double barrier's exit)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.barrierLeave(cmd, args[0], f)
		},
	}
	f.add(cmd)
	return cmd
}

// barrierLeave leaves barrier name and waits until everyone has left.
func (a *app) barrierLeave(cmd *cobra.Command, name string, f barrierFlags) error {
	if f.sessionID == "" {
		return usagef("--session is required")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(cmd.Context(), f.wait)
	defer cancel()
	if err := c.Admin().LeaveBarrier(ctx, f.sessionID, name, f.participant); err != nil {
		return err
	}
	return a.printLine(map[string]any{"name": name, "left": true}, fmt.Sprintf("everyone has left %s", name))
}

func (a *app) barrierOpenCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "open NAME",
		Short: "Open a barrier now, however many participants are in",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.barrierOpen(cmd, args[0])
		},
	}
}

// barrierOpen opens barrier name.
func (a *app) barrierOpen(cmd *cobra.Command, name string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		if err := c.Admin().OpenBarrier(ctx, name); err != nil {
			return err
		}
		return a.printLine(map[string]any{"name": name, "open": true}, name+" is open")
	})
}

func (a *app) barrierStatusCommand() *cobra.Command {
	var page clientlib.BarrierPage
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show whether a barrier is open, how many are in, and its participants",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.barrierStatus(cmd, args[0], page)
		},
	}
	cmd.Flags().IntVar(&page.Size, "page-size", 1000, "list at most this many participants (1-1000); the count counts all")
	cmd.Flags().StringVar(&page.Token, "page-token", "", "list the page after the one that printed this token")
	return cmd
}

// barrierStatus prints one page of barrier name's state and participants.
func (a *app) barrierStatus(cmd *cobra.Command, name string, page clientlib.BarrierPage) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		st, err := c.Admin().DescribeBarrierPage(ctx, name, page)
		if err != nil {
			return err
		}
		out := barrierJSON{Name: st.Name, Open: st.Open, ParticipantCount: st.ParticipantCount, Revision: i64(st.Revision), Participants: []barrierParticipantJSON{}, NextPageToken: st.NextPageToken}
		for _, p := range st.Participants {
			out.Participants = append(out.Participants, barrierParticipantJSON{SessionID: p.SessionID, Participant: p.Participant, Count: p.Count, Entered: p.Entered.Format(time.RFC3339Nano)})
		}
		return a.print(out, func(w *bytes.Buffer) {
			state := "closed"
			if st.Open {
				state = "open"
			}
			fmt.Fprintf(w, "%s is %s, %d participants in\n", st.Name, state, st.ParticipantCount)
			if len(st.Participants) > 0 {
				fmt.Fprintln(w, "SESSION\tPARTICIPANT\tCOUNT\tENTERED")
			}
			for _, p := range st.Participants {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", p.SessionID, p.Participant, p.Count, ts(p.Entered))
			}
			if st.NextPageToken != "" {
				fmt.Fprintf(w, "# %d listed of %d; the next page: --page-token %s\n", len(st.Participants), st.ParticipantCount, st.NextPageToken)
			}
		})
	})
}
