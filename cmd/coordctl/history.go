package main

import (
	"bytes"
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// historyJSON is a coordd.v1.HistoryEvent as protojson writes it.
type historyJSON struct {
	Type         string `json:"type"`
	Name         string `json:"name"`
	Token        string `json:"token"`
	SessionID    string `json:"sessionId"`
	Owner        string `json:"owner"`
	Principal    string `json:"principal"`
	Hostname     string `json:"hostname"`
	RequestID    string `json:"requestId"`
	Read         bool   `json:"read"`
	Reason       string `json:"reason"`
	Revision     string `json:"revision"`
	FromRevision string `json:"fromRevision"`
	Time         string `json:"time,omitempty"`
	HandedFrom   string `json:"handedFrom"`
	Waited       string `json:"waited,omitempty"`
	Held         string `json:"held,omitempty"`
}

func historyOut(e clientlib.HistoryEvent) historyJSON {
	out := historyJSON{Type: "HISTORY_EVENT_TYPE_" + e.Type, Name: e.Name, Token: e.Token.String(), SessionID: e.SessionID,
		Owner: e.Owner, Principal: e.Principal, Hostname: e.Hostname, RequestID: e.RequestID, Read: e.Read, Reason: e.Reason,
		Revision: i64(e.Revision), FromRevision: i64(e.FromRevision), Time: timestamp(e.Time), HandedFrom: e.HandedFrom.String()}
	if e.Waited > 0 {
		out.Waited = duration(e.Waited)
	}
	if e.Held > 0 {
		out.Held = duration(e.Held)
	}
	return out
}

// historyCommand is `lock history` and `elect history`: what lists looks
// up, what is the noun ("lock", "election").
func (a *app) historyCommand(what string, lists func(*clientlib.Admin, context.Context, string, clientlib.HistoryQuery) iter.Seq2[clientlib.HistoryEvent, error]) *cobra.Command {
	var since, until time.Duration
	var owner string
	var limit int
	var newest bool
	var minRev int64
	cmd := &cobra.Command{
		Use:   "history [NAME]",
		Short: fmt.Sprintf("Who held the %s when: every grant and its end, with token, session, owner and reason", what),
		Long: fmt.Sprintf(`Lists the %[1]s's history, oldest first: every grant and every end of one
(with its reason: released, expired, session closed, resigned), with its
token or term, session, owner and times, as coordd recorded them (kept
for the daemon's --history-retention, 7 days by default). Without NAME,
every %[1]s's. --since 3h starts three hours ago; --newest-first and
--limit show the latest events. Events are recorded within about 250 ms
of their commit: --min-revision waits (up to 10 s) until everything up
to a revision is (a grant's, as acquire and campaign print it).`, what),
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return usagef("--limit %d must not be negative", limit)
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			q := clientlib.HistoryQuery{Owner: owner, NewestFirst: newest, PageSize: min(max(limit, 100), 1000), MinRevision: minRev}
			now := time.Now()
			if since > 0 {
				q.Since = now.Add(-since)
			}
			if until > 0 {
				q.Until = now.Add(-until)
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				var evs []clientlib.HistoryEvent
				for e, err := range lists(c.Admin(), ctx, name, q) {
					if err != nil {
						return err
					}
					evs = append(evs, e)
					if limit > 0 && len(evs) == limit {
						break
					}
				}
				out := make([]historyJSON, 0, len(evs))
				for _, e := range evs {
					out = append(out, historyOut(e))
				}
				if len(evs) == 0 && a.output != "json" {
					return a.printLine(out, fmt.Sprintf("no history of %s in that time", orAll(name, what)))
				}
				return a.print(out, func(w *bytes.Buffer) {
					fmt.Fprintln(w, "TIME\tEVENT\tNAME\tTOKEN\tSESSION\tOWNER\tDETAIL")
					for _, e := range evs {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ts(e.Time), e.Type, e.Name, e.Token, e.SessionID, e.Owner, historyDetail(e))
					}
				})
			})
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, "only events of this long ago or later (e.g. 3h)")
	cmd.Flags().DurationVar(&until, "until", 0, "only events before this long ago (e.g. 1h)")
	cmd.Flags().StringVar(&owner, "owner", "", "only events of sessions with this owner")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most this many events (0: all)")
	cmd.Flags().BoolVar(&newest, "newest-first", false, "list the newest events first")
	cmd.Flags().Int64Var(&minRev, "min-revision", 0, "wait (up to 10s) until the history has recorded every event up to this etcd revision")
	return cmd
}

func orAll(name, what string) string {
	if name == "" {
		return "any " + what
	}
	return what + " " + name
}

// historyDetail is the last column: what else an event says.
func historyDetail(e clientlib.HistoryEvent) string {
	switch {
	case e.Type == "GAP":
		return fmt.Sprintf("revisions %d-%d not recorded: %s", e.FromRevision, e.Revision, e.Reason)
	case e.Reason != "":
		return fmt.Sprintf("%s; held %s", e.Reason, e.Held.Round(time.Millisecond))
	case e.HandedFrom != 0:
		return fmt.Sprintf("handed over from %s after waiting %s", e.HandedFrom, e.Waited.Round(time.Millisecond))
	case e.Waited > 0:
		return fmt.Sprintf("after waiting %s", e.Waited.Round(time.Millisecond))
	}
	return ""
}
