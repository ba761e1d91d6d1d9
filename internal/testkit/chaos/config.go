package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// Config workers: a publisher and subscribers of one namespace.
const (
	KindPublisher  = "publisher"
	KindSubscriber = "subscriber"
	// ConfigNamespace is the namespace they use.
	ConfigNamespace = "chaos/config"
	// ApprovedNamespace requires approval: the publisher proposes each
	// release there as one author and approves it as another.
	ApprovedNamespace = "chaos/approved"
	// OpPublishApproved and OpSeenApproved are OpPublish and OpSeen for
	// ApprovedNamespace.
	OpPublishApproved = "publish-approved"
	OpSeenApproved    = "seen-approved"
	// HeirNamespace inherits from ConfigNamespace: every release there
	// reaches it as one release of its own.
	HeirNamespace = "chaos/heir"
	// OpSeenHeir is OpSeen for HeirNamespace (whose values are
	// ConfigNamespace's publishes).
	OpSeenHeir = "seen-heir"
	// ApprovalProposer and ApprovalApprover are the authors the publisher
	// proposes and approves as (the matrix runs without authentication).
	ApprovalProposer = "chaos-proposer"
	ApprovalApprover = "chaos-approver"
	// OpPublish is a publish: Token is the number n it wrote to both
	// keys (Result ok, or unknown when the answer was lost).
	OpPublish = "publish"
	// OpSeen is a subscriber's callback: Token is the release it saw,
	// Result "a,b" the two keys' values in that snapshot.
	OpSeen = "seen"
)

// runPublisher publishes n = 1, 2, ... to the keys a and b of
// ConfigNamespace in one release each, until ctx ends. SabotageTorn
// publishes a and b in two releases instead.
func runPublisher(ctx context.Context, c *clientlib.Client, rec *recorder, sabotage string) {
	for ctx.Err() == nil { // the gated namespace and the heir, before anything else
		pctx, cancel := context.WithTimeout(ctx, putTimeout)
		err := c.ConfigCenter().SetApprovalPolicy(pctx, ApprovedNamespace, clientlib.ApprovalPolicy{Required: true}, "")
		if err == nil {
			_, err = c.ConfigCenter().Inherit(pctx, HeirNamespace, ConfigNamespace, clientlib.PublishOptions{})
		}
		cancel()
		if err == nil {
			break
		}
		pause(ctx, 100*time.Millisecond)
	}
	for n := int64(1); ctx.Err() == nil; n++ {
		publishApproved(ctx, c, rec, sabotage, n)
		v := strconv.FormatInt(n, 10)
		pctx, cancel := context.WithTimeout(ctx, putTimeout)
		r := Record{Op: OpPublish, Token: n, Call: now()}
		releases := [][]clientlib.ConfigMutation{{{Key: "a", Value: v}, {Key: "b", Value: v}}}
		if sabotage == SabotageTorn {
			releases = [][]clientlib.ConfigMutation{{{Key: "a", Value: v}}, {{Key: "b", Value: v}}}
		}
		var err error
		for _, muts := range releases {
			if _, err = c.ConfigCenter().Publish(pctx, ConfigNamespace, muts, clientlib.PublishOptions{}); err != nil {
				break
			}
		}
		cancel()
		r.Return, r.Result = now(), ResultOK
		if err != nil {
			r.Result, r.Err = ResultUnknown, err.Error()
		}
		rec.add(r)
		pause(ctx, 50*time.Millisecond)
	}
}

// publishApproved proposes n as a release of ApprovedNamespace (two, a
// then b, with SabotageTorn) and approves it as another author. A lost
// answer is recorded as unknown; a proposal made stale by a release that
// a lost answer hid is refused, which is no violation.
func publishApproved(ctx context.Context, c *clientlib.Client, rec *recorder, sabotage string, n int64) {
	v := strconv.FormatInt(n, 10)
	pctx, cancel := context.WithTimeout(ctx, putTimeout)
	defer cancel()
	r := Record{Op: OpPublishApproved, Token: n, Call: now()}
	releases := [][]clientlib.ConfigMutation{{{Key: "a", Value: v}, {Key: "b", Value: v}}}
	if sabotage == SabotageTorn {
		releases = [][]clientlib.ConfigMutation{{{Key: "a", Value: v}}, {{Key: "b", Value: v}}}
	}
	var err error
	for _, muts := range releases {
		var p clientlib.Proposal
		if p, err = c.ConfigCenter().Propose(pctx, ApprovedNamespace, muts, clientlib.PublishOptions{Author: ApprovalProposer}); err != nil {
			break
		}
		if _, _, err = c.ConfigCenter().Approve(pctx, ApprovedNamespace, p.Number, clientlib.PublishOptions{Author: ApprovalApprover}); err != nil {
			break
		}
	}
	r.Return, r.Result = now(), ResultOK
	if err != nil {
		r.Result, r.Err = ResultUnknown, err.Error()
	}
	rec.add(r)
}

// runSubscriber follows ConfigNamespace and records every snapshot its
// callback sees, until ctx ends.
func runSubscriber(ctx context.Context, c *clientlib.Client, rec *recorder) error {
	var sub *clientlib.Subscription
	for {
		var err error
		sub, err = c.ConfigCenter().Subscribe(ctx, []string{ConfigNamespace, ApprovedNamespace, HeirNamespace}, clientlib.WithStartTimeout(5*time.Second))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		pause(ctx, 100*time.Millisecond)
	}
	defer sub.Close()
	seenIn := func(ns, op string, snap *clientlib.ConfigSnapshot) {
		a, _ := snap.Get(ns, "a")
		b, _ := snap.Get(ns, "b")
		t := now()
		rec.add(Record{Op: op, Token: snap.Release(ns), Result: a + "," + b, Call: t, Return: t})
	}
	seenIn(ConfigNamespace, OpSeen, sub.Snapshot())
	seenIn(ApprovedNamespace, OpSeenApproved, sub.Snapshot())
	seenIn(HeirNamespace, OpSeenHeir, sub.Snapshot())
	sub.OnNamespace(HeirNamespace, func(ch clientlib.ConfigUpdate) { seenIn(HeirNamespace, OpSeenHeir, ch.Snapshot) })
	sub.OnNamespace(ConfigNamespace, func(ch clientlib.ConfigUpdate) { seenIn(ConfigNamespace, OpSeen, ch.Snapshot) })
	sub.OnNamespace(ApprovedNamespace, func(ch clientlib.ConfigUpdate) { seenIn(ApprovedNamespace, OpSeenApproved, ch.Snapshot) })
	<-ctx.Done()
	return nil
}

// CheckConfig checks each subscriber's sequence of snapshots of each
// namespace (ConfigNamespace; ApprovedNamespace, whose releases are
// approved proposals; HeirNamespace, which inherits ConfigNamespace's
// releases): releases never go back, every snapshot holds one
// complete publish (a == b), and the values never go back either nor
// exceed what was published.
func CheckConfig(recs []Record) []Violation {
	return slices.Concat(checkConfig("config", OpPublish, OpSeen, recs), checkConfig("config-approved", OpPublishApproved, OpSeenApproved, recs),
		checkConfig("config-heir", OpPublish, OpSeenHeir, recs))
}

func checkConfig(checker, publish, seen string, recs []Record) []Violation {
	published := int64(0)
	for _, r := range recs {
		if r.Op == publish {
			published = max(published, r.Token)
		}
	}
	type state struct{ release, n int64 }
	last := map[string]state{}
	var out []Violation
	for _, r := range recs { // in Call order: each subscriber's own order
		if r.Op != seen {
			continue
		}
		a, b, _ := strings.Cut(r.Result, ",")
		if a != b {
			out = append(out, Violation{Checker: checker, What: fmt.Sprintf("%s saw half a release: release %d has a=%q, b=%q", r.Worker, r.Token, a, b)})
			continue
		}
		n, _ := strconv.ParseInt(a, 10, 64)
		prev := last[r.Worker]
		if r.Token < prev.release || n < prev.n {
			out = append(out, Violation{Checker: checker, What: fmt.Sprintf("%s went back: release %d (n=%d) after release %d (n=%d)", r.Worker, r.Token, n, prev.release, prev.n)})
		}
		if n > published {
			out = append(out, Violation{Checker: checker, What: fmt.Sprintf("%s saw n=%d, never published", r.Worker, n)})
		}
		last[r.Worker] = state{r.Token, n}
	}
	return out
}
