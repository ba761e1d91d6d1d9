package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

func (a *app) electCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "elect", Short: "Campaign, proclaim, resign, hand over, see leaders and candidates, follow leaders; run a command only while leading"}
	campaign, proclaim, resign, transfer := a.electCampaignCommand(), a.electProclaimCommand(), a.electResignCommand(), a.electTransferCommand()
	leader, candidates, observe := a.electLeaderCommand(), a.electCandidatesCommand(), a.electObserveCommand()
	list := a.listCommand("list [PREFIX]", "List elections that have a leader or candidates", "election has a leader or candidates", electionNames)

	for _, c := range []*cobra.Command{campaign, proclaim, resign, transfer, leader, candidates, observe, list} {
		c.ValidArgsFunction = a.completeFirst(electionNames, cobra.ShellCompDirectiveNoFileComp)
	}
	history := a.historyCommand("election", (*clientlib.Admin).ElectionHistory)
	history.ValidArgsFunction = a.completeFirst(electionNames, cobra.ShellCompDirectiveNoFileComp)
	cmd.AddCommand(campaign, proclaim, resign, transfer, leader, candidates, observe, list, history, a.electRunCommand())
	return cmd
}

// electCampaignOptions are the flags of elect campaign.
type electCampaignOptions struct {
	sessionID, requestID string
	wait                 time.Duration
	priority             int32
	preempt              bool
}

func (a *app) electCampaignCommand() *cobra.Command {
	var o electCampaignOptions
	cmd := &cobra.Command{
		Use:   "campaign NAME VALUE --session ID",
		Short: "Campaign for a session you keep alive; prints the term once elected",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electCampaign(cmd, args[0], args[1], o)
		},
	}
	cmd.Flags().StringVar(&o.sessionID, "session", "", "the candidate's session (required)")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "give up after this long (exit 124); 0 waits as long as it takes")
	cmd.Flags().Int32Var(&o.priority, "priority", 0, "the campaign's priority: when the seat is given, the highest priority waiting takes it (ties in arrival order)")
	cmd.Flags().BoolVar(&o.preempt, "preempt", false, "ask a leader of lower priority to step down (it chooses when)")
	cmd.Flags().StringVar(&o.requestID, "request-id", "", "the campaign's idempotency key: run again with the same session and id after a --wait ran out or an answer was lost, and it resumes that campaign (or prints its term) instead of queueing another")
	return cmd
}

// electCampaign campaigns in election name with value and prints the term
// once elected.
func (a *app) electCampaign(cmd *cobra.Command, name, value string, o electCampaignOptions) error {
	if o.sessionID == "" {
		return usagef("--session is required (see coordctl session create)")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx, cancel := waitCtx(cmd.Context(), o.wait)
	defer cancel()
	var opts []clientlib.CampaignOption
	if o.requestID != "" {
		opts = append(opts, clientlib.WithRequestID(o.requestID))
	}
	opts = append(opts, rankOptions(o.priority, o.preempt)...)
	term, err := c.Admin().Campaign(ctx, o.sessionID, name, value, opts...)
	if err != nil {
		return err
	}
	return a.print(leadershipJSON{Name: name, Term: term.String(), Value: value, SessionID: o.sessionID}, func(w *bytes.Buffer) {
		fmt.Fprintf(w, "NAME\tTERM\tSESSION\n%s\t%s\t%s\n", name, term, o.sessionID)
	})
}

func (a *app) electProclaimCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "proclaim NAME TERM VALUE",
		Short: "Replace the leader's value (exit 4 if the term does not lead)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electProclaim(cmd, args[0], args[1], args[2])
		},
	}
}

// electProclaim replaces the value of the leader of name with term.
func (a *app) electProclaim(cmd *cobra.Command, name, termArg, value string) error {
	term, err := parseToken(termArg)
	if err != nil {
		return err
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		return c.Admin().Proclaim(ctx, name, term, value)
	})
}

func (a *app) electResignCommand() *cobra.Command {
	var rf revokeFlags
	cmd := &cobra.Command{
		Use:   "resign NAME TERM",
		Short: "End a leadership; from outside, the leader is asked to step down first (exit 4 if the term does not lead)",
		Long: `End a leadership. Unless --session names the leader's own session, the
resignation is from outside: the server asks the leader to step down and
elects the next one once it does, or once the bound passes (--within, at
most and by default the leader's session TTL). --force ends it at once.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electResign(cmd, args[0], args[1], rf)
		},
	}
	rf.add(cmd, "the leader's own session: the leader resigns, at once")
	return cmd
}

// electResign ends the leadership of name with term.
func (a *app) electResign(cmd *cobra.Command, name, termArg string, rf revokeFlags) error {
	term, err := parseToken(termArg)
	if err != nil {
		return err
	}
	return rf.call(a, cmd, func(ctx context.Context, c *clientlib.Client) error {
		r, err := c.Admin().RevokeLeadership(ctx, name, term, rf.options()...)
		if err != nil {
			return err
		}
		return printRevocation(a, "resigned", name, term, r)
	})
}

func (a *app) electTransferCommand() *cobra.Command {
	var toCampaign string
	cmd := &cobra.Command{
		Use:   "transfer NAME TERM SESSION",
		Short: "Hand a leadership to a waiting candidate of SESSION in one commit; prints the new term (exit 4 if the term does not lead, 3 if SESSION does not wait)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electTransfer(cmd, args[0], args[1], args[2], toCampaign)
		},
	}
	cmd.Flags().StringVar(&toCampaign, "request-id", "", "the successor's campaign, when its session campaigns more than once")
	return cmd
}

// electTransfer hands the leadership of name with term to a candidate of
// session (its campaign toCampaign, if set) and prints the new term.
func (a *app) electTransfer(cmd *cobra.Command, name, termArg, session, toCampaign string) error {
	term, err := parseToken(termArg)
	if err != nil {
		return err
	}
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		var opts []clientlib.TransferOption
		if toCampaign != "" {
			opts = append(opts, clientlib.WithRequestID(toCampaign))
		}
		next, err := c.Admin().Transfer(ctx, name, term, session, opts...)
		if err != nil {
			return err
		}
		return a.print(leadershipJSON{Name: name, Term: next.String(), SessionID: session}, func(w *bytes.Buffer) {
			fmt.Fprintf(w, "NAME\tTERM\tSESSION\n%s\t%s\t%s\n", name, next, session)
		})
	})
}

func (a *app) electLeaderCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "leader NAME",
		Short: "Show who leads (exit 3 if nobody does) and who waits",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electLeader(cmd, args[0])
		},
	}
}

// electLeader prints the leader of name and its candidates.
func (a *app) electLeader(cmd *cobra.Command, name string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		ld, err := c.Leader(ctx, name)
		if err != nil {
			return err
		}
		cands, err := c.Candidates(ctx, name)
		if err != nil {
			return err
		}
		out := struct {
			Leader     leaderJSON      `json:"leader"`
			Candidates []candidateJSON `json:"candidates"`
		}{leaderOut(ld), candidatesOut(cands)}
		return a.print(out, func(w *bytes.Buffer) {
			fmt.Fprintln(w, "ROLE\tTERM\tPRIORITY\tVALUE\tSESSION\tOWNER\tSINCE")
			fmt.Fprintf(w, "leader\t%s\t%d\t%s\t%s\t%s\t%s\n", ld.Term, ld.Priority, ld.Value, ld.SessionID, ld.Owner, ts(ld.Since))
			for _, c := range cands {
				fmt.Fprintf(w, "candidate\t-\t%d\t%s\t%s\t%s\t%s\n", c.Priority, c.Value, c.SessionID, c.Owner, ts(c.Enqueued))
			}
		})
	})
}

func (a *app) electCandidatesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "candidates NAME",
		Short: "List the candidates waiting for the seat, in the order they would take it (priority, then arrival)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electCandidates(cmd, args[0])
		},
	}
}

// electCandidates lists the candidates waiting in name, in seat order.
func (a *app) electCandidates(cmd *cobra.Command, name string) error {
	return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
		cands, err := c.Candidates(ctx, name)
		if err != nil {
			return err
		}
		return a.print(candidatesOut(cands), func(w *bytes.Buffer) {
			if len(cands) == 0 {
				fmt.Fprintf(w, "no candidate waits in %s\n", name)
				return
			}
			fmt.Fprintln(w, "#\tPRIORITY\tVALUE\tSESSION\tOWNER\tHOST\tSINCE")
			for i, c := range cands {
				fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", i+1, c.Priority, c.Value, c.SessionID, c.Owner, c.Hostname, ts(c.Enqueued))
			}
		})
	})
}

// electObserveOptions are the flags of elect observe.
type electObserveOptions struct {
	from  int64
	count int
}

func (a *app) electObserveCommand() *cobra.Command {
	var o electObserveOptions
	cmd := &cobra.Command{
		Use:   "observe NAME",
		Short: "Follow an election: one line per event, until interrupted (or --count events)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electObserve(cmd, args[0], o)
		},
	}
	cmd.Flags().Int64Var(&o.from, "from", 0, "resume from this revision (the last seen + 1)")
	cmd.Flags().IntVar(&o.count, "count", 0, "stop after this many events")
	return cmd
}

// electObserve prints the events of election name, one a line, until
// interrupted or --count events.
func (a *app) electObserve(cmd *cobra.Command, name string, o electObserveOptions) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	c, err := a.connect(ctx)
	if err != nil {
		return err
	}
	var opts []clientlib.ObserveOption
	if o.from > 0 {
		opts = append(opts, clientlib.ObserveFrom(o.from))
	}
	obs := c.Observe(ctx, name, opts...)
	n := 0
	for ev := range obs.Events() {
		line := electionEventJSON{Type: ev.Type.String(), Revision: i64(ev.Revision), Current: ev.Current}
		text := fmt.Sprintf("%d %s", ev.Revision, ev.Type)
		if ev.Type != clientlib.ElectionVacant {
			ld := leaderOut(ev.Leader)
			line.Leader = &ld
			text += fmt.Sprintf(" term=%s value=%q session=%s", ev.Leader.Term, ev.Leader.Value, ev.Leader.SessionID)
		}
		if ev.Type == clientlib.ElectionPreemptRequested {
			by := candidatesOut([]clientlib.Candidate{ev.By})[0]
			line.By = &by
			text += fmt.Sprintf(" by=%s priority=%d", ev.By.SessionID, ev.By.Priority)
		}
		if ev.Current {
			text += " (current)"
		}
		if err := a.printLine(line, text); err != nil {
			return err
		}
		if n++; o.count > 0 && n >= o.count {
			return nil
		}
	}
	if err := obs.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// electRunOptions are the flags of elect run.
type electRunOptions struct {
	rf                    runFlags
	value                 string
	again, preempt, yield bool
	priority              int32
}

func (a *app) electRunCommand() *cobra.Command {
	var o electRunOptions
	cmd := &cobra.Command{
		Use:   "run NAME -- COMMAND [ARGS...]",
		Short: "Run a command only while leading; stand by otherwise",
		Long: `Campaign for an election and run the command once elected; until then,
stand by. The command gets COORDD_ELECTION, COORDD_TERM (also
COORDD_FENCE_TOKEN), COORDD_SESSION and COORDD_DEADLINE in its environment:
pass the term to whatever the leader controls.

If leadership is lost (the session ended, or the term was resigned from
elsewhere), the command is stopped on the same schedule as lock run
(SIGTERM, then SIGKILL before the session's local deadline) and coordctl
exits 125; with --again it campaigns again instead (on a new session) and
reruns the command once elected, until the command exits by itself or
coordctl is interrupted. When the command exits, coordctl resigns (the next
candidate takes over at once) and exits with its code.

With --yield, a candidate of higher priority that asks the leader to step
down (elect campaign or run --preempt) is given the leadership: the
command is stopped as on a loss (SIGTERM, then SIGKILL after the grace),
coordctl resigns once it has exited (the asker, first in line, leads
next) and exits 125, or with --again campaigns again.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.electRun(cmd, args, o)
		},
	}
	cmd.ValidArgsFunction = a.completeFirst(electionNames, cobra.ShellCompDirectiveDefault)
	o.rf.add(cmd)
	cmd.Flags().StringVar(&o.value, "value", "", "what to proclaim once elected (default host:pid)")
	cmd.Flags().Int32Var(&o.priority, "priority", 0, "the campaign's priority: when the seat is given, the highest priority waiting takes it")
	cmd.Flags().BoolVar(&o.preempt, "preempt", false, "ask a leader of lower priority to step down (it chooses when)")
	cmd.Flags().BoolVar(&o.again, "again", false, "after a loss, campaign again and rerun the command once elected, instead of exiting 125")
	cmd.Flags().BoolVar(&o.yield, "yield", false, "step down when a candidate of higher priority asks (--preempt): stop the command, resign, and exit 125 (or campaign again with --again)")
	return cmd
}

// electRun runs the command of args (NAME -- COMMAND [ARGS...]) while
// leading NAME, campaigning again after a loss with --again.
func (a *app) electRun(cmd *cobra.Command, args []string, o electRunOptions) error {
	if cmd.ArgsLenAtDash() != 1 {
		return usagef("usage: coordctl elect run NAME -- COMMAND [ARGS...]")
	}
	name, argv := args[0], args[1:]
	if o.value == "" {
		host, _ := os.Hostname()
		o.value = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	ctx := cmd.Context()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		err := a.runHeld(ctx, o.rf, argv, "elect run "+name, o.campaign(name))
		var ce *codeError
		if !o.again || !errors.As(err, &ce) || ce.code != exitLost || ctx.Err() != nil {
			return err
		}
		_, _ = fmt.Fprintf(a.stderr, "coordctl: %v; campaigning again\n", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
	}
}

// campaign is elect run's hold on election name: a leadership that, with
// --yield, is given up when a candidate of higher priority asks for it.
func (o electRunOptions) campaign(name string) func(context.Context, *clientlib.Session) (*held, error) {
	return func(ctx context.Context, sess *clientlib.Session) (*held, error) {
		opts := rankOptions(o.priority, o.preempt)
		var asked chan struct{}
		var by clientlib.Candidate
		if o.yield {
			// OnPreempt calls at most once, before asked is read.
			asked = make(chan struct{})
			opts = append(opts, clientlib.OnPreempt(func(c clientlib.Candidate) { by = c; close(asked) }))
		}
		l, err := sess.Campaign(ctx, name, o.value, opts...)
		if err != nil {
			return nil, err
		}
		return &held{
			what: fmt.Sprintf("leadership of %q (term %s)", name, l.Term()), lost: l.Lost(), release: l.Resign,
			env:   []string{"COORDD_ELECTION=" + name, "COORDD_TERM=" + l.Term().String(), "COORDD_FENCE_TOKEN=" + l.Term().String()},
			yield: asked,
			yieldTo: func() string {
				return fmt.Sprintf("a candidate of priority %d (session %s, %q)", by.Priority, by.SessionID, by.Value)
			},
		}, nil
	}
}

// rankOptions are the campaign options of --priority and --preempt.
func rankOptions(priority int32, preempt bool) []clientlib.CampaignOption {
	opts := []clientlib.CampaignOption{clientlib.WithPriority(priority)}
	if preempt {
		opts = append(opts, clientlib.WithPreempt())
	}
	return opts
}
