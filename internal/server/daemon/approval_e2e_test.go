package daemon_test

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// root administers a/; alice may do everything to config there (but four
// eyes still stops her approving her own); carol proposes; bob approves.
const approvalPolicy = `
rules:
  - principals: [root]
    actions: [config.admin, config.read]
    namespaces: ["a/*"]
  - principals: [alice]
    actions: [config.read, config.write, config.propose, config.approve]
    namespaces: ["a/*"]
  - principals: [carol]
    actions: [config.read, config.propose, config.admin]
    namespaces: ["a/*"]
  - principals: [bob]
    actions: [config.read, config.approve]
    namespaces: ["a/*"]
`

// TestApprovalFourEyes: in a namespace that requires approval, a release
// is proposed by one principal and approved by another; nobody approves
// their own; a stale proposal is refused; the release, the history and the
// audit log name both; subscribers get the approved release.
func TestApprovalFourEyes(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, approvalPolicy)
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	d := start(t, cfg)
	ctx := t.Context()
	cl := map[string]*clientlib.ConfigCenter{}
	for _, p := range []string{"root", "alice", "carol", "bob"} {
		cl[p] = newClientWithToken(t, d.GRPCAddr(), p).ConfigCenter()
	}
	ns := "a/app"
	if _, err := cl["alice"].Put(ctx, ns, "limit", "10", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cl["alice"].SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{Required: true}, ""); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("alice setting the policy = %v, want ErrPermissionDenied (config.admin)", err)
	}
	if err := cl["root"].SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{Required: true, ProposalTTL: time.Hour}, ""); err != nil {
		t.Fatal(err)
	}
	if p, err := cl["bob"].ApprovalPolicy(ctx, ns); err != nil || !p.Required || p.ProposalTTL != time.Hour {
		t.Fatalf("ApprovalPolicy = %+v, %v", p, err)
	}
	sub, err := cl["bob"].Subscribe(ctx, []string{ns}, clientlib.WithStartTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := cl["alice"].Put(ctx, ns, "limit", "20", clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrApprovalRequired) {
		t.Fatalf("a direct put = %v, want ErrApprovalRequired", err)
	}

	p1, err := cl["carol"].Propose(ctx, ns, []clientlib.ConfigMutation{{Key: "limit", Value: "20"}}, clientlib.PublishOptions{Message: "more"})
	if err != nil || p1.State != "PENDING" || p1.Proposer != "carol" || len(p1.Changes) != 1 || p1.BaseRelease != 1 {
		t.Fatalf("carol's proposal = %+v, %v", p1, err)
	}
	p2, err := cl["alice"].Propose(ctx, ns, []clientlib.ConfigMutation{{Key: "limit", Value: "30"}}, clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cl["carol"].Approve(ctx, ns, p1.Number, clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("carol approving = %v, want ErrPermissionDenied (no config.approve)", err)
	}
	if _, _, err := cl["alice"].Approve(ctx, ns, p2.Number, clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrPermissionDenied) || !strings.Contains(err.Error(), "four eyes") {
		t.Fatalf("alice approving her own = %v, want the four-eyes refusal", err)
	}
	rel, closed, err := cl["bob"].Approve(ctx, ns, p1.Number, clientlib.PublishOptions{Message: "ok"})
	if err != nil || rel.Number != 2 || rel.ProposedBy != "carol" || rel.ApprovedBy != "bob" || rel.Proposal != p1.Number || closed.State != "APPROVED" || closed.Release != 2 {
		t.Fatalf("bob's approval = %+v, %+v, %v", rel, closed, err)
	}
	wait.For(t, "the subscriber to get the approved release", func() bool { v, _ := sub.Snapshot().Get(ns, "limit"); return v == "20" })
	if _, _, err := cl["bob"].Approve(ctx, ns, p2.Number, clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrRevisionMismatch) {
		t.Fatalf("approving a proposal made before release 2 = %v, want ErrRevisionMismatch", err)
	}
	if _, _, err := cl["bob"].Approve(ctx, ns, p1.Number, clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrProposalClosed) {
		t.Fatalf("approving twice = %v", err)
	}

	// Withdraw is the proposer's; reject is an approver's.
	p3, err := cl["carol"].Propose(ctx, ns, []clientlib.ConfigMutation{{Key: "limit", Value: "40"}}, clientlib.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl["alice"].Withdraw(ctx, ns, p3.Number, clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("alice withdrawing carol's = %v", err)
	}
	if p, err := cl["carol"].Withdraw(ctx, ns, p3.Number, clientlib.PublishOptions{Message: "later"}); err != nil || p.State != "WITHDRAWN" {
		t.Fatalf("carol's withdrawal = %+v, %v", p, err)
	}

	// REST: the same, as JSON.
	base := "http://" + d.HTTPAddr() + "/v1/config:"
	q := "namespace=" + url.QueryEscape(ns)
	code, body := httpAs(t, "POST", base+"propose", "carol", `{"namespace":"a/app","mutations":[{"key":"limit","value":"50"}],"message":"rest"}`)
	if code != 200 || !strings.Contains(body, `"state":"PROPOSAL_STATE_PENDING"`) {
		t.Fatalf("REST propose: %d %s", code, body)
	}
	if code, body := httpAs(t, "POST", base+"approve", "carol", `{"namespace":"a/app","number":"4"}`); code != 403 {
		t.Fatalf("REST approve by carol: %d %s", code, body)
	}
	if code, body := httpAs(t, "POST", base+"put", "alice", `{"namespace":"a/app","key":"limit","value":"1"}`); code != 400 || !strings.Contains(body, "APPROVAL_REQUIRED") {
		t.Fatalf("REST put: %d %s", code, body)
	}
	if code, body := httpAs(t, "POST", base+"approve", "bob", `{"namespace":"a/app","number":"4"}`); code != 200 || !strings.Contains(body, `"approvedBy":"bob"`) {
		t.Fatalf("REST approve by bob: %d %s", code, body)
	}
	if code, body := httpAs(t, "GET", base+"releases?"+q+"&pageSize=1", "bob", ""); code != 200 || !strings.Contains(body, `"proposedBy":"carol"`) {
		t.Fatalf("REST history: %d %s", code, body)
	}
	if code, body := httpAs(t, "GET", base+"proposals?"+q, "bob", ""); code != 200 || strings.Count(body, `"number"`) != 4 {
		t.Fatalf("REST proposals: %d %s", code, body)
	}

	audit, _ := os.ReadFile(cfg.AuditLog)
	for _, want := range []string{`"principal":"carol","source"`, `"action":"config.propose"`, `"action":"config.approve"`} {
		if !strings.Contains(string(audit), want) {
			t.Errorf("the audit log lacks %s:\n%s", want, audit)
		}
	}

	// Turning approval off is four eyes too: root alone only asks (an
	// author it names does not count under authentication); carol, the
	// other admin, confirms.
	if err := cl["root"].SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{}, ""); !errors.Is(err, clientlib.ErrApprovalOffPending) {
		t.Fatalf("root turning approval off = %v, want ErrApprovalOffPending", err)
	}
	if err := cl["root"].SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{}, "someone-else"); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("root asking again = %v, want ErrPermissionDenied", err)
	}
	if _, err := cl["alice"].Put(ctx, ns, "limit", "99", clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrApprovalRequired) {
		t.Fatalf("a direct put while turning off waits = %v, want ErrApprovalRequired", err)
	}
	if p, err := cl["bob"].ApprovalPolicy(ctx, ns); err != nil || !p.Required || p.OffRequestedBy != "root" {
		t.Fatalf("policy while turning off waits = %+v, %v", p, err)
	}
	if err := cl["carol"].SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{}, ""); err != nil {
		t.Fatalf("carol confirming = %v", err)
	}
	if p, err := cl["bob"].ApprovalPolicy(ctx, ns); err != nil || p.Required {
		t.Fatalf("policy after two admins = %+v, %v; want off", p, err)
	}
}

// TestConsoleApprovesProposals: the console lists a gated namespace's
// proposals, approves one (naming the approver, as it must without
// sign-in), shows the release it made, and offers Propose, not Publish.
func TestConsoleApprovesProposals(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	cc := newClient(t, d.GRPCAddr()).ConfigCenter()
	ctx := t.Context()
	ns := "shop/prod"
	if _, err := cc.Put(ctx, ns, "limit", "10", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cc.SetApprovalPolicy(ctx, ns, clientlib.ApprovalPolicy{Required: true}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Propose(ctx, ns, []clientlib.ConfigMutation{{Key: "limit", Value: "25"}}, clientlib.PublishOptions{Author: "ann", Message: "raise the limit"}); err != nil {
		t.Fatal(err)
	}
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")
	p.open("#/config/" + ns + "?tab=proposals")
	p.see("main", "Approval required")
	p.see("main table", "raise the limit")
	p.see("main table", "pending")
	p.screenshot("config-proposals")
	p.clickRow("raise the limit", "Approve")
	p.run("name the approver", chromedp.SendKeys(chromedp.CSS(`dialog[open] input[placeholder^="without sign-in"]`), "bo"))
	p.confirm()
	p.see("main table", "approved")
	p.see("main table", "bo → release 2")
	if v, _, err := cc.Get(ctx, ns, "limit", 0); err != nil || v != "25" {
		t.Fatalf("after the console's approval: %q, %v", v, err)
	}
	p.open("#/config/" + ns + "?tab=history")
	p.see("main table", "approved by bo")
	p.open("#/config/" + ns + "?tab=publish")
	p.see("main", "requires approval")
	p.until("a Propose button, no Publish button", `(() => { const bs = [...document.querySelectorAll('main button')].map((b) => b.innerText); return bs.includes('Propose') && !bs.includes('Publish'); })()`)
}
