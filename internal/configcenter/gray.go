package configcenter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// Gray (canary) releases.
//
// A namespace may run one gray release at a time: a set of overrides
// (keys set or deleted) that only the instances its selector matches see,
// on top of the namespace's normal content. Gray releases are numbered 1,
// 2, 3, … per namespace in a sequence of their own; every change of the
// running gray (create, update, promote, abandon) takes the next number and
// leaves a record in the gray history.
//
// Guarantees:
//   - A subscriber that identifies itself (instance id and labels) and
//     matches the selector sees the normal content with the overrides
//     applied, through the same SNAPSHOT and CHANGE events; a subscriber
//     that does not match, or does not identify itself, never receives an
//     overridden value. Normal releases made while a gray runs reach the
//     matching subscribers too, without the keys the gray overrides.
//   - Create, update, promote and abandon are each one etcd transaction:
//     every subscriber sees the gray start, change or end at one revision.
//     Promote makes the overrides the next normal release in the same
//     transaction that ends the gray, so a matching instance's content does
//     not change and a non-matching one gets exactly the gray's changes.
//   - The effective content of every instance (normal, and normal with the
//     overrides) is validated against the namespace's schema on create,
//     update and every normal release: a release that would make the gray's
//     content invalid is refused.
//
// Non-guarantees:
//   - Matching trusts the identity a subscriber states: a gray release is a
//     rollout tool, not access control (use the auth policy for that).
//   - Snapshot, Get and Poll read the normal content; only watches see the
//     gray content.
//   - A subscriber that identifies itself resumes with a SNAPSHOT, not the
//     releases since its revision, when a gray of its namespaces runs or
//     changed since then.

// Gray release errors.
var (
	// ErrGrayNotFound: the namespace runs no gray release (or not the one
	// named).
	ErrGrayNotFound = errkind.ReleaseNotFound.New("config: no such gray release")
	// ErrGrayRunning: a gray release already runs in the namespace;
	// update, promote or abandon it first.
	ErrGrayRunning = errkind.RevisionMismatch.New("config: a gray release is already running")
)

// Selector limits.
const (
	MaxGrayInstances = 1000
	MaxGrayLabels    = 16
)

// Identity is what a subscriber says about itself, to be matched against
// gray selectors.
type Identity struct {
	Instance string
	Labels   map[string]string
}

func (who *Identity) validate() error {
	if err := names.CheckRequestID(who.Instance); err != nil || len(who.Instance) > MaxInstanceBytes {
		return fmt.Errorf("%w: instance id %q: 1-%d bytes of letters, digits and . _ : @ -", ErrInvalid, who.Instance, MaxInstanceBytes)
	}
	if len(who.Labels) > MaxStatusLabels {
		return fmt.Errorf("%w: %d labels, at most %d are allowed", ErrInvalid, len(who.Labels), MaxStatusLabels)
	}
	for k, v := range who.Labels {
		if err := validateLine("label", k+v, 512); err != nil {
			return err
		}
	}
	return nil
}

// GraySelector chooses the instances a gray release reaches: an instance
// matches if its id is listed in Instances, or it carries every label in
// Labels (when there are any), or it falls within Percent of all instances.
// The percentage is a stable hash of the namespace and the instance id, so
// raising it only adds instances.
type GraySelector struct {
	Instances []string          `json:"instances,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Percent   int               `json:"percent,omitempty"`
}

// Matches reports whether the instance who is in the selection for ns.
func (sel GraySelector) Matches(ns string, who *Identity) bool {
	if who == nil || who.Instance == "" {
		return false
	}
	if slices.Contains(sel.Instances, who.Instance) {
		return true
	}
	if len(sel.Labels) > 0 {
		all := true
		for k, v := range sel.Labels {
			if got, ok := who.Labels[k]; !ok || got != v {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return sel.Percent > 0 && percentile(ns, who.Instance) < sel.Percent
}

// percentile places an instance in 0..99 for a namespace, stably.
func percentile(ns, instance string) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(ns))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(instance))
	return int(h.Sum64() % 100)
}

func (sel GraySelector) validate() error {
	if len(sel.Instances) == 0 && len(sel.Labels) == 0 && sel.Percent == 0 {
		return fmt.Errorf("%w: a gray release needs a selector: instances, labels or a percentage", ErrInvalid)
	}
	if sel.Percent < 0 || sel.Percent > 100 {
		return fmt.Errorf("%w: percent %d is not within 0-100", ErrInvalid, sel.Percent)
	}
	if len(sel.Instances) > MaxGrayInstances {
		return fmt.Errorf("%w: %d instances, at most %d may be listed", ErrInvalid, len(sel.Instances), MaxGrayInstances)
	}
	for _, in := range sel.Instances {
		if err := names.CheckRequestID(in); err != nil || len(in) > MaxInstanceBytes {
			return fmt.Errorf("%w: instance id %q: 1-%d bytes of letters, digits and . _ : @ -", ErrInvalid, in, MaxInstanceBytes)
		}
	}
	if len(sel.Labels) > MaxGrayLabels {
		return fmt.Errorf("%w: %d labels, at most %d are allowed", ErrInvalid, len(sel.Labels), MaxGrayLabels)
	}
	for k, v := range sel.Labels {
		if k == "" {
			return fmt.Errorf("%w: a label needs a name", ErrInvalid)
		}
		if err := validateLine("label", k+v, 512); err != nil {
			return err
		}
	}
	return nil
}

// GrayAction is what a gray record did.
type GrayAction string

// Gray actions.
const (
	GrayCreate  GrayAction = "create"
	GrayUpdate  GrayAction = "update"
	GrayPromote GrayAction = "promote"
	GrayAbandon GrayAction = "abandon"
)

// Gray is a gray release: one change of a namespace's gray (create, update,
// promote or abandon), with the gray's definition as of that change.
type Gray struct {
	Namespace string       `json:"-"`
	Number    int64        `json:"number"` // 1, 2, 3, … per namespace
	Action    GrayAction   `json:"action"`
	Selector  GraySelector `json:"selector"`
	// Overrides are the keys the gray sets or deletes, sorted by key.
	Overrides []Mutation `json:"overrides"`
	// Base is the normal release in effect when the record was made.
	Base int64 `json:"base"`
	// Changes are what a matching instance sees change against Base's
	// content (for promote and abandon, what the end of the gray changes
	// for the non-matching and the matching instances respectively).
	Changes []Change `json:"changes,omitempty"`
	// PromotedTo is the normal release a promote made (or, if the
	// overrides changed nothing, the release in effect).
	PromotedTo int64     `json:"promoted_to,omitempty"`
	Author     string    `json:"author,omitempty"`
	Message    string    `json:"message,omitempty"`
	Time       time.Time `json:"time"`
	Revision   int64     `json:"-"` // the etcd revision it was committed at
}

// Running reports whether the gray runs after this record.
func (g *Gray) Running() bool {
	return g != nil && (g.Action == GrayCreate || g.Action == GrayUpdate)
}

// apply returns content with the gray's overrides applied (a new map).
func (g *Gray) apply(content map[string]string) map[string]string {
	out := maps.Clone(content)
	for _, m := range g.Overrides {
		if m.Delete {
			delete(out, m.Key)
		} else {
			out[m.Key] = m.Value
		}
	}
	return out
}

// overrides reports whether the gray sets or deletes key.
func (g *Gray) overrides(key string) bool {
	_, found := slices.BinarySearchFunc(g.Overrides, key, func(m Mutation, k string) int { return strings.Compare(m.Key, k) })
	return found
}

func (s *Store) grayKey(ns string) string    { return s.nsPrefix(ns) + "gray" }
func (s *Store) grayPrefix(ns string) string { return s.root + "gray/" + names.Escape(ns) + "/" }
func (s *Store) grayRecKey(ns string, n int64) string {
	return s.grayPrefix(ns) + fmt.Sprintf("%020d", n)
}

func (s *Store) decodeGray(ns string, key string, val []byte, rev int64) (*Gray, error) {
	var g Gray
	if err := json.Unmarshal(val, &g); err != nil {
		return nil, fmt.Errorf("config: decode %q: %w", key, err)
	}
	g.Namespace, g.Revision = ns, rev
	return &g, nil
}

// GrayRequest creates or updates a gray release.
type GrayRequest struct {
	Namespace string
	// Selector: required to create; to update, nil keeps the current one.
	Selector *GraySelector
	// Mutations are the gray's overrides: required to create; to update,
	// nil keeps the current ones, others replace them.
	Mutations []Mutation
	// Expected, to update, is the number of the gray the caller means to
	// change (0: whichever runs); a different one fails with
	// ErrGrayNotFound.
	Expected        int64
	Author, Message string
	// DryRun validates and returns the record without writing it.
	DryRun bool
}

// CreateGray starts a gray release. It fails with ErrGrayRunning if one
// already runs.
func (s *Store) CreateGray(ctx context.Context, req GrayRequest) (Gray, error) {
	if req.Selector == nil || req.Mutations == nil {
		return Gray{}, fmt.Errorf("%w: a gray release needs a selector and at least one change", ErrInvalid)
	}
	return s.changeGray(ctx, req, GrayCreate)
}

// UpdateGray changes the running gray release's selector or overrides (or
// both). It fails with ErrGrayNotFound if none runs.
func (s *Store) UpdateGray(ctx context.Context, req GrayRequest) (Gray, error) {
	if req.Selector == nil && req.Mutations == nil {
		return Gray{}, fmt.Errorf("%w: an update needs a new selector or new changes", ErrInvalid)
	}
	return s.changeGray(ctx, req, GrayUpdate)
}

// AbandonGray ends the running gray release: its instances return to the
// normal content. expected as in GrayRequest.
func (s *Store) AbandonGray(ctx context.Context, ns string, expected int64, author, message string) (Gray, error) {
	return s.changeGray(ctx, GrayRequest{Namespace: ns, Expected: expected, Author: author, Message: message}, GrayAbandon)
}

func (s *Store) checkGrayText(req GrayRequest) error {
	if err := ValidateNamespace(req.Namespace); err != nil {
		return err
	}
	if err := validateLine("author", req.Author, MaxAuthorBytes); err != nil {
		return err
	}
	if err := validateText("message", req.Message, MaxMessageBytes); err != nil {
		return err
	}
	if req.Expected < 0 {
		return fmt.Errorf("%w: gray number %d is negative", ErrInvalid, req.Expected)
	}
	if req.Selector != nil {
		if err := req.Selector.validate(); err != nil {
			return err
		}
	}
	if req.Mutations != nil {
		if err := s.checkMutations(req.Mutations); err != nil {
			return err
		}
	}
	return nil
}

// refuseSecretOverrides refuses a gray that would override a secret key: a
// gray record keeps its overrides in clear, for every reader of the gray.
func refuseSecretOverrides(cur nsState, overrides []Mutation) error {
	for _, m := range overrides {
		if m.Secret || keyring.IsSealed(cur.Content[m.Key]) {
			return fmt.Errorf("%w: key %q is secret, and a gray release cannot override a secret (its overrides are kept in clear); publish it instead", ErrInvalid, m.Key)
		}
	}
	return nil
}

// runningGray returns the running gray of cur, checked against expected.
func runningGray(cur nsState, expected int64) (*Gray, error) {
	if !cur.gray.Running() {
		return nil, fmt.Errorf("%w: %q runs no gray release", ErrGrayNotFound, cur.Namespace)
	}
	if expected > 0 && cur.gray.Number != expected {
		return nil, fmt.Errorf("%w: %q runs gray release %d, not %d", ErrGrayNotFound, cur.Namespace, cur.gray.Number, expected)
	}
	return cur.gray, nil
}

// changeGray writes the next gray record for action, retrying if the
// namespace changes before the commit.
func (s *Store) changeGray(ctx context.Context, req GrayRequest, action GrayAction) (Gray, error) {
	if err := s.checkGrayText(req); err != nil {
		return Gray{}, err
	}
	ns := req.Namespace
	for {
		cur, err := s.readNamespace(ctx, ns, 0)
		if err != nil {
			return Gray{}, err
		}
		next := Gray{Namespace: ns, Action: action, Base: cur.Release, Author: req.Author, Message: req.Message, Time: s.now().UTC()}
		if cur.gray != nil {
			next.Number = cur.gray.Number + 1
		} else {
			next.Number = 1
		}
		switch action {
		case GrayCreate:
			if cur.gray.Running() {
				return Gray{}, fmt.Errorf("%w: %q runs gray release %d; update, promote or abandon it", ErrGrayRunning, ns, cur.gray.Number)
			}
			next.Selector, next.Overrides = *req.Selector, sortedMutations(req.Mutations)
		case GrayUpdate, GrayAbandon:
			g, err := runningGray(cur, req.Expected)
			if err != nil {
				return Gray{}, err
			}
			next.Selector, next.Overrides = g.Selector, g.Overrides
			if req.Selector != nil {
				next.Selector = *req.Selector
			}
			if req.Mutations != nil {
				next.Overrides = sortedMutations(req.Mutations)
			}
		}
		if action != GrayAbandon {
			if cur.approval.Required {
				return Gray{}, fmt.Errorf("%w: %q changes only by approved proposals, and a gray release is not one yet: propose the release instead", ErrApprovalRequired, ns)
			}
			if err := refuseSecretOverrides(cur, next.Overrides); err != nil {
				return Gray{}, err
			}
		}
		gray := next.apply(cur.Content)
		if action == GrayAbandon {
			next.Changes = diff(cur.gray.apply(cur.Content), cur.Content)
		} else {
			next.Changes = diff(cur.Content, gray)
			if err := s.validateGrayContent(ctx, cur, gray); err != nil {
				return Gray{}, err
			}
		}
		ops, err := s.grayOps(ns, next)
		if err != nil {
			return Gray{}, err
		}
		if req.DryRun {
			return next, nil
		}
		resp, err := s.cli.Txn(ctx).If(s.unchanged(ns, cur)...).Then(ops...).Commit()
		if err != nil {
			return Gray{}, fmt.Errorf("config: %s gray release of %q: %w", action, ns, err)
		}
		if resp.Succeeded {
			next.Revision = resp.Header.Revision
			return next, nil
		}
	}
}

// unchanged are the compares that guard a write planned on cur: no
// release, schema change or gray change got in first.
func (s *Store) unchanged(ns string, cur nsState) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(s.metaKey(ns)), "=", cur.metaRev),
		clientv3.Compare(clientv3.ModRevision(s.schemaKey(ns)), "=", cur.schemaRev),
		clientv3.Compare(clientv3.ModRevision(s.grayKey(ns)), "=", cur.grayRev),
		clientv3.Compare(clientv3.ModRevision(s.approvalKey(ns)), "=", cur.approvalRev),
		clientv3.Compare(clientv3.ModRevision(s.inheritKey(ns)), "=", cur.inheritRev),
		clientv3.Compare(clientv3.ModRevision(s.heirsKey(ns)), "=", cur.heirsRev),
	}
}

// validateGrayContent checks a gray's content against the namespace's
// schema.
func (s *Store) validateGrayContent(ctx context.Context, cur nsState, content map[string]string) error {
	if cur.schema == "" {
		return nil
	}
	sch, err := compileSchema(cur.schema)
	if err != nil {
		return fmt.Errorf("config: the stored schema of %q: %w", cur.Namespace, err)
	}
	if err := s.validateContent(ctx, cur.Namespace, sch, content, nil); err != nil {
		return fmt.Errorf("the gray release's content: %w", err)
	}
	return nil
}

func sortedMutations(ms []Mutation) []Mutation {
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b Mutation) int { return strings.Compare(a.Key, b.Key) })
	for i := range out {
		if out[i].Delete {
			out[i].Value = ""
		}
	}
	return out
}

// grayOps write a gray record: the namespace's gray key, the record in
// the gray history, and the pruning of that history beyond the retention.
func (s *Store) grayOps(ns string, g Gray) ([]clientv3.Op, error) {
	rec, err := json.Marshal(g)
	if err != nil {
		return nil, err
	}
	if len(rec) > s.limits.MaxReleaseBytes {
		return nil, fmt.Errorf("%w: the gray release's record is %d bytes (its overrides, and its changes with old and new values), at most %d are allowed",
			ErrTooLarge, len(rec), s.limits.MaxReleaseBytes)
	}
	ops := []clientv3.Op{clientv3.OpPut(s.grayKey(ns), string(rec)), clientv3.OpPut(s.grayRecKey(ns, g.Number), string(rec))}
	if oldest := g.Number - int64(s.limits.HistoryReleases); oldest >= 1 {
		ops = append(ops, clientv3.OpDelete(s.grayPrefix(ns), clientv3.WithRange(s.grayRecKey(ns, oldest+1))))
	}
	return ops, nil
}

// PromoteGray makes the running gray's overrides the next normal release
// and ends the gray, in one transaction: matching instances keep their
// content, the others get the gray's changes. expected as in GrayRequest.
// It returns the gray record (PromotedTo names the release) and the
// release (with no changes if the overrides changed nothing).
func (s *Store) PromoteGray(ctx context.Context, ns string, expected int64, author, message string) (Gray, Release, error) {
	req := GrayRequest{Namespace: ns, Expected: expected, Author: author, Message: message}
	if err := s.checkGrayText(req); err != nil {
		return Gray{}, Release{}, err
	}
	var rec Gray
	if message == "" {
		message = "promote gray release"
	}
	rel, err := s.commit(ctx, commitRequest{
		ns: ns, author: author, message: message, always: true, promoteGray: true,
		plan: func(_ context.Context, cur nsState) ([]Mutation, error) {
			g, err := runningGray(cur, expected)
			if err != nil {
				return nil, err
			}
			// A key made secret since the gray began: its override, kept
			// in clear, must not become the secret.
			if err := refuseSecretOverrides(cur, g.Overrides); err != nil {
				return nil, err
			}
			return g.Overrides, nil
		},
		extra: func(cur nsState, rel Release) ([]clientv3.Op, error) {
			g := cur.gray
			rec = Gray{Namespace: ns, Number: g.Number + 1, Action: GrayPromote, Selector: g.Selector, Overrides: g.Overrides,
				Base: cur.Release, Changes: rel.Changes, PromotedTo: rel.Number, Author: author, Message: message, Time: rel.Time}
			return s.grayOps(ns, rec)
		},
	})
	if err != nil {
		return Gray{}, Release{}, err
	}
	rec.Revision = rel.Revision
	return rec, rel, nil
}

// CurrentGray returns the namespace's running gray release; ErrGrayNotFound
// if none runs.
func (s *Store) CurrentGray(ctx context.Context, ns string) (Gray, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Gray{}, err
	}
	cur, err := s.readNamespace(ctx, ns, 0)
	if err != nil {
		return Gray{}, err
	}
	g, err := runningGray(cur, 0)
	if err != nil {
		return Gray{}, err
	}
	return *g, nil
}

// GrayReleases returns up to limit gray records of a namespace, newest
// first, starting below number before (0: from the newest). Only the last
// Limits.HistoryReleases are kept.
func (s *Store) GrayReleases(ctx context.Context, ns string, before int64, limit int) ([]Gray, error) {
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	if limit <= 0 || before < 0 {
		return nil, fmt.Errorf("%w: list limit %d, before %d", ErrInvalid, limit, before)
	}
	end := clientv3.GetPrefixRangeEnd(s.grayPrefix(ns))
	if before > 0 {
		end = s.grayRecKey(ns, before)
	}
	resp, err := s.cli.Get(ctx, s.grayPrefix(ns), clientv3.WithRange(end),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("config: gray releases of %q: %w", ns, err)
	}
	out := make([]Gray, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		g, err := s.decodeGray(ns, string(kv.Key), kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		out = append(out, *g)
	}
	return out, nil
}

// grayContent returns what the instances matching gray record n saw: the
// content of its base release with its overrides (for an abandon, the
// overrides it ended).
func (s *Store) grayContent(ctx context.Context, ns string, n int64, cur nsState) (map[string]string, error) {
	resp, err := s.cli.Get(ctx, s.grayRecKey(ns, n), clientv3.WithRev(cur.Revision))
	if err != nil {
		return nil, s.readErr(err, cur.Revision)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: gray release %d of %q (the last %d are kept)", ErrGrayNotFound, n, ns, s.limits.HistoryReleases)
	}
	g, err := s.decodeGray(ns, string(resp.Kvs[0].Key), resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	if err != nil {
		return nil, err
	}
	base, err := s.contentAt(ctx, ns, g.Base, cur)
	if err != nil {
		if errors.Is(err, ErrReleaseNotFound) {
			return nil, fmt.Errorf("%w: gray release %d is based on release %d: %s", ErrReleaseNotFound, n, g.Base, err.Error())
		}
		return nil, err
	}
	return g.apply(base), nil
}
