package clientlib

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ApprovalPolicy is a namespace's approval setting (four eyes).
type ApprovalPolicy struct {
	// Required: the namespace changes only by proposals that another
	// principal approves; Publish, Put, Delete, Rollback and gray
	// releases fail with ErrApprovalRequired.
	Required bool
	// ProposalTTL is how long a proposal waits for approval (0: 24h).
	ProposalTTL time.Duration
	// OffRequestedBy and OffRequested (read only) say who asked to turn a
	// required policy off, and when: it goes off when another principal
	// asks too, within ProposalTTL.
	OffRequestedBy string
	OffRequested   time.Time
}

// ErrApprovalOffPending is what SetApprovalPolicy returns when turning
// approval off waits for a second principal (four eyes on the policy
// itself): the namespace still requires approval.
var ErrApprovalOffPending = errors.New("coordd: turning approval off waits for a second principal to ask too")

// Proposal is a release waiting for approval, or one that was decided.
type Proposal struct {
	Namespace string
	Number    int64
	// State: PENDING, APPROVED, REJECTED, WITHDRAWN or EXPIRED.
	State           string
	Proposer        string // the principal (or, without authentication, the author given)
	Author, Message string
	Changes         []KeyChange // against BaseRelease; secrets without their values
	RollbackOf      int64
	BaseRelease     int64
	Created         time.Time
	Expires         time.Time
	DecidedBy       string
	Decided         time.Time
	Decision        string
	Release         int64 // the release an approval made
}

func proposalFrom(p *coorddv1.Proposal) Proposal {
	out := Proposal{
		Namespace: p.GetNamespace(), Number: p.GetNumber(), State: strings.TrimPrefix(p.GetState().String(), "PROPOSAL_STATE_"),
		Proposer: p.GetProposer(), Author: p.GetAuthor(), Message: p.GetMessage(), Changes: changesFrom(p.GetChanges()),
		RollbackOf: p.GetRollbackOf(), BaseRelease: p.GetBaseRelease(), Created: p.GetCreateTime().AsTime(), Expires: p.GetExpireTime().AsTime(),
		DecidedBy: p.GetDecidedBy(), Decision: p.GetDecision(), Release: p.GetRelease(),
	}
	if p.GetDecideTime() != nil {
		out.Decided = p.GetDecideTime().AsTime()
	}
	return out
}

// SetApprovalPolicy sets a namespace's approval policy (needs
// config.admin), asked by author when coordd does not authenticate (the
// principal otherwise). Required false turns approval off, which is four
// eyes itself: the first principal who asks gets ErrApprovalOffPending
// (the request is recorded); approval goes off when another principal
// asks too; the same one asking again gets ErrPermissionDenied.
func (cc *ConfigCenter) SetApprovalPolicy(ctx context.Context, ns string, p ApprovalPolicy, author string) error {
	req := &coorddv1.SetApprovalPolicyRequest{Namespace: ns, Policy: &coorddv1.ApprovalPolicy{Required: p.Required}, Author: author}
	if p.ProposalTTL > 0 {
		req.Policy.ProposalTtl = durationpb.New(p.ProposalTTL)
	}
	resp, err := cc.c.config.SetApprovalPolicy(ctx, req)
	if err != nil {
		return convert(ctx, err)
	}
	if resp.GetPending() {
		return fmt.Errorf("%w (asked by %q)", ErrApprovalOffPending, resp.GetPolicy().GetOffRequestedBy())
	}
	return nil
}

// ApprovalPolicy reads a namespace's approval policy.
func (cc *ConfigCenter) ApprovalPolicy(ctx context.Context, ns string) (ApprovalPolicy, error) {
	resp, err := cc.c.config.GetApprovalPolicy(ctx, &coorddv1.GetApprovalPolicyRequest{Namespace: ns})
	if err != nil {
		return ApprovalPolicy{}, convert(ctx, err)
	}
	p := resp.GetPolicy()
	out := ApprovalPolicy{Required: p.GetRequired(), ProposalTTL: p.GetProposalTtl().AsDuration(), OffRequestedBy: p.GetOffRequestedBy()}
	if p.GetOffRequestedTime() != nil {
		out.OffRequested = p.GetOffRequestedTime().AsTime()
	}
	return out, nil
}

// Propose validates a release as Publish would and records it as a
// pending proposal (needs config.propose); the namespace does not change
// until another principal approves it. o.ExpectedRevision,
// o.Author and o.Message are as for Publish; o.DryRun is ignored.
func (cc *ConfigCenter) Propose(ctx context.Context, ns string, ms []ConfigMutation, o PublishOptions) (Proposal, error) {
	req := &coorddv1.ProposeReleaseRequest{Namespace: ns, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message}
	for _, m := range ms {
		req.Mutations = append(req.Mutations, &coorddv1.ConfigMutation{Key: m.Key, Value: m.Value, Delete: m.Delete, Secret: m.Secret})
	}
	return cc.propose(ctx, req)
}

// ProposeRollback proposes restoring release to's content.
func (cc *ConfigCenter) ProposeRollback(ctx context.Context, ns string, to int64, o PublishOptions) (Proposal, error) {
	return cc.propose(ctx, &coorddv1.ProposeReleaseRequest{Namespace: ns, RollbackTo: to, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
}

func (cc *ConfigCenter) propose(ctx context.Context, req *coorddv1.ProposeReleaseRequest) (Proposal, error) {
	resp, err := cc.c.config.ProposeRelease(ctx, req)
	if err != nil {
		return Proposal{}, convert(ctx, err)
	}
	return proposalFrom(resp.GetProposal()), nil
}

// Proposals lists up to n proposals of a namespace, newest first, older
// than number before (0: from the newest).
func (cc *ConfigCenter) Proposals(ctx context.Context, ns string, before int64, n int) ([]Proposal, error) {
	resp, err := cc.c.config.ListProposals(ctx, &coorddv1.ListProposalsRequest{Namespace: ns, Before: before, PageSize: int32(n)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	out := make([]Proposal, 0, len(resp.GetProposals()))
	for _, p := range resp.GetProposals() {
		out = append(out, proposalFrom(p))
	}
	return out, nil
}

// Proposal reads proposal number of a namespace.
func (cc *ConfigCenter) Proposal(ctx context.Context, ns string, number int64) (Proposal, error) {
	resp, err := cc.c.config.GetProposal(ctx, &coorddv1.GetProposalRequest{Namespace: ns, Number: number})
	if err != nil {
		return Proposal{}, convert(ctx, err)
	}
	return proposalFrom(resp.GetProposal()), nil
}

// Approve makes the proposal's release and closes it, in one transaction
// (needs config.approve). It fails with ErrPermissionDenied for its
// proposer (four eyes), ErrProposalClosed once it was decided or expired,
// and ErrRevisionMismatch if the namespace had a release after it (propose
// again). o.Author names the approver when coordd does not authenticate.
func (cc *ConfigCenter) Approve(ctx context.Context, ns string, number int64, o PublishOptions) (ConfigRelease, Proposal, error) {
	resp, err := cc.c.config.ApproveProposal(ctx, &coorddv1.ApproveProposalRequest{Namespace: ns, Number: number, Message: o.Message, Author: o.Author})
	if err != nil {
		return ConfigRelease{}, Proposal{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), proposalFrom(resp.GetProposal()), nil
}

// Reject closes another's pending proposal without a release (needs
// config.approve).
func (cc *ConfigCenter) Reject(ctx context.Context, ns string, number int64, o PublishOptions) (Proposal, error) {
	resp, err := cc.c.config.RejectProposal(ctx, &coorddv1.RejectProposalRequest{Namespace: ns, Number: number, Message: o.Message, Author: o.Author})
	if err != nil {
		return Proposal{}, convert(ctx, err)
	}
	return proposalFrom(resp.GetProposal()), nil
}

// Withdraw closes the caller's own pending proposal (needs
// config.propose).
func (cc *ConfigCenter) Withdraw(ctx context.Context, ns string, number int64, o PublishOptions) (Proposal, error) {
	resp, err := cc.c.config.WithdrawProposal(ctx, &coorddv1.WithdrawProposalRequest{Namespace: ns, Number: number, Message: o.Message, Author: o.Author})
	if err != nil {
		return Proposal{}, convert(ctx, err)
	}
	return proposalFrom(resp.GetProposal()), nil
}
