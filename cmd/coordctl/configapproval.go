package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// proposalJSON is REST's Proposal (state without its PROPOSAL_STATE_
// prefix).
type proposalJSON struct {
	Namespace   string       `json:"namespace"`
	Number      string       `json:"number"`
	State       string       `json:"state"`
	Proposer    string       `json:"proposer"`
	Author      string       `json:"author"`
	Message     string       `json:"message"`
	Changes     []changeJSON `json:"changes"`
	RollbackOf  string       `json:"rollbackOf"`
	BaseRelease string       `json:"baseRelease"`
	CreateTime  string       `json:"createTime"`
	ExpireTime  string       `json:"expireTime"`
	DecidedBy   string       `json:"decidedBy,omitempty"`
	DecideTime  string       `json:"decideTime,omitempty"`
	Decision    string       `json:"decision,omitempty"`
	Release     string       `json:"release"`
}

func proposalOut(p clientlib.Proposal) proposalJSON {
	out := proposalJSON{Namespace: p.Namespace, Number: i64(p.Number), State: p.State, Proposer: p.Proposer, Author: p.Author, Message: p.Message,
		Changes: changesOut(p.Changes), RollbackOf: i64(p.RollbackOf), BaseRelease: i64(p.BaseRelease), CreateTime: timestamp(p.Created),
		ExpireTime: timestamp(p.Expires), DecidedBy: p.DecidedBy, Decision: p.Decision, Release: i64(p.Release)}
	if !p.Decided.IsZero() {
		out.DecideTime = timestamp(p.Decided)
	}
	return out
}

// printProposal prints a proposal with its changes.
func (a *app) printProposal(p clientlib.Proposal) error {
	return a.print(proposalOut(p), func(w *bytes.Buffer) {
		fmt.Fprintf(w, "%s proposal %d: %s, by %s, on release %d, expires %s\n", p.Namespace, p.Number, p.State, p.Proposer, p.BaseRelease, ts(p.Expires))
		if p.Message != "" {
			fmt.Fprintf(w, "  %s\n", block(p.Message))
		}
		if p.DecidedBy != "" {
			fmt.Fprintf(w, "%s by %s at %s %s\n", p.State, p.DecidedBy, ts(p.Decided), p.Decision)
		}
		if p.Release > 0 {
			fmt.Fprintf(w, "made release %d\n", p.Release)
		}
		for _, c := range p.Changes {
			fmt.Fprintln(w, changeLine(c))
		}
	})
}

// proposalArgs reads NAMESPACE NUMBER.
func proposalArgs(args []string) (string, int64, error) {
	n, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil || n <= 0 {
		return "", 0, usagef("%q is not a proposal number", args[1])
	}
	return args[0], n, nil
}

func (a *app) configProposeCommand() *cobra.Command {
	var rf releaseFlags
	var file string
	var vf valueFlags
	var secrets []string
	var rollbackTo int64
	cmd := &cobra.Command{
		Use:   "propose NAMESPACE (-f FILE | --rollback-to RELEASE)",
		Short: "Propose a release for another principal to approve (four eyes)",
		Long: `Propose a release: validated as publish would (keys, sizes, schema) and
kept as a pending proposal; the namespace does not change until another
principal approves it (config approve). The file is read as config publish
reads it (--json-values, --secret KEY); --rollback-to proposes restoring a release's
content. A namespace that requires approval (config approval --require)
changes only this way. Needs config.propose.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ms []clientlib.ConfigMutation
			switch {
			case file != "" && rollbackTo > 0, file == "" && rollbackTo == 0:
				return usagef("give -f FILE or --rollback-to RELEASE")
			case file != "":
				data, err := a.readInput(file)
				if err != nil {
					return err
				}
				if ms, err = mutationsFromJSON(data, vf); err != nil {
					return err
				}
				if ms, err = markSecrets(ms, secrets); err != nil {
					return err
				}
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				var p clientlib.Proposal
				var err error
				if rollbackTo > 0 {
					p, err = c.ConfigCenter().ProposeRollback(ctx, args[0], rollbackTo, rf.options())
				} else {
					p, err = c.ConfigCenter().Propose(ctx, args[0], ms, rf.options())
				}
				if err != nil {
					return err
				}
				return a.printProposal(p)
			})
		},
	}
	rf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "JSON object of keys to set (null deletes); - for stdin")
	vf.add(cmd)
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "store this key's value as a secret (repeatable)")
	cmd.Flags().Int64Var(&rollbackTo, "rollback-to", 0, "propose restoring this release's content")
	return cmd
}

func (a *app) configProposalsCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "proposals NAMESPACE",
		Short: "List a namespace's proposals, newest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				ps, err := c.ConfigCenter().Proposals(ctx, args[0], 0, limit)
				if err != nil {
					return err
				}
				out := make([]proposalJSON, 0, len(ps))
				for _, p := range ps {
					out = append(out, proposalOut(p))
				}
				return a.print(out, func(w *bytes.Buffer) {
					if len(ps) == 0 {
						fmt.Fprintf(w, "%s has no proposal\n", args[0])
						return
					}
					fmt.Fprintln(w, "PROPOSAL\tSTATE\tPROPOSER\tBASE\tCHANGES\tEXPIRES\tDECIDED BY\tMESSAGE")
					for _, p := range ps {
						fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", p.Number, p.State, cell(p.Proposer), p.BaseRelease, len(p.Changes), ts(p.Expires), cell(cmp.Or(p.DecidedBy, "-")), cell(p.Message))
					}
				})
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 20, "proposals to show (1-100)")
	return cmd
}

func (a *app) configProposalCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "proposal NAMESPACE NUMBER",
		Short: "Print a proposal and the changes it makes",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, n, err := proposalArgs(args)
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				p, err := c.ConfigCenter().Proposal(ctx, ns, n)
				if err != nil {
					return err
				}
				return a.printProposal(p)
			})
		},
	}
}

// configDecideCommand is approve, reject or withdraw.
func (a *app) configDecideCommand(verb, short string) *cobra.Command {
	var rf releaseFlags
	cmd := &cobra.Command{
		Use:   verb + " NAMESPACE NUMBER [-m MESSAGE]",
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, n, err := proposalArgs(args)
			if err != nil {
				return err
			}
			o := rf.options()
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				cc := c.ConfigCenter()
				var p clientlib.Proposal
				switch verb {
				case "approve":
					r, _, err := cc.Approve(ctx, ns, n, o)
					if err != nil {
						return err
					}
					return a.printRelease(r)
				case "reject":
					p, err = cc.Reject(ctx, ns, n, o)
				default:
					p, err = cc.Withdraw(ctx, ns, n, o)
				}
				if err != nil {
					return err
				}
				return a.printProposal(p)
			})
		},
	}
	rf.add(cmd)
	_ = cmd.Flags().MarkHidden("expect")
	return cmd
}

func (a *app) configApprovalCommand() *cobra.Command {
	var require, off bool
	var ttl time.Duration
	var author string
	cmd := &cobra.Command{
		Use:   "approval NAMESPACE [--require [--ttl D] | --off]",
		Short: "Show, require or turn off approval (four eyes) for a namespace",
		Long: `Show a namespace's approval policy, or set it (config.admin). With
--require, the namespace changes only by proposals (config propose) that a
principal other than the proposer approves (config approve); publish, put,
delete, rollback and gray releases are refused with APPROVAL_REQUIRED.
Proposals wait --ttl (default 24h, at most 720h) and then expire.
Turning approval off (--off) takes two principals with config.admin: the
first one's --off is recorded and shown here; it takes effect when another
one asks too, within the proposals' time to live. Without authentication
--author names who asks.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if require && off {
				return usagef("--require or --off, not both")
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				cc := c.ConfigCenter()
				if require || off {
					err := cc.SetApprovalPolicy(ctx, args[0], clientlib.ApprovalPolicy{Required: require, ProposalTTL: ttl}, author)
					if errors.Is(err, clientlib.ErrApprovalOffPending) {
						err = nil // said below: the policy shows who asked
					}
					if err != nil {
						return err
					}
				}
				p, err := cc.ApprovalPolicy(ctx, args[0])
				if err != nil {
					return err
				}
				out := map[string]any{"namespace": args[0], "required": p.Required, "proposalTtl": p.ProposalTTL.String()}
				if p.OffRequestedBy != "" || !p.OffRequested.IsZero() {
					out["offRequestedBy"], out["offRequestedTime"] = p.OffRequestedBy, p.OffRequested.Format(time.RFC3339)
				}
				return a.print(out, func(w *bytes.Buffer) {
					if !p.Required {
						fmt.Fprintf(w, "%s: no approval required\n", args[0])
						return
					}
					fmt.Fprintf(w, "%s: every release needs a proposal approved by someone else; proposals expire after %s\n", args[0], p.ProposalTTL)
					if p.OffRequestedBy != "" || !p.OffRequested.IsZero() {
						fmt.Fprintf(w, "%s asked to turn approval off at %s: it goes off when another principal asks too (config approval %s --off), before %s\n",
							cell(cmp.Or(p.OffRequestedBy, "(someone unnamed)")), p.OffRequested.Format(time.RFC3339), args[0], p.OffRequested.Add(p.ProposalTTL).Format(time.RFC3339))
					}
				})
			})
		},
	}
	cmd.Flags().BoolVar(&require, "require", false, "require approval of every release")
	cmd.Flags().BoolVar(&off, "off", false, "stop requiring approval")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "with --require: how long a proposal waits (default 24h)")
	cmd.Flags().StringVar(&author, "author", "", "who asks, when coordd does not authenticate callers (four eyes: --off needs two)")
	return cmd
}
