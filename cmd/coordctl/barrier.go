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
	var sessionID, participant string
	var count int
	var wait time.Duration
	enter := &cobra.Command{
		Use:   "enter NAME --count N --session ID",
		Short: "Enter a barrier and wait until it is open: N participants in, or opened (exit 124 if --wait runs out)",
		Long: `Enter the barrier as the session's participant and wait until it opens:
--count participants in it at one revision, or coordctl barrier open.
A participant is bound to its session: when the session ends, it leaves.
If --wait runs out first, the participant is taken out again (exit 124).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sessionID == "" || count < 1 {
				return usagef("--session and --count (at least 1) are required")
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			ctx, cancel := waitCtx(cmd.Context(), wait)
			defer cancel()
			n, err := c.Admin().EnterBarrier(ctx, sessionID, args[0], count, participant)
			if err != nil {
				return err
			}
			return a.printLine(map[string]any{"name": args[0], "participants": n}, fmt.Sprintf("%s is open (%d participants in)", args[0], n))
		},
	}
	leave := &cobra.Command{
		Use:   "leave NAME --session ID",
		Short: "Leave a barrier and wait until every participant has left (a double barrier's exit)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sessionID == "" {
				return usagef("--session is required")
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			ctx, cancel := waitCtx(cmd.Context(), wait)
			defer cancel()
			if err := c.Admin().LeaveBarrier(ctx, sessionID, args[0], participant); err != nil {
				return err
			}
			return a.printLine(map[string]any{"name": args[0], "left": true}, fmt.Sprintf("everyone has left %s", args[0]))
		},
	}
	for _, c := range []*cobra.Command{enter, leave} {
		c.Flags().StringVar(&sessionID, "session", "", "the participant's session (required)")
		c.Flags().StringVar(&participant, "participant", "", "which of the session's participants (default \"default\")")
		c.Flags().DurationVar(&wait, "wait", 0, "give up after this long (exit 124); 0 waits as long as it takes")
	}
	enter.Flags().IntVarP(&count, "count", "n", 0, "how many participants open the barrier (required)")
	open := &cobra.Command{
		Use:   "open NAME",
		Short: "Open a barrier now, however many participants are in",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				if err := c.Admin().OpenBarrier(ctx, args[0]); err != nil {
					return err
				}
				return a.printLine(map[string]any{"name": args[0], "open": true}, args[0]+" is open")
			})
		},
	}
	var pageSize int
	var pageToken string
	status := &cobra.Command{
		Use:   "status NAME",
		Short: "Show whether a barrier is open, how many are in, and its participants",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				st, err := c.Admin().DescribeBarrierPage(ctx, args[0], clientlib.BarrierPage{Size: pageSize, Token: pageToken})
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
		},
	}
	status.Flags().IntVar(&pageSize, "page-size", 1000, "list at most this many participants (1-1000); the count counts all")
	status.Flags().StringVar(&pageToken, "page-token", "", "list the page after the one that printed this token")
	cmd.AddCommand(enter, leave, open, status)
	return cmd
}
