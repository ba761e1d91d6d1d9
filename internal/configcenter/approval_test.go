package configcenter_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// gated is a store whose namespace "pay" requires approval, with a clock
// the test moves.
func gated(t *testing.T) (env, *atomic.Int64) {
	t.Helper()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	var offset atomic.Int64
	configcenter.SetNow(e.s, func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	if _, err := e.s.Put(t.Context(), "pay", "limit", "10", 0, "", "before approval"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetApproval(t.Context(), "pay", configcenter.ApprovalPolicy{Required: true, TTL: time.Hour}, "admin-1"); err != nil {
		t.Fatal(err)
	}
	return e, &offset
}

func propose(t *testing.T, e env, who string, ms ...configcenter.Mutation) configcenter.Proposal {
	t.Helper()
	p, err := e.s.Propose(t.Context(), configcenter.ProposeRequest{Namespace: "pay", Mutations: ms, Proposer: who, Author: who, Message: "why"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestApprovalGatesEveryDirectWrite(t *testing.T) {
	t.Parallel()
	e, _ := gated(t)
	ctx := t.Context()
	if _, err := e.s.Put(ctx, "pay", "limit", "20", 0, "", ""); !errors.Is(err, configcenter.ErrApprovalRequired) {
		t.Fatalf("Put = %v", err)
	}
	if _, err := e.s.Rollback(ctx, "pay", 1, 0, "", ""); !errors.Is(err, configcenter.ErrApprovalRequired) {
		t.Fatalf("Rollback = %v", err)
	}
	sel := configcenter.GraySelector{Instances: []string{"a"}}
	if _, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: "pay", Selector: &sel, Mutations: []configcenter.Mutation{{Key: "limit", Value: "5"}}}); !errors.Is(err, configcenter.ErrApprovalRequired) {
		t.Fatalf("CreateGray = %v", err)
	}
	if snap, _ := e.s.Snapshot(ctx, "pay", 0); snap.Release != 1 {
		t.Fatalf("refused writes made release %d", snap.Release)
	}
	// Turning it off is four eyes too: one admin only asks; the same one
	// again is refused; a second one turns it off.
	ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-1")
	if err != nil || !ch.Pending || !ch.Policy.Required || ch.Policy.OffRequestedBy != "admin-1" {
		t.Fatalf("a first admin turning approval off = %+v, %v; want it pending", ch, err)
	}
	if _, err := e.s.Put(ctx, "pay", "limit", "20", 0, "", ""); !errors.Is(err, configcenter.ErrApprovalRequired) {
		t.Fatalf("Put while turning off is pending = %v, want ErrApprovalRequired", err)
	}
	if _, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-1"); !errors.Is(err, configcenter.ErrSecondAdmin) {
		t.Fatalf("the same admin asking again = %v, want ErrSecondAdmin", err)
	}
	if ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-2"); err != nil || ch.Pending || ch.Policy.Required {
		t.Fatalf("a second admin turning approval off = %+v, %v; want it off", ch, err)
	}
	// Turned off, direct writes work again.
	if _, err := e.s.Put(ctx, "pay", "limit", "20", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	// Requiring it again is at once, and forgets any old request.
	if ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{Required: true}, "admin-1"); err != nil || ch.Pending || !ch.Policy.Required {
		t.Fatalf("requiring approval = %+v, %v", ch, err)
	}
}

// A request to turn approval off expires with the policy's TTL: the same
// admin may then ask anew (and still needs a second one).
func TestTurningApprovalOffExpires(t *testing.T) {
	t.Parallel()
	e, offset := gated(t)
	ctx := t.Context()
	if ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-1"); err != nil || !ch.Pending {
		t.Fatalf("first ask = %+v, %v", ch, err)
	}
	offset.Store(int64(2 * time.Hour)) // past the policy's TTL of an hour
	ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-1")
	if err != nil || !ch.Pending {
		t.Fatalf("asking again after the request expired = %+v, %v; want a new pending request", ch, err)
	}
	if ch, err := e.s.SetApproval(ctx, "pay", configcenter.ApprovalPolicy{}, "admin-2"); err != nil || ch.Policy.Required {
		t.Fatalf("a second admin = %+v, %v; want it off", ch, err)
	}
}

func TestFourEyes(t *testing.T) {
	t.Parallel()
	for _, sabotage := range []bool{false, true} {
		e, _ := gated(t)
		if sabotage {
			configcenter.SetSelfApproval(e.s)
		}
		ctx := t.Context()
		p := propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "20"})
		if p.Number != 1 || p.State != configcenter.ProposalPending || p.Base != 1 || len(p.Changes) != 1 || *p.Changes[0].New != "20" {
			t.Fatalf("proposal = %+v", p)
		}
		_, _, err := e.s.Approve(ctx, "pay", 1, "ann", "")
		if sabotage {
			// The rule switched off: the same call goes through, so the
			// check above is what refuses it.
			if err != nil {
				t.Fatalf("with self-approval allowed: %v", err)
			}
			continue
		}
		if !errors.Is(err, configcenter.ErrSelfApproval) {
			t.Fatalf("self-approval = %v", err)
		}
		rel, got, err := e.s.Approve(ctx, "pay", 1, "bo", "looks right")
		if err != nil || rel.Number != 2 || rel.ProposedBy != "ann" || rel.ApprovedBy != "bo" || rel.Proposal != 1 || got.State != configcenter.ProposalApproved || got.Release != 2 {
			t.Fatalf("Approve = %+v, %+v, %v", rel, got, err)
		}
		if rels, _ := e.s.Releases(ctx, "pay", 0, 1); rels[0].ApprovedBy != "bo" || rels[0].ProposedBy != "ann" || rels[0].Author != "ann" {
			t.Fatalf("history = %+v", rels[0])
		}
		if _, _, err := e.s.Approve(ctx, "pay", 1, "cy", ""); !errors.Is(err, configcenter.ErrProposalClosed) {
			t.Fatalf("a second approval = %v", err)
		}
	}
}

func TestProposalsGoStaleExpireAndClose(t *testing.T) {
	t.Parallel()
	e, clock := gated(t)
	ctx := t.Context()
	propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "20"})
	propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "30"})
	if _, _, err := e.s.Approve(ctx, "pay", 1, "bo", ""); err != nil {
		t.Fatal(err)
	}
	// Proposal 2 was made on release 1: approving it would undo 1's.
	if _, _, err := e.s.Approve(ctx, "pay", 2, "bo", ""); !errors.Is(err, configcenter.ErrRevisionMismatch) {
		t.Fatalf("a stale proposal = %v", err)
	}
	p3 := propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "40"})
	if p3.Base != 2 {
		t.Fatalf("base %d", p3.Base)
	}
	clock.Store(int64(2 * time.Hour))
	if got, _ := e.s.GetProposal(ctx, "pay", 3); got.State != configcenter.ProposalExpired {
		t.Fatalf("past its TTL: %s", got.State)
	}
	if _, _, err := e.s.Approve(ctx, "pay", 3, "bo", ""); !errors.Is(err, configcenter.ErrProposalClosed) {
		t.Fatalf("an expired proposal = %v", err)
	}
	clock.Store(0)
	propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "50"})
	propose(t, e, "ann", configcenter.Mutation{Key: "limit", Value: "60"})
	if p, err := e.s.Reject(ctx, "pay", 4, "bo", "too high"); err != nil || p.State != configcenter.ProposalRejected || p.DecidedBy != "bo" {
		t.Fatalf("Reject = %+v, %v", p, err)
	}
	if p, err := e.s.Reject(ctx, "pay", 5, "ann", "never mind"); err != nil || p.State != configcenter.ProposalWithdrawn {
		t.Fatalf("withdraw = %+v, %v", p, err)
	}
	if _, _, err := e.s.Approve(ctx, "pay", 4, "cy", ""); !errors.Is(err, configcenter.ErrProposalClosed) {
		t.Fatalf("approving a rejected proposal = %v", err)
	}
	ps, err := e.s.Proposals(ctx, "pay", 0, 10)
	if err != nil || len(ps) != 5 || ps[0].Number != 5 || ps[4].Number != 1 {
		t.Fatalf("Proposals = %d, %v", len(ps), err)
	}
	if snap, _ := e.s.Snapshot(ctx, "pay", 0); snap.Content["limit"] != "20" || snap.Release != 2 {
		t.Fatalf("content %+v", snap)
	}
	if _, err := e.s.Propose(ctx, configcenter.ProposeRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "limit", Value: "20"}}, Proposer: "ann"}); !errors.Is(err, configcenter.ErrInvalid) {
		t.Fatalf("a proposal that changes nothing = %v", err)
	}
}

func TestProposalsKeepSecretsSealedAndRollBack(t *testing.T) {
	t.Parallel()
	e, _ := gated(t)
	ctx := t.Context()
	p := propose(t, e, "ann", configcenter.Mutation{Key: "db.password", Value: password, Secret: true})
	if !keyring.IsSealed(p.Mutations[0].Value) || !keyring.IsSealed(*p.Changes[0].New) {
		t.Fatalf("the proposal holds %+v", p.Mutations)
	}
	if found := clearIn(t, e.cli, "correct-horse"); len(found) > 0 {
		t.Fatalf("a proposal left the secret in clear at %q", found)
	}
	if _, _, err := e.s.Approve(ctx, "pay", p.Number, "bo", ""); err != nil {
		t.Fatal(err)
	}
	snap, _ := e.s.Snapshot(ctx, "pay", 0)
	if v, err := e.s.OpenValue(ctx, "pay", "db.password", snap.Content["db.password"]); err != nil || v != password {
		t.Fatalf("the approved secret = %q, %v", v, err)
	}
	// A rollback is proposed too.
	rb, err := e.s.Propose(ctx, configcenter.ProposeRequest{Namespace: "pay", RollbackTo: 1, Proposer: "ann"})
	if err != nil || rb.RollbackOf != 1 {
		t.Fatalf("rollback proposal = %+v, %v", rb, err)
	}
	rel, _, err := e.s.Approve(ctx, "pay", rb.Number, "bo", "")
	if err != nil || rel.RollbackOf != 1 {
		t.Fatalf("approved rollback = %+v, %v", rel, err)
	}
	if snap, _ := e.s.Snapshot(ctx, "pay", 0); len(snap.Content) != 1 || snap.Content["limit"] != "10" {
		t.Fatalf("after the rollback: %+v", snap.Content)
	}
}
