package api

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/configcenter"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// who names the caller for the four-eyes rule: its principal when coordd
// authenticates callers, else the author it gives.
func who(ctx context.Context, given string) string {
	if p := PrincipalFrom(ctx).Name; p != "" {
		return p
	}
	return given
}

// SetApprovalPolicy implements ConfigService.
func (s *ConfigServer) SetApprovalPolicy(ctx context.Context, req *coorddv1.SetApprovalPolicyRequest) (*coorddv1.SetApprovalPolicyResponse, error) {
	p := configcenter.ApprovalPolicy{Required: req.GetPolicy().GetRequired()}
	if d := req.GetPolicy().GetProposalTtl(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, invalid("proposal_ttl must be a duration such as \"24h\"")
		}
		p.TTL = d.AsDuration()
	}
	ch, err := s.store.SetApproval(ctx, req.GetNamespace(), p, who(ctx, req.GetAuthor()))
	if err != nil {
		return nil, err
	}
	return &coorddv1.SetApprovalPolicyResponse{Revision: ch.Revision, Pending: ch.Pending, Policy: approvalPolicyProto(ch.Policy)}, nil
}

// approvalPolicyProto is a policy as the API says it.
func approvalPolicyProto(p configcenter.ApprovalPolicy) *coorddv1.ApprovalPolicy {
	out := &coorddv1.ApprovalPolicy{Required: p.Required}
	if !p.Required {
		return out
	}
	ttl := p.TTL
	if ttl == 0 {
		ttl = configcenter.DefaultProposalTTL
	}
	out.ProposalTtl = durationpb.New(ttl)
	if p.OffRequestedBy != "" || !p.OffRequested.IsZero() {
		out.OffRequestedBy, out.OffRequestedTime = p.OffRequestedBy, timestamppb.New(p.OffRequested)
	}
	return out
}

// GetApprovalPolicy implements ConfigService.
func (s *ConfigServer) GetApprovalPolicy(ctx context.Context, req *coorddv1.GetApprovalPolicyRequest) (*coorddv1.GetApprovalPolicyResponse, error) {
	p, err := s.store.Approval(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetApprovalPolicyResponse{Policy: approvalPolicyProto(p)}, nil
}

// ProposeRelease implements ConfigService.
func (s *ConfigServer) ProposeRelease(ctx context.Context, req *coorddv1.ProposeReleaseRequest) (*coorddv1.ProposeReleaseResponse, error) {
	pr := configcenter.ProposeRequest{
		Namespace: req.GetNamespace(), RollbackTo: req.GetRollbackTo(), ExpectedRevision: req.GetExpectedRevision(),
		Proposer: who(ctx, req.GetAuthor()), Author: author(ctx, req.GetAuthor()), Message: req.GetMessage(),
	}
	if pr.RollbackTo < 0 {
		return nil, invalid("rollback_to must not be negative")
	}
	for _, m := range req.GetMutations() {
		pr.Mutations = append(pr.Mutations, configcenter.Mutation{Key: m.GetKey(), Value: m.GetValue(), Delete: m.GetDelete(), Secret: m.GetSecret()})
	}
	p, err := s.store.Propose(ctx, pr)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ProposeReleaseResponse{Proposal: proposalProto(p)}, nil
}

// ListProposals implements ConfigService.
func (s *ConfigServer) ListProposals(ctx context.Context, req *coorddv1.ListProposalsRequest) (*coorddv1.ListProposalsResponse, error) {
	size, err := pageSizeOf(req.GetPageSize(), defaultReleasePageSize, maxReleasePageSize)
	if err != nil {
		return nil, err
	}
	ps, err := s.store.Proposals(ctx, req.GetNamespace(), req.GetBefore(), size)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.ListProposalsResponse{}
	for _, p := range ps {
		resp.Proposals = append(resp.Proposals, proposalProto(p))
	}
	if len(ps) == size && ps[len(ps)-1].Number > 1 {
		resp.NextBefore = ps[len(ps)-1].Number
	}
	return resp, nil
}

// GetProposal implements ConfigService.
func (s *ConfigServer) GetProposal(ctx context.Context, req *coorddv1.GetProposalRequest) (*coorddv1.GetProposalResponse, error) {
	p, err := s.store.GetProposal(ctx, req.GetNamespace(), req.GetNumber())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetProposalResponse{Proposal: proposalProto(p)}, nil
}

// ApproveProposal implements ConfigService.
func (s *ConfigServer) ApproveProposal(ctx context.Context, req *coorddv1.ApproveProposalRequest) (*coorddv1.ApproveProposalResponse, error) {
	rel, p, err := s.store.Approve(ctx, req.GetNamespace(), req.GetNumber(), who(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	s.metrics.released("approve")
	return &coorddv1.ApproveProposalResponse{Release: releaseProto(rel), Proposal: proposalProto(p)}, nil
}

// RejectProposal implements ConfigService.
func (s *ConfigServer) RejectProposal(ctx context.Context, req *coorddv1.RejectProposalRequest) (*coorddv1.RejectProposalResponse, error) {
	p, err := s.store.Reject(ctx, req.GetNamespace(), req.GetNumber(), who(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	return &coorddv1.RejectProposalResponse{Proposal: proposalProto(p)}, nil
}

// WithdrawProposal implements ConfigService: only the proposer may.
func (s *ConfigServer) WithdrawProposal(ctx context.Context, req *coorddv1.WithdrawProposalRequest) (*coorddv1.WithdrawProposalResponse, error) {
	me := who(ctx, req.GetAuthor())
	p, err := s.store.GetProposal(ctx, req.GetNamespace(), req.GetNumber())
	if err != nil {
		return nil, err
	}
	if p.Proposer != me {
		return nil, errkind.PermissionDenied.New("config: only its proposer (" + p.Proposer + ") withdraws a proposal; others reject it (config.approve)")
	}
	if p, err = s.store.Reject(ctx, req.GetNamespace(), req.GetNumber(), me, req.GetMessage()); err != nil {
		return nil, err
	}
	return &coorddv1.WithdrawProposalResponse{Proposal: proposalProto(p)}, nil
}

var proposalStates = map[configcenter.ProposalState]coorddv1.ProposalState{
	configcenter.ProposalPending:   coorddv1.ProposalState_PROPOSAL_STATE_PENDING,
	configcenter.ProposalApproved:  coorddv1.ProposalState_PROPOSAL_STATE_APPROVED,
	configcenter.ProposalRejected:  coorddv1.ProposalState_PROPOSAL_STATE_REJECTED,
	configcenter.ProposalWithdrawn: coorddv1.ProposalState_PROPOSAL_STATE_WITHDRAWN,
	configcenter.ProposalExpired:   coorddv1.ProposalState_PROPOSAL_STATE_EXPIRED,
}

// proposalProto is a proposal's message: its changes as history shows
// them (secrets without their values), never its mutations.
func proposalProto(p configcenter.Proposal) *coorddv1.Proposal {
	out := &coorddv1.Proposal{
		Namespace: p.Namespace, Number: p.Number, State: proposalStates[p.State], Proposer: p.Proposer, Author: p.Author, Message: p.Message,
		Changes: changesProto(p.Changes), RollbackOf: p.RollbackOf, BaseRelease: p.Base, CreateTime: timestamppb.New(p.Created),
		ExpireTime: timestamppb.New(p.Expires), DecidedBy: p.DecidedBy, Decision: p.Decision, Release: p.Release, Revision: p.Revision,
	}
	if !p.Decided.IsZero() {
		out.DecideTime = timestamppb.New(p.Decided)
	}
	return out
}

// SetInheritance implements ConfigService.
func (s *ConfigServer) SetInheritance(ctx context.Context, req *coorddv1.SetInheritanceRequest) (*coorddv1.SetInheritanceResponse, error) {
	if sh := req.GetShared(); sh != "" && s.mayRead != nil && !s.mayRead(ctx, sh) {
		return nil, errkind.PermissionDenied.New("auth: inheriting from " + strconv.Quote(sh) + " shows its content: that needs config.read on it")
	}
	p := PrincipalFrom(ctx)
	r, err := s.store.Inherit(ctx, req.GetNamespace(), req.GetShared(), configcenter.Setter{Name: p.Name, Groups: p.Groups}, author(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	if len(r.Changes) > 0 {
		s.metrics.released("inherit")
	}
	return &coorddv1.SetInheritanceResponse{Release: releaseProto(r)}, nil
}
