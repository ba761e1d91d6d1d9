package configcenter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/names"
)

// Store reads and writes namespaces in etcd. It is safe for concurrent
// use.
//
// Layout under root+"config/":
//
//	ns/<ns>/k/<key>     a key's value (ns and key escaped: "/" is "%2F")
//	ns/<ns>/meta        the namespace's current release number; its mod
//	                    revision is the namespace's revision
//	ns/<ns>/schema      the namespace's JSON Schema, if any
//	rel/<ns>/<number>   a release record: author, time, message and every
//	                    change with its old and new value (the last
//	                    Limits.HistoryReleases are kept)
//
// Every write is a release, committed in one etcd transaction with the key
// changes, the meta key and the release record, guarded by the meta key's
// mod revision: releases of a namespace are serialized and numbered 1, 2,
// 3, … without gaps.
type Store struct {
	cli    *clientv3.Client
	root   string // "<root>config/"
	limits Limits
	now    func() time.Time
	// readLocal reads a namespace from the member's own copy, which may be
	// behind (see commit); tests replace it with a copy that is.
	readLocal func(ctx context.Context, ns string) (nsState, error)
	secrets   secrets
	// approvalSelfOK lets a proposer approve their own proposal: a
	// sabotage for the tests that check the four-eyes rule.
	approvalSelfOK bool
	// noCatchUp stops a shared release from reaching its heirs at once: a
	// sabotage for the tests of inheritance (the caches' catch-up remains).
	noCatchUp bool
	// mayInherit: see SetInheritCheck.
	mayInherit func(setter Setter, shared string) bool
}

// NewStore returns a Store that keeps namespaces under root+"config/".
func NewStore(cli *clientv3.Client, root string, limits Limits) *Store {
	s := &Store{cli: cli, root: root + "config/", limits: limits.withDefaults(), now: time.Now}
	s.readLocal = func(ctx context.Context, ns string) (nsState, error) {
		return s.readNamespace(ctx, ns, 0, clientv3.WithSerializable())
	}
	return s
}

// MarkRestored records that etcd was restored from a snapshot: the
// revisions between the snapshot's and now never existed in this cluster
// (the restore moved the revision past them), so a watch that resumes from
// before now is given a snapshot, never the release history, which the
// restore took back to the snapshot's. Every member of a restored cluster
// may call it; the first mark stands.
func (s *Store) MarkRestored(ctx context.Context) error {
	_, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.restoredKey()), "=", 0)).
		Then(clientv3.OpPut(s.restoredKey(), "")).Commit()
	if err != nil {
		return fmt.Errorf("config: mark the restore: %w", err)
	}
	return nil
}

// Root is the etcd prefix of everything the store writes.
func (s *Store) Root() string { return s.root }

// Limits returns the store's limits, defaults filled in.
func (s *Store) Limits() Limits { return s.limits }

func (s *Store) restoredKey() string          { return s.root + "restored" }
func (s *Store) nsPrefix(ns string) string    { return s.root + "ns/" + names.Escape(ns) + "/" }
func (s *Store) keyPrefix(ns string) string   { return s.nsPrefix(ns) + "k/" }
func (s *Store) keyKey(ns, key string) string { return s.keyPrefix(ns) + names.Escape(key) }
func (s *Store) metaKey(ns string) string     { return s.nsPrefix(ns) + "meta" }
func (s *Store) schemaKey(ns string) string   { return s.nsPrefix(ns) + "schema" }
func (s *Store) relPrefix(ns string) string   { return s.root + "rel/" + names.Escape(ns) + "/" }
func (s *Store) relKey(ns string, n int64) string {
	return s.relPrefix(ns) + fmt.Sprintf("%020d", n)
}

// Mutation is one change a release asks for.
type Mutation struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Delete bool   `json:"delete,omitempty"`
	// Secret stores the value sealed (see SetKeys). A key whose value is
	// sealed stays secret, whatever later puts say, until it is deleted.
	Secret bool `json:"secret,omitempty"`
}

// Change is one key's change in a release: Old is nil for a new key, New
// is nil for a deleted one.
type Change struct {
	Key string  `json:"key"`
	Old *string `json:"old,omitempty"`
	New *string `json:"new,omitempty"`
}

// Release is one published change of a namespace.
type Release struct {
	Namespace string    `json:"-"`
	Number    int64     `json:"number"`
	Revision  int64     `json:"-"` // the etcd revision it was committed at
	Author    string    `json:"author,omitempty"`
	Message   string    `json:"message,omitempty"`
	Time      time.Time `json:"time"`
	// RollbackOf is the release whose content this one restored, if any.
	RollbackOf int64 `json:"rollback_of,omitempty"`
	// PromotedGray is the gray release this one promoted, if any.
	PromotedGray int64    `json:"promoted_gray,omitempty"`
	Changes      []Change `json:"changes"`
	// Proposal is the approved proposal this release is (0: none): its
	// proposer and approver are recorded with it.
	Proposal   int64  `json:"proposal,omitempty"`
	ProposedBy string `json:"proposed_by,omitempty"`
	ApprovedBy string `json:"approved_by,omitempty"`
	// InheritedFrom is the shared namespace whose release InheritedRelease
	// this release carries to its heir (or, for an Inherit, starts with).
	InheritedFrom    string `json:"inherited_from,omitempty"`
	InheritedRelease int64  `json:"inherited_release,omitempty"`
}

// meta is the value of a namespace's meta key.
type meta struct {
	Release int64 `json:"release"`
	// Trimmed: every release record numbered up to it is deleted (the
	// history beyond Limits.HistoryReleases). 0 in a meta written before
	// it was kept: the next release trims from the first record.
	Trimmed int64 `json:"trimmed,omitempty"`
}

// Snapshot is a namespace's whole content at one revision.
type Snapshot struct {
	Namespace string
	Release   int64             // the release in effect (0: never written)
	Revision  int64             // the etcd revision the content is consistent at
	Content   map[string]string // key -> value; never nil
	// Changed is the revision of the namespace's last release (0 if none).
	Changed int64
	// Gray is the gray release whose overrides Content includes, for the
	// subscriber it was made for (0: none, the normal content).
	Gray int64
	// InheritanceSuspended says why it takes no more releases of the
	// shared namespace ("": it takes them; see Store.SetInheritCheck).
	InheritanceSuspended string
	// Inherits is the shared namespace it inherits from ("": none), and
	// Inherited the keys of Content whose values come from it.
	Inherits  string
	Inherited map[string]bool
}

// nsState is a namespace read at one revision.
type nsState struct {
	Snapshot
	metaRev     int64 // mod revision of the meta key (0: none)
	trimmed     int64 // the meta's Trimmed
	schema      string
	schemaRev   int64
	gray        *Gray // the last gray record (running or not); nil if none
	grayRev     int64 // mod revision of the gray key (0: none)
	approval    ApprovalPolicy
	approvalRev int64        // mod revision of the approval key (0: none)
	inherit     *Inheritance // the shared namespace it inherits from (nil: none)
	inheritRev  int64
	heirs       []string // the namespaces that inherit from it
	heirsRev    int64
}

// readNamespace reads a namespace's keys, meta and schema at rev (0: now).
func (s *Store) readNamespace(ctx context.Context, ns string, rev int64, more ...clientv3.OpOption) (nsState, error) {
	opts := append([]clientv3.OpOption{clientv3.WithPrefix()}, more...)
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, s.nsPrefix(ns), opts...)
	if err != nil {
		return nsState{}, s.readErr(err, rev)
	}
	st := nsState{Snapshot: Snapshot{Namespace: ns, Revision: resp.Header.Revision, Content: map[string]string{}}}
	if rev > 0 {
		st.Revision = rev
	}
	kp, mk, sk, gk, ak := s.keyPrefix(ns), s.metaKey(ns), s.schemaKey(ns), s.grayKey(ns), s.approvalKey(ns)
	ik, hk := s.inheritKey(ns), s.heirsKey(ns)
	for _, kv := range resp.Kvs {
		switch k := string(kv.Key); {
		case strings.HasPrefix(k, kp):
			st.Content[names.Unescape(k[len(kp):])] = string(kv.Value)
		case k == mk:
			var m meta
			if err := json.Unmarshal(kv.Value, &m); err != nil {
				return nsState{}, fmt.Errorf("config: decode %q: %w", k, err)
			}
			st.Release, st.metaRev, st.Changed, st.trimmed = m.Release, kv.ModRevision, kv.ModRevision, m.Trimmed
		case k == sk:
			st.schema, st.schemaRev = string(kv.Value), kv.ModRevision
		case k == gk:
			g, err := s.decodeGray(ns, k, kv.Value, kv.ModRevision)
			if err != nil {
				return nsState{}, err
			}
			st.gray, st.grayRev = g, kv.ModRevision
		case k == ak:
			if err := json.Unmarshal(kv.Value, &st.approval); err != nil {
				return nsState{}, fmt.Errorf("config: decode %q: %w", k, err)
			}
			st.approvalRev = kv.ModRevision
		case k == ik:
			st.inherit = &Inheritance{}
			if err := json.Unmarshal(kv.Value, st.inherit); err != nil {
				return nsState{}, fmt.Errorf("config: decode %q: %w", k, err)
			}
			st.inheritRev = kv.ModRevision
		case k == hk:
			if err := json.Unmarshal(kv.Value, &st.heirs); err != nil {
				return nsState{}, fmt.Errorf("config: decode %q: %w", k, err)
			}
			st.heirsRev = kv.ModRevision
		}
	}
	if st.inherit != nil {
		st.Inherits, st.Inherited = st.inherit.From, inheritedSet(st.inherit.Keys)
		st.InheritanceSuspended = st.inherit.Suspended
	}
	return st, nil
}

func (s *Store) readErr(err error, rev int64) error {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: revision %d", ErrCompacted, rev)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("%w: revision %d is in the future", ErrInvalid, rev)
	}
	return fmt.Errorf("config: read: %w", err)
}

// Snapshot returns a namespace's content at revision rev (0: now; reads
// are linearizable). A namespace never written is empty, release 0. A
// compacted revision fails with ErrCompacted.
func (s *Store) Snapshot(ctx context.Context, ns string, rev int64) (Snapshot, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Snapshot{}, err
	}
	if rev < 0 {
		return Snapshot{}, fmt.Errorf("%w: revision %d is negative", ErrInvalid, rev)
	}
	st, err := s.readNamespace(ctx, ns, rev)
	return st.Snapshot, err
}

// Entry is one key's value.
type Entry struct {
	Key         string
	Value       string
	ModRevision int64 // the revision that last changed it
}

// Get returns one key of a namespace at revision rev (0: now) and the
// revision of the read. A missing key fails with ErrKeyNotFound.
func (s *Store) Get(ctx context.Context, ns, key string, rev int64) (Entry, int64, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Entry{}, 0, err
	}
	if err := validateKey(key); err != nil {
		return Entry{}, 0, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if rev < 0 {
		return Entry{}, 0, fmt.Errorf("%w: revision %d is negative", ErrInvalid, rev)
	}
	var opts []clientv3.OpOption
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, s.keyKey(ns, key), opts...)
	if err != nil {
		return Entry{}, 0, s.readErr(err, rev)
	}
	at := resp.Header.Revision
	if rev > 0 {
		at = rev
	}
	if len(resp.Kvs) == 0 {
		return Entry{}, at, fmt.Errorf("%w: %q in %q", ErrKeyNotFound, key, ns)
	}
	return Entry{Key: key, Value: string(resp.Kvs[0].Value), ModRevision: resp.Kvs[0].ModRevision}, at, nil
}

// PublishRequest is a release to make.
type PublishRequest struct {
	Namespace string
	Mutations []Mutation
	// ExpectedRevision, when positive, makes the publish a compare-and-set:
	// it fails with ErrRevisionMismatch if the namespace changed after this
	// revision (pass the revision of the snapshot the change was based on).
	ExpectedRevision int64
	Author           string
	Message          string
	// DryRun computes the release and validates it without writing: the
	// result carries the changes and the number the release would get.
	DryRun bool
}

// Publish makes a release: every mutation in one etcd transaction, with
// its record for history. Mutations that change nothing are dropped; if
// none is left, nothing is written and the current release is returned
// with no changes. Every problem (bad keys, sizes, schema violations) is
// reported at once in a *ValidationError, and nothing is written.
func (s *Store) Publish(ctx context.Context, req PublishRequest) (Release, error) {
	if err := ValidateNamespace(req.Namespace); err != nil {
		return Release{}, err
	}
	if err := s.checkMutations(req.Mutations); err != nil {
		return Release{}, err
	}
	return s.commit(ctx, commitRequest{
		ns: req.Namespace, expected: req.ExpectedRevision, author: req.Author, message: req.Message, dryRun: req.DryRun,
		plan: func(context.Context, nsState) ([]Mutation, error) { return req.Mutations, nil },
	})
}

// Put sets one key; see Publish.
func (s *Store) Put(ctx context.Context, ns, key, value string, expected int64, author, message string) (Release, error) {
	return s.Publish(ctx, PublishRequest{Namespace: ns, Mutations: []Mutation{{Key: key, Value: value}}, ExpectedRevision: expected, Author: author, Message: message})
}

// Delete removes one key; see Publish. A missing key fails with
// ErrKeyNotFound.
func (s *Store) Delete(ctx context.Context, ns, key string, expected int64, author, message string) (Release, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Release{}, err
	}
	if err := s.checkMutations([]Mutation{{Key: key, Delete: true}}); err != nil {
		return Release{}, err
	}
	return s.commit(ctx, commitRequest{
		ns: ns, expected: expected, author: author, message: message,
		plan: func(_ context.Context, cur nsState) ([]Mutation, error) {
			if _, ok := cur.Content[key]; !ok {
				return nil, fmt.Errorf("%w: %q in %q", ErrKeyNotFound, key, ns)
			}
			return []Mutation{{Key: key, Delete: true}}, nil
		},
	})
}

type commitRequest struct {
	ns              string
	expected        int64
	author, message string
	dryRun          bool
	rollbackOf      int64
	// always commits extra even when the release changes nothing (no
	// release is made then).
	always bool
	// extra returns more writes for the release's transaction.
	extra func(cur nsState, rel Release) ([]clientv3.Op, error)
	// promoteGray records in the release that it promotes the running gray.
	promoteGray bool
	// approved is the proposal the release carries out: only such a
	// release may change a namespace that requires approval.
	approved *Proposal
	// cmps guard the release's transaction beyond the namespace's keys.
	cmps []clientv3.Cmp
	// inherited: the release only carries the shared namespace's content
	// to its heir (no approval gate: the shared release had its own).
	inherited bool
	// plan returns the mutations to make, given the namespace's current
	// state; it runs again if the namespace changes before the commit.
	plan func(ctx context.Context, cur nsState) ([]Mutation, error)
}

// commit reads the namespace, plans the release, validates it and commits
// it guarded by the namespace's revision, retrying the whole step if
// another release got in first (unless the caller expected a revision).
//
// The first attempt plans on the member's own copy of the namespace (a
// serializable read: no round trip to etcd's leader), which may be behind.
// Only a committed transaction is answered from that copy, and the
// transaction's guard (the meta, schema and gray keys' mod revisions) makes
// it fail if the copy was behind. Every other outcome (a refusal, nothing
// to change, a dry run, a lost guard) is decided again on a linearizable
// read, so no answer rests on a copy that was behind.
func (s *Store) commit(ctx context.Context, req commitRequest) (Release, error) {
	if err := validateLine("author", req.author, MaxAuthorBytes); err != nil {
		return Release{}, err
	}
	if err := validateText("message", req.message, MaxMessageBytes); err != nil {
		return Release{}, err
	}
	if req.expected < 0 {
		return Release{}, fmt.Errorf("%w: expected revision %d is negative", ErrInvalid, req.expected)
	}
	for linearizable := false; ; linearizable = true {
		read := s.readLocal
		if linearizable {
			read = func(ctx context.Context, ns string) (nsState, error) { return s.readNamespace(ctx, ns, 0) }
		}
		cur, err := read(ctx, req.ns)
		if err != nil {
			if linearizable {
				return Release{}, err
			}
			continue
		}
		rel, ops, cmps, answer, err := s.planRelease(ctx, req, cur)
		if err != nil || answer {
			if linearizable {
				return rel, err
			}
			continue
		}
		resp, err := s.cli.Txn(ctx).
			If(append(s.unchanged(req.ns, cur), cmps...)...).
			Then(ops...).
			Commit()
		if err != nil {
			return Release{}, fmt.Errorf("config: publish %q: %w", req.ns, err)
		}
		if resp.Succeeded {
			rel.Revision = resp.Header.Revision
			if len(cur.heirs) > 0 && len(rel.Changes) > 0 {
				s.catchUpHeirs(ctx, cur.heirs)
			}
			return rel, nil
		}
		// Another release (or a schema change) got in first, or the copy
		// was behind: plan again on the current state, where an expected
		// revision no longer matches.
	}
}

// planRelease plans req's release on cur: the release, its writes and the
// guards they need beyond the namespace's, or answer set when the release
// is the answer without a commit (it changes nothing, or it is a dry run).
func (s *Store) planRelease(ctx context.Context, req commitRequest, cur nsState) (rel Release, ops []clientv3.Op, cmps []clientv3.Cmp, answer bool, err error) {
	if req.expected > 0 && cur.metaRev > req.expected {
		return Release{}, nil, nil, false, fmt.Errorf("%w: %q changed at revision %d (release %d), after the expected revision %d",
			ErrRevisionMismatch, req.ns, cur.metaRev, cur.Release, req.expected)
	}
	if cur.approval.Required && req.approved == nil && !req.dryRun && !req.inherited { // a dry run changes nothing
		return Release{}, nil, nil, false, fmt.Errorf("%w: %q changes only by approved proposals: propose the release (coordctl config propose), and another principal approves it", ErrApprovalRequired, req.ns)
	}
	ms, err := req.plan(ctx, cur)
	if err != nil {
		return Release{}, nil, nil, false, err
	}
	sealed, err := s.sealMutations(ctx, cur, ms)
	if err != nil {
		return Release{}, nil, nil, false, err
	}
	ms, keyOps, cmps := sealed.ms, sealed.ops, sealed.cmps
	rel = Release{Namespace: req.ns, Number: cur.Release + 1, Author: req.author, Message: req.message, Time: s.now().UTC(), RollbackOf: req.rollbackOf}
	if req.promoteGray && cur.gray != nil {
		rel.PromotedGray = cur.gray.Number
	}
	if p := req.approved; p != nil {
		rel.Proposal, rel.ProposedBy, rel.ApprovedBy = p.Number, p.Proposer, p.DecidedBy
	}
	var next map[string]string
	// recordOnly: an heir whose content does not change still records a
	// newer shared release it now carries, or which keys it overrides.
	recordOnly := false
	if cur.inherit != nil {
		hp, err := s.planHeir(ctx, cur, ms, req.inherited && req.approved == nil && cur.approval.Required)
		if err != nil {
			return Release{}, nil, nil, false, err
		}
		rel.Changes, next = hp.changes, hp.next
		keyOps, cmps = append(keyOps, hp.ops...), append(cmps, hp.cmps...)
		if hp.carried > 0 {
			rel.InheritedFrom, rel.InheritedRelease = cur.inherit.From, hp.carried
		}
		recordOnly = hp.carried > 0 || hp.keysChanged
	} else {
		rel.Changes, next = applyMutations(cur.Content, ms)
	}
	if len(rel.Changes) == 0 {
		// Nothing to change: report the release in effect.
		none := Release{Namespace: req.ns, Number: cur.Release, Revision: cur.metaRev, Author: rel.Author, Message: rel.Message, Time: rel.Time, PromotedGray: rel.PromotedGray}
		if !req.always && !recordOnly {
			return none, nil, nil, true, nil
		}
		if recordOnly {
			ops = keyOps
		} else {
			cmps = nil
		}
		rel = none
	} else {
		if err := s.checkSchema(ctx, req, cur, next, sealed.key); err != nil {
			return Release{}, nil, nil, false, err
		}
		if err := s.checkHeirs(ctx, cur, next); err != nil {
			return Release{}, nil, nil, false, err
		}
		var size int
		ops, size, err = s.releaseOps(req.ns, rel, cur.trimmed)
		if err != nil {
			return Release{}, nil, nil, false, err
		}
		if size > s.limits.MaxReleaseBytes {
			return Release{}, nil, nil, false, fmt.Errorf("%w: the release writes %d bytes (its new values, and its record with old and new values), at most %d are allowed; split it",
				ErrTooLarge, size, s.limits.MaxReleaseBytes)
		}
		ops = append(ops, keyOps...)
	}
	if req.extra != nil {
		more, err := req.extra(cur, rel)
		if err != nil {
			return Release{}, nil, nil, false, err
		}
		ops = append(ops, more...)
	}
	return rel, ops, append(cmps, req.cmps...), req.dryRun, nil
}

// applyMutations applies ms to content: it returns the changes they make
// (a delete of a missing key, or a put of the value a key has, is none)
// and the content after them. content itself is not changed.
func applyMutations(content map[string]string, ms []Mutation) ([]Change, map[string]string) {
	var changes []Change
	next := maps.Clone(content)
	for _, m := range ms {
		old, had := content[m.Key]
		c := Change{Key: m.Key}
		if had {
			c.Old = &old
		}
		if m.Delete {
			if !had {
				continue
			}
			delete(next, m.Key)
		} else {
			if had && old == m.Value {
				continue
			}
			v := m.Value
			c.New = &v
			next[m.Key] = v
		}
		changes = append(changes, c)
	}
	return changes, next
}

// checkSchema validates next, the namespace's content after the release,
// against its schema (if it has one), and so does the content a running
// gray release would show on top of it, unless the release promotes it.
func (s *Store) checkSchema(ctx context.Context, req commitRequest, cur nsState, next map[string]string, dk []byte) error {
	if cur.schema == "" {
		return nil
	}
	sch, err := compileSchema(cur.schema)
	if err != nil {
		return fmt.Errorf("config: the stored schema of %q: %w", req.ns, err)
	}
	if err := s.validateContent(ctx, req.ns, sch, next, dk); err != nil {
		return err
	}
	if g := cur.gray; g.Running() && !req.promoteGray {
		if err := s.validateContent(ctx, req.ns, sch, g.apply(next), dk); err != nil {
			return fmt.Errorf("with gray release %d running: %w", g.Number, err)
		}
	}
	return nil
}

// validateContent validates content, its secret values opened, against
// sch; a problem with a secret value does not quote it.
func (s *Store) validateContent(ctx context.Context, ns string, sch *jsonschema.Schema, content map[string]string, dk []byte) error {
	plain, secret, err := s.openContent(ctx, ns, content, dk)
	if err != nil {
		return err
	}
	return validateContent(ctx, sch, plain, secret)
}

// releaseOps are the writes of one release: the keys, the meta key, the
// release record and the pruning of history beyond the retention. size is
// the bytes of values they write.
//
// The records beyond Limits.HistoryReleases are deleted from the one after
// trimmed (the namespace's meta's Trimmed), not from the first: etcd's
// index keeps a deleted key until a compaction, and a delete visits every
// key of its range, so a range from the first record cost each release a
// visit per release trimmed since the last compaction (every release made
// then, with compaction off).
func (s *Store) releaseOps(ns string, rel Release, trimmed int64) (ops []clientv3.Op, size int, err error) {
	for _, c := range rel.Changes {
		if c.New == nil {
			ops = append(ops, clientv3.OpDelete(s.keyKey(ns, c.Key)))
		} else {
			ops = append(ops, clientv3.OpPut(s.keyKey(ns, c.Key), *c.New))
			size += len(*c.New)
		}
	}
	mt := meta{Release: rel.Number, Trimmed: trimmed}
	var trim []clientv3.Op
	if oldest := rel.Number - int64(s.limits.HistoryReleases); oldest > trimmed {
		trim, mt.Trimmed = []clientv3.Op{clientv3.OpDelete(s.relKey(ns, trimmed+1), clientv3.WithRange(s.relKey(ns, oldest+1)))}, oldest
	}
	m, err := json.Marshal(mt)
	if err != nil {
		return nil, 0, err
	}
	rec, err := json.Marshal(rel)
	if err != nil {
		return nil, 0, err
	}
	size += len(rec)
	ops = append(ops, clientv3.OpPut(s.metaKey(ns), string(m)), clientv3.OpPut(s.relKey(ns, rel.Number), string(rec)))
	return append(ops, trim...), size, nil
}

// decodeRelease decodes a release record.
func (s *Store) decodeRelease(ns string, kv *mvccpb.KeyValue) (Release, error) {
	var r Release
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Release{}, fmt.Errorf("config: decode %q: %w", kv.Key, err)
	}
	r.Namespace, r.Revision = ns, kv.ModRevision
	return r, nil
}

// Releases returns up to limit releases of a namespace, newest first,
// starting below release before (0: from the newest). Only the last
// Limits.HistoryReleases are kept.
func (s *Store) Releases(ctx context.Context, ns string, before int64, limit int) ([]Release, error) {
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	if limit <= 0 || before < 0 {
		return nil, fmt.Errorf("%w: list limit %d, before %d", ErrInvalid, limit, before)
	}
	end := clientv3.GetPrefixRangeEnd(s.relPrefix(ns))
	if before > 0 {
		end = s.relKey(ns, before)
	}
	resp, err := s.cli.Get(ctx, s.relPrefix(ns), clientv3.WithRange(end),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("config: releases of %q: %w", ns, err)
	}
	out := make([]Release, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := s.decodeRelease(ns, kv)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// contentAt reconstructs a namespace's content as of release n from cur
// (read at cur.Revision) by undoing the releases after n, newest first.
// Release 0 is the empty namespace.
func (s *Store) contentAt(ctx context.Context, ns string, n int64, cur nsState) (map[string]string, error) {
	if n < 0 || n > cur.Release {
		return nil, fmt.Errorf("%w: %q has releases 1..%d, not %d", ErrReleaseNotFound, ns, cur.Release, n)
	}
	if n == 0 {
		return map[string]string{}, nil
	}
	content := maps.Clone(cur.Content)
	if n == cur.Release {
		return content, nil
	}
	resp, err := s.cli.Get(ctx, s.relKey(ns, n+1), clientv3.WithRange(s.relKey(ns, cur.Release+1)), clientv3.WithRev(cur.Revision),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return nil, s.readErr(err, cur.Revision)
	}
	if int64(len(resp.Kvs)) != cur.Release-n {
		return nil, fmt.Errorf("%w: release %d of %q is older than the %d releases kept", ErrReleaseNotFound, n, ns, s.limits.HistoryReleases)
	}
	for _, kv := range resp.Kvs {
		r, err := s.decodeRelease(ns, kv)
		if err != nil {
			return nil, err
		}
		for _, c := range r.Changes {
			if c.Old == nil {
				delete(content, c.Key)
			} else {
				content[c.Key] = *c.Old
			}
		}
	}
	return content, nil
}

// diff lists the key-level changes from a to b, sorted by key.
func diff(a, b map[string]string) []Change {
	var out []Change
	for k, old := range a {
		if nv, ok := b[k]; !ok {
			out = append(out, Change{Key: k, Old: &old})
		} else if nv != old {
			out = append(out, Change{Key: k, Old: &old, New: &nv})
		}
	}
	for k, nv := range b {
		if _, ok := a[k]; !ok {
			out = append(out, Change{Key: k, New: &nv})
		}
	}
	slices.SortFunc(out, func(x, y Change) int { return strings.Compare(x.Key, y.Key) })
	return out
}

// Diff returns the key-level changes from release from to release to (0:
// the empty namespace), sorted by key; either may be the older one.
func (s *Store) Diff(ctx context.Context, ns string, from, to int64) ([]Change, error) {
	return s.DiffRefs(ctx, ns, Ref{Number: from}, Ref{Number: to})
}

// Ref names a namespace's content: a normal release, or with Gray a gray
// release (what its instances saw: its base release's content with its
// overrides).
type Ref struct {
	Number int64
	Gray   bool
}

// DiffRefs is Diff between any two releases, normal or gray.
func (s *Store) DiffRefs(ctx context.Context, ns string, from, to Ref) ([]Change, error) {
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	cur, err := s.readNamespace(ctx, ns, 0)
	if err != nil {
		return nil, err
	}
	content := func(r Ref) (map[string]string, error) {
		if r.Gray {
			return s.grayContent(ctx, ns, r.Number, cur)
		}
		return s.contentAt(ctx, ns, r.Number, cur)
	}
	a, err := content(from)
	if err != nil {
		return nil, err
	}
	b, err := content(to)
	if err != nil {
		return nil, err
	}
	return diff(a, b), nil
}

// Rollback makes a new release whose content is that of release to (0: the
// empty namespace): history is never rewritten. It is validated like any
// release, against the current schema.
func (s *Store) Rollback(ctx context.Context, ns string, to, expected int64, author, message string) (Release, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Release{}, err
	}
	if message == "" {
		message = "rollback to release " + strconv.FormatInt(to, 10)
	}
	return s.commit(ctx, commitRequest{
		ns: ns, expected: expected, author: author, message: message, rollbackOf: to,
		plan: func(ctx context.Context, cur nsState) ([]Mutation, error) {
			if cur.inherit != nil {
				return nil, errHeirRollback(cur)
			}
			return s.rollbackMutations(ctx, ns, to, cur)
		},
	})
}

// rollbackMutations are the mutations that give ns, now cur, release to's
// content.
func (s *Store) rollbackMutations(ctx context.Context, ns string, to int64, cur nsState) ([]Mutation, error) {
	old, err := s.contentAt(ctx, ns, to, cur)
	if err != nil {
		return nil, err
	}
	var ms []Mutation
	for _, c := range diff(cur.Content, old) {
		if c.New == nil {
			ms = append(ms, Mutation{Key: c.Key, Delete: true})
		} else {
			ms = append(ms, Mutation{Key: c.Key, Value: *c.New})
		}
	}
	if len(ms) > s.limits.MaxKeysPerRelease {
		return nil, fmt.Errorf("%w: rolling back changes %d keys, at most %d may change in one release", ErrTooLarge, len(ms), s.limits.MaxKeysPerRelease)
	}
	return ms, nil
}

// Schema returns a namespace's JSON Schema ("" if none) and the revision
// of the read.
func (s *Store) Schema(ctx context.Context, ns string) (string, int64, error) {
	if err := ValidateNamespace(ns); err != nil {
		return "", 0, err
	}
	resp, err := s.cli.Get(ctx, s.schemaKey(ns))
	if err != nil {
		return "", 0, fmt.Errorf("config: schema of %q: %w", ns, err)
	}
	if len(resp.Kvs) == 0 {
		return "", resp.Header.Revision, nil
	}
	return string(resp.Kvs[0].Value), resp.Header.Revision, nil
}

// SetSchema sets (or, with "", removes) a namespace's JSON Schema. The
// namespace's current content must match it; every mismatch is reported
// at once and nothing changes. It returns the write's revision.
func (s *Store) SetSchema(ctx context.Context, ns, schema string) (int64, error) {
	if err := ValidateNamespace(ns); err != nil {
		return 0, err
	}
	op := clientv3.OpDelete(s.schemaKey(ns))
	var sch *jsonschema.Schema
	if schema != "" {
		if err := checkSchemaLimits(schema); err != nil {
			return 0, err
		}
		var err error
		if sch, err = compileSchema(schema); err != nil {
			return 0, err
		}
		op = clientv3.OpPut(s.schemaKey(ns), schema)
	}
	for {
		cur, err := s.readNamespace(ctx, ns, 0)
		if err != nil {
			return 0, err
		}
		if sch != nil {
			if err := s.validateContent(ctx, ns, sch, cur.Content, nil); err != nil {
				return 0, err
			}
			if g := cur.gray; g.Running() {
				if err := s.validateContent(ctx, ns, sch, g.apply(cur.Content), nil); err != nil {
					return 0, fmt.Errorf("the content of gray release %d: %w", g.Number, err)
				}
			}
		}
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(s.metaKey(ns)), "=", cur.metaRev),
				clientv3.Compare(clientv3.ModRevision(s.grayKey(ns)), "=", cur.grayRev)).
			Then(op).
			Commit()
		if err != nil {
			return 0, fmt.Errorf("config: set schema of %q: %w", ns, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
	}
}

// Namespaces returns up to limit namespace names that start with prefix,
// in order, after the name after ("" for the first page).
func (s *Store) Namespaces(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d is not positive", ErrInvalid, limit)
	}
	base := s.root + "ns/"
	from := base + names.Escape(prefix)
	if after != "" {
		from = s.metaKey(after) + "\x00"
	}
	end := clientv3.GetPrefixRangeEnd(base + names.Escape(prefix))
	var out []string
	for len(out) < limit {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)*8))
		if err != nil {
			return nil, fmt.Errorf("config: namespaces: %w", err)
		}
		for _, kv := range resp.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), base)
			esc, sub, ok := strings.Cut(rest, "/")
			if ok && sub == "meta" {
				out = append(out, names.Unescape(esc))
				if len(out) == limit {
					break
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return out, nil
}

// CurrentRevision returns etcd's current revision, read linearizably.
func (s *Store) CurrentRevision(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, s.root, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("config: read revision: %w", err)
	}
	return resp.Header.Revision, nil
}
