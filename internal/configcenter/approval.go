package configcenter

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/names"
)

// Approval (four eyes). A namespace whose ApprovalPolicy requires it
// changes only by proposals that another principal approves: a proposal
// holds the release's mutations (secret values sealed) and the changes they
// made against the release it was based on; Approve makes the release, in
// one transaction that also closes the proposal, only if the namespace has
// had no release since (else ErrRevisionMismatch: propose again), the
// proposal has not expired, and the approver is not the proposer. Direct
// writes (publish, put, delete, rollback, gray releases) fail with
// ErrApprovalRequired. The release records who proposed and who approved.
//
// Turning approval off needs two principals too (see SetApproval).
//
// Non-guarantees: identities are what the caller says they are: the
// principal when coordd authenticates callers, else the author a caller
// gives (so without authentication four eyes is a convention, not a
// control). Proposals beyond the last MaxProposals of a namespace are
// pruned.

// Errors.
var (
	// ErrApprovalRequired: the namespace changes only by approved
	// proposals; nothing changed.
	ErrApprovalRequired = errkind.ApprovalRequired.New("config: approval required")
	// ErrProposalNotFound: no such proposal.
	ErrProposalNotFound = errkind.ProposalNotFound.New("config: proposal not found")
	// ErrProposalClosed: the proposal is no longer pending (approved,
	// rejected, withdrawn or expired); nothing changed.
	ErrProposalClosed = errkind.ProposalClosed.New("config: proposal closed")
	// ErrSelfApproval: the proposer tried to approve their own proposal.
	ErrSelfApproval = errkind.PermissionDenied.New("config: four eyes: a proposal is approved by someone other than its proposer")
)

// Bounds.
const (
	// MaxProposals is how many proposals of a namespace are kept.
	MaxProposals = 100
	// DefaultProposalTTL is how long a proposal waits for approval when
	// the policy says nothing.
	DefaultProposalTTL = 24 * time.Hour
	// MaxProposalTTL bounds ApprovalPolicy.TTL.
	MaxProposalTTL = 30 * 24 * time.Hour
)

// ApprovalPolicy is a namespace's setting.
type ApprovalPolicy struct {
	// Required makes the namespace change only by approved proposals.
	Required bool `json:"required"`
	// TTL is how long a proposal may wait (0: DefaultProposalTTL).
	TTL time.Duration `json:"ttl,omitempty"`
	// OffRequestedBy and OffRequested, on a required policy, say who asked
	// to turn approval off and when: it goes off when another principal
	// asks too, before the request expires (the policy's TTL). Set by
	// SetApproval; ignored in what callers pass.
	OffRequestedBy string    `json:"off_requested_by,omitempty"`
	OffRequested   time.Time `json:"off_requested,omitzero"`
}

// ErrSecondAdmin is returned when turning approval off is asked again by the principal
// who asked first; another one must.
var ErrSecondAdmin = errkind.PermissionDenied.New("config: four eyes: approval goes off when a second principal asks too")

func (p ApprovalPolicy) ttl() time.Duration {
	if p.TTL <= 0 {
		return DefaultProposalTTL
	}
	return p.TTL
}

// ProposalState is where a proposal stands.
type ProposalState string

// Proposal states.
const (
	ProposalPending   ProposalState = "PENDING"
	ProposalApproved  ProposalState = "APPROVED"
	ProposalRejected  ProposalState = "REJECTED"
	ProposalWithdrawn ProposalState = "WITHDRAWN"
	ProposalExpired   ProposalState = "EXPIRED" // pending past its expiry; never stored
)

// Proposal is a release waiting for approval.
type Proposal struct {
	Namespace string        `json:"-"`
	Number    int64         `json:"number"` // 1, 2, 3, … per namespace
	State     ProposalState `json:"state"`
	// Proposer is who proposed it (a principal, or the author given when
	// coordd does not authenticate); Author and Message go with the
	// release.
	Proposer string `json:"proposer"`
	Author   string `json:"author,omitempty"`
	Message  string `json:"message,omitempty"`
	// Mutations are what the release will do (secret values sealed).
	Mutations []Mutation `json:"mutations"`
	// RollbackOf is the release whose content it restores, if any.
	RollbackOf int64 `json:"rollback_of,omitempty"`
	// Base is the release it was made on, BaseRevision that release's
	// revision (0: none): it is approved only if the namespace is still
	// there.
	Base         int64 `json:"base"`
	BaseRevision int64 `json:"base_revision"`
	// Changes are what it changes against Base.
	Changes []Change  `json:"changes"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// DecidedBy, Decided and Decision say who approved, rejected or
	// withdrew it, when, and why; Release is the release an approval made.
	DecidedBy string    `json:"decided_by,omitempty"`
	Decided   time.Time `json:"decided,omitempty"`
	Decision  string    `json:"decision,omitempty"`
	Release   int64     `json:"release,omitempty"`
	Revision  int64     `json:"-"` // the etcd revision of its last change
}

func (s *Store) approvalKey(ns string) string { return s.nsPrefix(ns) + "approval" }
func (s *Store) propPrefix(ns string) string  { return s.root + "prop/" + names.Escape(ns) + "/" }
func (s *Store) propKey(ns string, n int64) string {
	return s.propPrefix(ns) + fmt.Sprintf("%020d", n)
}

// ApprovalChange is what SetApproval did.
type ApprovalChange struct {
	Revision int64
	// Pending says that turning approval off waits for a second principal
	// (Policy.OffRequestedBy asked); the namespace still requires approval.
	Pending bool
	Policy  ApprovalPolicy // the policy now in force
}

// SetApproval sets (Required false: removes) a namespace's approval
// policy, asked by by (a principal, or the author given when coordd does
// not authenticate), and returns what it did. Requiring approval, or
// changing a required policy's TTL, takes effect at once. Turning a
// required policy off is itself four eyes: the first principal who asks
// only records the request (Pending); it takes effect when another one
// asks before the request expires (the policy's TTL); the same principal
// asking again fails with ErrSecondAdmin. Proposals pending when approval
// goes off stay, and may still be approved.
func (s *Store) SetApproval(ctx context.Context, ns string, p ApprovalPolicy, by string) (ApprovalChange, error) {
	if err := ValidateNamespace(ns); err != nil {
		return ApprovalChange{}, err
	}
	if p.TTL < 0 || p.TTL > MaxProposalTTL {
		return ApprovalChange{}, fmt.Errorf("%w: a proposal's time to live is 0 (the default, %s) to %s", ErrInvalid, DefaultProposalTTL, MaxProposalTTL)
	}
	if err := validateLine("the principal asking", by, MaxMessageBytes); err != nil {
		return ApprovalChange{}, err
	}
	p.OffRequestedBy, p.OffRequested = "", time.Time{}
	for {
		resp, err := s.cli.Get(ctx, s.approvalKey(ns))
		if err != nil {
			return ApprovalChange{}, fmt.Errorf("config: read the approval policy of %q: %w", ns, err)
		}
		var cur ApprovalPolicy
		var mod int64
		if len(resp.Kvs) == 1 {
			mod = resp.Kvs[0].ModRevision
			if err := json.Unmarshal(resp.Kvs[0].Value, &cur); err != nil {
				return ApprovalChange{}, fmt.Errorf("config: decode the approval policy of %q: %w", ns, err)
			}
		}
		next, pending := p, false
		if cur.Required && !p.Required {
			asked := cur.OffRequestedBy != "" || !cur.OffRequested.IsZero()
			live := asked && s.now().Before(cur.OffRequested.Add(cur.ttl()))
			switch {
			case live && cur.OffRequestedBy == by:
				return ApprovalChange{}, fmt.Errorf("%w: %q asked to turn approval off at %s already; another principal must ask too (before %s)",
					ErrSecondAdmin, by, cur.OffRequested.Format(time.RFC3339), cur.OffRequested.Add(cur.ttl()).Format(time.RFC3339))
			case !live:
				next, pending = cur, true
				next.OffRequestedBy, next.OffRequested = by, s.now().UTC()
			}
		}
		op := clientv3.OpDelete(s.approvalKey(ns))
		if next.Required {
			b, err := json.Marshal(next)
			if err != nil {
				return ApprovalChange{}, err
			}
			op = clientv3.OpPut(s.approvalKey(ns), string(b))
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.approvalKey(ns)), "=", mod)).Then(op).Commit()
		if err != nil {
			return ApprovalChange{}, fmt.Errorf("config: set the approval policy of %q: %w", ns, err)
		}
		if tr.Succeeded {
			return ApprovalChange{Revision: tr.Header.Revision, Pending: pending, Policy: next}, nil
		}
		// Changed meanwhile: decide again on what is there now.
	}
}

// Approval returns a namespace's approval policy.
func (s *Store) Approval(ctx context.Context, ns string) (ApprovalPolicy, error) {
	if err := ValidateNamespace(ns); err != nil {
		return ApprovalPolicy{}, err
	}
	resp, err := s.cli.Get(ctx, s.approvalKey(ns))
	if err != nil {
		return ApprovalPolicy{}, fmt.Errorf("config: read the approval policy of %q: %w", ns, err)
	}
	if len(resp.Kvs) == 0 {
		return ApprovalPolicy{}, nil
	}
	var p ApprovalPolicy
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
		return ApprovalPolicy{}, fmt.Errorf("config: decode the approval policy of %q: %w", ns, err)
	}
	return p, nil
}

// ProposeRequest is a release to propose.
type ProposeRequest struct {
	Namespace string
	Mutations []Mutation
	// RollbackTo proposes restoring that release's content instead.
	RollbackTo int64
	// ExpectedRevision, when positive, refuses the proposal if the
	// namespace changed after it (as PublishRequest's).
	ExpectedRevision int64
	// Proposer is who proposes (required: the four-eyes check compares
	// it with the approver).
	Proposer        string
	Author, Message string
}

// Propose validates a release as Publish would (keys, sizes, schema) and
// records it as a pending proposal, without changing the namespace. A
// proposal that changes nothing is refused (ErrInvalid). It works whether
// or not the namespace requires approval.
func (s *Store) Propose(ctx context.Context, req ProposeRequest) (Proposal, error) {
	if err := ValidateNamespace(req.Namespace); err != nil {
		return Proposal{}, err
	}
	if req.Proposer == "" {
		return Proposal{}, fmt.Errorf("%w: a proposal needs a proposer: sign in, or give an author", ErrInvalid)
	}
	// No mutations: an heir's catch-up with its shared namespace (a
	// proposal that changes nothing is refused below).
	if req.RollbackTo == 0 && len(req.Mutations) > 0 {
		if err := s.checkMutations(req.Mutations); err != nil {
			return Proposal{}, err
		}
	}
	if err := validateText("message", req.Message, MaxMessageBytes); err != nil {
		return Proposal{}, err
	}
	for _, t := range []struct{ what, v string }{{"author", req.Author}, {"proposer", req.Proposer}} {
		if err := validateLine(t.what, t.v, MaxMessageBytes); err != nil {
			return Proposal{}, err
		}
	}
	for {
		cur, err := s.readNamespace(ctx, req.Namespace, 0)
		if err != nil {
			return Proposal{}, err
		}
		p, ops, cmps, err := s.planProposal(ctx, req, cur)
		if err != nil {
			return Proposal{}, err
		}
		resp, err := s.cli.Txn(ctx).If(append(cmps, s.unchanged(req.Namespace, cur)...)...).Then(ops...).Commit()
		if err != nil {
			return Proposal{}, fmt.Errorf("config: propose in %q: %w", req.Namespace, err)
		}
		if resp.Succeeded {
			p.Revision = resp.Header.Revision
			return p, nil
		}
	}
}

// planProposal makes req's proposal on cur: the record and the writes and
// guards that store it (and the namespace's data key, for a first secret).
func (s *Store) planProposal(ctx context.Context, req ProposeRequest, cur nsState) (Proposal, []clientv3.Op, []clientv3.Cmp, error) {
	if req.ExpectedRevision > 0 && cur.metaRev > req.ExpectedRevision {
		return Proposal{}, nil, nil, fmt.Errorf("%w: %q changed at revision %d (release %d), after the expected revision %d",
			ErrRevisionMismatch, req.Namespace, cur.metaRev, cur.Release, req.ExpectedRevision)
	}
	ms := req.Mutations
	if req.RollbackTo > 0 && len(ms) > 0 {
		return Proposal{}, nil, nil, fmt.Errorf("%w: a proposal is a rollback or mutations, not both", ErrInvalid)
	}
	if req.RollbackTo > 0 && cur.inherit != nil {
		return Proposal{}, nil, nil, errHeirRollback(cur)
	}
	if req.RollbackTo > 0 {
		var err error
		if ms, err = s.rollbackMutations(ctx, req.Namespace, req.RollbackTo, cur); err != nil {
			return Proposal{}, nil, nil, err
		}
	}
	sealed, err := s.sealMutations(ctx, cur, ms)
	if err != nil {
		return Proposal{}, nil, nil, err
	}
	changes, next := applyMutations(cur.Content, sealed.ms)
	if cur.inherit != nil { // what the heir's release will do: see planHeir
		hp, err := s.planHeir(ctx, cur, sealed.ms, false)
		if err != nil {
			return Proposal{}, nil, nil, err
		}
		changes, next = hp.changes, hp.next
	}
	if len(changes) == 0 {
		return Proposal{}, nil, nil, fmt.Errorf("%w: the proposal changes nothing: %q already has that content", ErrInvalid, req.Namespace)
	}
	if err := s.checkSchema(ctx, commitRequest{ns: req.Namespace}, cur, next, sealed.key); err != nil {
		return Proposal{}, nil, nil, err
	}
	last, err := s.lastProposal(ctx, req.Namespace)
	if err != nil {
		return Proposal{}, nil, nil, err
	}
	now := s.now().UTC()
	p := Proposal{
		Namespace: req.Namespace, Number: last + 1, State: ProposalPending, Proposer: req.Proposer, Author: req.Author, Message: req.Message,
		Mutations: sealed.ms, RollbackOf: req.RollbackTo, Base: cur.Release, BaseRevision: cur.metaRev, Changes: changes,
		Created: now, Expires: now.Add(cur.approval.ttl()),
	}
	b, err := json.Marshal(p)
	if err != nil {
		return Proposal{}, nil, nil, err
	}
	if len(b) > s.limits.MaxReleaseBytes {
		return Proposal{}, nil, nil, fmt.Errorf("%w: the proposal is %d bytes, at most %d are allowed; split it", ErrTooLarge, len(b), s.limits.MaxReleaseBytes)
	}
	key := s.propKey(req.Namespace, p.Number)
	ops := append([]clientv3.Op{clientv3.OpPut(key, string(b))}, sealed.ops...)
	if oldest := p.Number - MaxProposals; oldest >= 1 {
		ops = append(ops, clientv3.OpDelete(s.propPrefix(req.Namespace), clientv3.WithRange(s.propKey(req.Namespace, oldest+1))))
	}
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, sealed.cmps...)
	return p, ops, cmps, nil
}

// lastProposal is the number of ns's newest proposal (0: none).
func (s *Store) lastProposal(ctx context.Context, ns string) (int64, error) {
	resp, err := s.cli.Get(ctx, s.propPrefix(ns), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("config: read the proposals of %q: %w", ns, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return strconv.ParseInt(string(resp.Kvs[0].Key[len(s.propPrefix(ns)):]), 10, 64)
}

func (s *Store) decodeProposal(ns string, value []byte, rev int64) (Proposal, error) {
	var p Proposal
	if err := json.Unmarshal(value, &p); err != nil {
		return Proposal{}, fmt.Errorf("config: decode a proposal of %q: %w", ns, err)
	}
	p.Namespace, p.Revision = ns, rev
	if p.State == ProposalPending && !s.now().Before(p.Expires) {
		p.State = ProposalExpired
	}
	return p, nil
}

// GetProposal returns proposal n of ns.
func (s *Store) GetProposal(ctx context.Context, ns string, n int64) (Proposal, error) {
	p, _, err := s.readProposal(ctx, ns, n)
	return p, err
}

func (s *Store) readProposal(ctx context.Context, ns string, n int64) (Proposal, int64, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Proposal{}, 0, err
	}
	resp, err := s.cli.Get(ctx, s.propKey(ns, n))
	if err != nil {
		return Proposal{}, 0, fmt.Errorf("config: read proposal %d of %q: %w", n, ns, err)
	}
	if len(resp.Kvs) == 0 {
		return Proposal{}, 0, fmt.Errorf("%w: %q has no proposal %d (the last %d are kept)", ErrProposalNotFound, ns, n, MaxProposals)
	}
	p, err := s.decodeProposal(ns, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	return p, resp.Kvs[0].ModRevision, err
}

// Proposals returns up to limit proposals of ns, newest first, below
// number before (0: from the newest).
func (s *Store) Proposals(ctx context.Context, ns string, before int64, limit int) ([]Proposal, error) {
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	end := clientv3.GetPrefixRangeEnd(s.propPrefix(ns))
	if before > 0 {
		end = s.propKey(ns, before)
	}
	resp, err := s.cli.Get(ctx, s.propPrefix(ns), clientv3.WithRange(end),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("config: read the proposals of %q: %w", ns, err)
	}
	out := make([]Proposal, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		p, err := s.decodeProposal(ns, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Approve carries out proposal n of ns as a release, approved by
// approver, and closes it, in one transaction. It fails, changing nothing,
// if the approver proposed it (ErrSelfApproval), it is not pending or has
// expired (ErrProposalClosed), or the namespace had a release after the
// proposal's base (ErrRevisionMismatch).
func (s *Store) Approve(ctx context.Context, ns string, n int64, approver, message string) (Release, Proposal, error) {
	if err := validateText("message", message, MaxMessageBytes); err != nil {
		return Release{}, Proposal{}, err
	}
	p, rev, err := s.readProposal(ctx, ns, n)
	if err != nil {
		return Release{}, Proposal{}, err
	}
	if err := s.decidable(p, approver); err != nil {
		return Release{}, Proposal{}, err
	}
	if approver == p.Proposer && !s.approvalSelfOK {
		return Release{}, Proposal{}, fmt.Errorf("%w: %s proposed %d", ErrSelfApproval, approver, n)
	}
	p.State, p.DecidedBy, p.Decided, p.Decision = ProposalApproved, approver, s.now().UTC(), message
	rel, err := s.commit(ctx, commitRequest{
		ns: ns, author: p.Author, message: p.Message, rollbackOf: p.RollbackOf, approved: &p,
		cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.propKey(ns, n)), "=", rev)},
		plan: func(ctx context.Context, cur nsState) ([]Mutation, error) {
			// The proposal as it is now: one rejected, withdrawn or pruned
			// since it was read fails here, not in a transaction that its
			// guard would fail again and again.
			now, nowRev, err := s.readProposal(ctx, ns, n)
			if err != nil {
				return nil, err
			}
			if nowRev != rev {
				return nil, fmt.Errorf("%w: proposal %d of %q is %s", ErrProposalClosed, n, ns, now.State)
			}
			if cur.metaRev != p.BaseRevision {
				return nil, fmt.Errorf("%w: %q had release %d after proposal %d was made on release %d: propose again", ErrRevisionMismatch, ns, cur.Release, n, p.Base)
			}
			return p.Mutations, nil
		},
		extra: func(_ nsState, rel Release) ([]clientv3.Op, error) {
			p.Release = rel.Number
			b, err := json.Marshal(p)
			if err != nil {
				return nil, err
			}
			return []clientv3.Op{clientv3.OpPut(s.propKey(ns, n), string(b))}, nil
		},
	})
	if err != nil {
		return Release{}, Proposal{}, s.closedOr(ctx, ns, n, err)
	}
	p.Revision = rel.Revision
	return rel, p, nil
}

// closedOr is err, unless proposal n was closed meanwhile: then that says
// why the approval failed.
func (s *Store) closedOr(ctx context.Context, ns string, n int64, err error) error {
	if p, _, rerr := s.readProposal(ctx, ns, n); rerr == nil && p.State != ProposalPending {
		return fmt.Errorf("%w: proposal %d of %q is %s", ErrProposalClosed, n, ns, p.State)
	}
	return err
}

func (s *Store) decidable(p Proposal, who string) error {
	if who == "" {
		return fmt.Errorf("%w: deciding a proposal needs a name: sign in, or give an author", ErrInvalid)
	}
	if p.State != ProposalPending {
		return fmt.Errorf("%w: proposal %d of %q is %s", ErrProposalClosed, p.Number, p.Namespace, p.State)
	}
	return nil
}

// Reject closes proposal n of ns without a release: rejected by decider,
// or withdrawn when the decider is its proposer. Only a pending proposal
// can be closed.
func (s *Store) Reject(ctx context.Context, ns string, n int64, decider, message string) (Proposal, error) {
	if err := validateText("message", message, MaxMessageBytes); err != nil {
		return Proposal{}, err
	}
	for {
		p, rev, err := s.readProposal(ctx, ns, n)
		if err != nil {
			return Proposal{}, err
		}
		if err := s.decidable(p, decider); err != nil {
			return Proposal{}, err
		}
		p.State, p.DecidedBy, p.Decided, p.Decision = ProposalRejected, decider, s.now().UTC(), message
		if decider == p.Proposer {
			p.State = ProposalWithdrawn
		}
		b, err := json.Marshal(p)
		if err != nil {
			return Proposal{}, err
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.propKey(ns, n)), "=", rev)).
			Then(clientv3.OpPut(s.propKey(ns, n), string(b))).Commit()
		if err != nil {
			return Proposal{}, fmt.Errorf("config: close proposal %d of %q: %w", n, ns, err)
		}
		if resp.Succeeded {
			p.Revision = resp.Header.Revision
			return p, nil
		}
	}
}
