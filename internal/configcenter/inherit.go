package configcenter

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Shared namespaces (Apollo's public namespaces). A namespace may inherit
// from a shared one: its content is the shared namespace's keys, each
// overridden by the namespace's own key of that name. The content is kept
// merged in the namespace's own keys, so readers, watchers, history and
// every client see it as any content, release by release:
//
//   - A release of the shared namespace reaches each heir as one release
//     of the heir, numbered in the heir's sequence, that records the shared
//     release it carries (InheritedFrom, InheritedRelease) and changes only
//     the keys the heir does not override. The member that made the shared
//     release makes the heirs' at once; every member's cache notices an
//     heir that is behind and catches it up (Cache.BehindHeirs), so a
//     member stopping in between delays an heir's release, never loses it.
//   - An heir's own release (publish, put, delete) changes its overrides
//     (a put of the value it inherits makes the key its own); deleting an
//     override brings the shared value back; an inherited key cannot be
//     deleted in the heir, nor the heir rolled back. Each heir release
//     also catches up with the shared namespace.
//   - A shared release is refused if it would make an heir's content break
//     the heir's schema, or change more keys than one release may.
//   - With SetInheritCheck, the principal who made the heir inherit must
//     keep the right to read the shared namespace: every heir release that
//     would carry shared content checks it, and without it the heir keeps
//     what it carries and records why (Inheritance.Suspended).
//
// Non-guarantees: inheritance is one level (a shared namespace inherits
// from nobody; an heir is nobody's shared namespace); at most MaxHeirs
// heirs per shared namespace; a shared namespace holds no secrets (a
// sealed value is bound to its own namespace); the shared namespace's gray
// releases do not reach heirs; an heir's schema set while a shared
// release is on its way may be broken by it until the heir's next release.
//
// An heir that requires approval takes no shared release by itself: it
// keeps what it carries and says why (Inheritance.Suspended) until a
// release approved there carries the shared namespace's current content
// (a proposal's changes show what it would bring).

// MaxHeirs bounds the namespaces that inherit from one shared namespace.
const MaxHeirs = 32

// Inheritance is an heir's link to its shared namespace.
type Inheritance struct {
	From string `json:"from"`
	// Keys are the keys whose values come from From (the heir does not
	// override them).
	Keys []string `json:"keys"`
	// Release is From's release the heir's content carries.
	Release int64 `json:"release"`
	// By is the principal who made the namespace inherit, and ByGroups
	// the groups its credential named then: its right to read From is
	// checked again at every release the heir would carry (see
	// Store.SetInheritCheck). "": set by an older coordd.
	By       string   `json:"by,omitempty"`
	ByGroups []string `json:"by_groups,omitempty"`
	// Suspended says why the heir takes no more of From's releases ("":
	// it takes them): By lost the right to read From. It keeps what it
	// carried until then.
	Suspended string `json:"suspended,omitempty"`
}

// Setter is the principal who makes a namespace inherit: its name and the
// groups its credential names.
type Setter struct {
	Name   string
	Groups []string
}

// SetInheritCheck makes every release of an heir that would carry its
// shared namespace's content ask may(setter, shared) first, setter being
// the principal who made it inherit, with the groups it had then (a group
// taken away from its credential later is not seen; a rule of the policy
// taken away is): when may says no, the heir keeps the
// shared content it carries, takes no newer shared release, and records
// why (Inheritance.Suspended, NamespaceSnapshot.InheritanceSuspended); it
// takes them again, caught up, at its first release after may says yes.
// So a right taken away from the setter (a policy reloaded) stops the
// flow of the shared namespace's later content into the heir, whose
// readers need no right on the shared namespace. Call it before use; nil
// (the default): no check.
func (s *Store) SetInheritCheck(may func(setter Setter, shared string) bool) { s.mayInherit = may }

func (s *Store) inheritKey(ns string) string { return s.nsPrefix(ns) + "inherit" }
func (s *Store) heirsKey(ns string) string   { return s.nsPrefix(ns) + "heirs" }

// merge is shared's content under own's.
func merge(shared, own map[string]string) (map[string]string, []string) {
	out := maps.Clone(own)
	var inherited []string
	for k, v := range shared {
		if _, ok := own[k]; !ok {
			out[k] = v
			inherited = append(inherited, k)
		}
	}
	slices.Sort(inherited)
	return out, inherited
}

// own is an heir's content without what it inherits.
func ownOf(cur nsState) map[string]string {
	own := maps.Clone(cur.Content)
	if cur.inherit != nil {
		for _, k := range cur.inherit.Keys {
			delete(own, k)
		}
	}
	return own
}

// Inherit makes ns an heir of shared (shared "": ns stops inheriting and
// keeps only its own keys), as one release of ns that brings in (or
// takes out) the shared keys it does not override. It fails with ErrInvalid
// for a chain (shared inherits, or ns is shared), a shared namespace with
// secrets or MaxHeirs heirs, or ns itself; with ErrApprovalRequired if ns
// requires approval (inheriting changes its content).
func (s *Store) Inherit(ctx context.Context, ns, shared string, by Setter, author, message string) (Release, error) {
	for _, n := range []string{ns, shared} {
		if n == "" && n == shared {
			continue
		}
		if err := ValidateNamespace(n); err != nil {
			return Release{}, err
		}
	}
	if err := validateLine("author", author, MaxAuthorBytes); err != nil {
		return Release{}, err
	}
	if err := validateText("message", message, MaxMessageBytes); err != nil {
		return Release{}, err
	}
	if ns == shared {
		return Release{}, fmt.Errorf("%w: %q cannot inherit from itself", ErrInvalid, ns)
	}
	for {
		cur, err := s.readNamespace(ctx, ns, 0)
		if err != nil {
			return Release{}, err
		}
		rel, ops, cmps, err := s.planInherit(ctx, cur, shared, by, author, message)
		if err != nil {
			return Release{}, err
		}
		resp, err := s.cli.Txn(ctx).If(append(s.unchanged(ns, cur), cmps...)...).Then(ops...).Commit()
		if err != nil {
			return Release{}, fmt.Errorf("config: inherit %q: %w", ns, err)
		}
		if resp.Succeeded {
			rel.Revision = resp.Header.Revision
			return rel, nil
		}
	}
}

func (s *Store) planInherit(ctx context.Context, cur nsState, shared string, by Setter, author, message string) (Release, []clientv3.Op, []clientv3.Cmp, error) {
	ns := cur.Namespace
	if cur.approval.Required {
		// Inheriting changes the content now, and lets the shared
		// namespace's writers change it later: not without four eyes.
		return Release{}, nil, nil, fmt.Errorf("%w: %q requires approval; inheriting (or stopping) changes its content: turn approval off first (config.admin), and on again after", ErrApprovalRequired, ns)
	}
	if len(cur.heirs) > 0 {
		return Release{}, nil, nil, fmt.Errorf("%w: %q is shared by %v: a shared namespace inherits from nobody", ErrInvalid, ns, cur.heirs)
	}
	own := ownOf(cur)
	next, inh := own, (*Inheritance)(nil)
	var ops []clientv3.Op
	var cmps []clientv3.Cmp
	if shared != "" {
		sh, err := s.readNamespace(ctx, shared, 0)
		if err != nil {
			return Release{}, nil, nil, err
		}
		switch {
		case sh.inherit != nil:
			return Release{}, nil, nil, fmt.Errorf("%w: %q inherits from %q itself: inheritance is one level", ErrInvalid, shared, sh.inherit.From)
		case len(sh.heirs) >= MaxHeirs && !slices.Contains(sh.heirs, ns):
			return Release{}, nil, nil, fmt.Errorf("%w: %q already has %d heirs, at most %d are allowed", ErrInvalid, shared, len(sh.heirs), MaxHeirs)
		case hasSecrets(sh.Content):
			return Release{}, nil, nil, fmt.Errorf("%w: %q holds secrets, which are bound to it: a shared namespace holds none", ErrInvalid, shared)
		}
		var keys []string
		next, keys = merge(sh.Content, own)
		inh = &Inheritance{From: shared, Keys: keys, Release: sh.Release, By: by.Name, ByGroups: by.Groups}
		b, err := json.Marshal(inh)
		if err != nil {
			return Release{}, nil, nil, err
		}
		ops = append(ops, clientv3.OpPut(s.inheritKey(ns), string(b)))
		heirOps, heirCmps, err := s.setHeir(shared, sh, ns, true)
		if err != nil {
			return Release{}, nil, nil, err
		}
		ops, cmps = append(ops, heirOps...), append(cmps, heirCmps...)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.metaKey(shared)), "=", sh.metaRev),
			// shared must still inherit from nobody (one level)
			clientv3.Compare(clientv3.ModRevision(s.inheritKey(shared)), "=", sh.inheritRev))
	} else {
		if cur.inherit == nil {
			return Release{}, nil, nil, fmt.Errorf("%w: %q inherits from nothing", ErrInvalid, ns)
		}
		ops = append(ops, clientv3.OpDelete(s.inheritKey(ns)))
	}
	if old := cur.inherit; old != nil && old.From != shared {
		sh, err := s.readNamespace(ctx, old.From, 0)
		if err != nil {
			return Release{}, nil, nil, err
		}
		heirOps, heirCmps, err := s.setHeir(old.From, sh, ns, false)
		if err != nil {
			return Release{}, nil, nil, err
		}
		ops, cmps = append(ops, heirOps...), append(cmps, heirCmps...)
	}
	rel := Release{Namespace: ns, Number: cur.Release + 1, Author: author, Message: message, Time: s.now().UTC(), Changes: diff(cur.Content, next)}
	if inh != nil {
		rel.InheritedFrom, rel.InheritedRelease = inh.From, inh.Release
	}
	if len(rel.Changes) > s.limits.MaxKeysPerRelease {
		return Release{}, nil, nil, fmt.Errorf("%w: it changes %d keys, at most %d may change in one release", ErrTooLarge, len(rel.Changes), s.limits.MaxKeysPerRelease)
	}
	if err := s.checkSchema(ctx, commitRequest{ns: ns}, cur, next, nil); err != nil {
		return Release{}, nil, nil, err
	}
	if len(rel.Changes) == 0 {
		rel = Release{Namespace: ns, Number: cur.Release, Revision: cur.metaRev, Author: author, Message: message, Time: rel.Time, InheritedFrom: rel.InheritedFrom, InheritedRelease: rel.InheritedRelease}
		return rel, ops, cmps, nil
	}
	relOps, size, err := s.releaseOps(ns, rel, cur.trimmed)
	if err != nil {
		return Release{}, nil, nil, err
	}
	if size > s.limits.MaxReleaseBytes {
		return Release{}, nil, nil, fmt.Errorf("%w: the release writes %d bytes, at most %d are allowed", ErrTooLarge, size, s.limits.MaxReleaseBytes)
	}
	return rel, append(ops, relOps...), cmps, nil
}

// errHeirRollback refuses a rollback of an heir: its past content mixes
// what it inherited then with its own keys, which a rollback cannot tell
// apart.
func errHeirRollback(cur nsState) error {
	return fmt.Errorf("%w: %q inherits from %q, and a rollback cannot tell its own past values from those it inherited: publish the own values to restore, or stop inheriting first", ErrInvalid, cur.Namespace, cur.inherit.From)
}

// setHeir adds (or removes) heir in shared's list of heirs, guarded by
// the list's revision.
func (s *Store) setHeir(shared string, sh nsState, heir string, add bool) ([]clientv3.Op, []clientv3.Cmp, error) {
	heirs := slices.DeleteFunc(slices.Clone(sh.heirs), func(h string) bool { return h == heir })
	if add {
		heirs = append(heirs, heir)
		slices.Sort(heirs)
	}
	cmp := clientv3.Compare(clientv3.ModRevision(s.heirsKey(shared)), "=", sh.heirsRev)
	if len(heirs) == 0 {
		return []clientv3.Op{clientv3.OpDelete(s.heirsKey(shared))}, []clientv3.Cmp{cmp}, nil
	}
	b, err := json.Marshal(heirs)
	if err != nil {
		return nil, nil, err
	}
	return []clientv3.Op{clientv3.OpPut(s.heirsKey(shared), string(b))}, []clientv3.Cmp{cmp}, nil
}

// inheritedPlan is what an heir's release does beyond its own mutations.
type inheritedPlan struct {
	changes []Change
	next    map[string]string
	ops     []clientv3.Op
	cmps    []clientv3.Cmp
	carried int64 // the shared release it carries (0: none new)
	// keysChanged: the keys it inherits change (an inherited key is now
	// overridden, even by its inherited value, or the reverse).
	keysChanged bool
}

// planHeir plans a release of an heir (cur.inherit set) whose own
// mutations ms (secret values sealed) are applied: ms change its
// overrides, and the content is the shared namespace's now under them, or,
// while the inheritance is suspended (see SetInheritCheck), the shared
// content the heir already carries.
//
// gated, for a release that only carries shared content (no own
// mutations, no approval) into an heir that requires approval, holds the
// shared content back the same way: it reaches the heir only by a release
// there that another principal approved (its proposal's changes show it).
func (s *Store) planHeir(ctx context.Context, cur nsState, ms []Mutation, gated bool) (inheritedPlan, error) {
	inh := cur.inherit
	for _, m := range ms {
		if m.Delete && slices.Contains(inh.Keys, m.Key) {
			return inheritedPlan{}, fmt.Errorf("%w: key %q is inherited from %q: override it with a put, or change it in %q", ErrInvalid, m.Key, inh.From, inh.From)
		}
	}
	sh, err := s.readNamespace(ctx, inh.From, 0)
	if err != nil {
		return inheritedPlan{}, err
	}
	shared, carries, suspended := sh.Content, sh.Release, ""
	hold := ""
	switch {
	case s.mayInherit != nil && !s.mayInherit(Setter{Name: inh.By, Groups: inh.ByGroups}, inh.From):
		hold = suspendedWhy(inh)
	case gated && sh.Release > inh.Release:
		hold = fmt.Sprintf("%q changes only by approved proposals: release %d of %q reaches it with the next release approved here (propose one, even empty: its changes show what it brings)", cur.Namespace, sh.Release, inh.From)
	}
	if hold != "" {
		shared, carries = map[string]string{}, inh.Release
		for _, k := range inh.Keys {
			shared[k] = cur.Content[k]
		}
		suspended = hold
	}
	own := ownOf(cur)
	for _, m := range ms {
		if m.Delete {
			delete(own, m.Key)
		} else {
			own[m.Key] = m.Value
		}
	}
	next, keys := merge(shared, own)
	p := inheritedPlan{changes: diff(cur.Content, next), next: next,
		keysChanged: !slices.Equal(keys, inh.Keys) || suspended != inh.Suspended}
	if carries > inh.Release {
		p.carried = carries
	}
	b, err := json.Marshal(Inheritance{From: inh.From, Keys: keys, Release: carries, By: inh.By, ByGroups: inh.ByGroups, Suspended: suspended})
	if err != nil {
		return inheritedPlan{}, err
	}
	p.ops = []clientv3.Op{clientv3.OpPut(s.inheritKey(cur.Namespace), string(b))}
	p.cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.metaKey(inh.From)), "=", sh.metaRev)}
	return p, nil
}

// suspendedWhy is an heir's suspended inheritance, as its status says it.
func suspendedWhy(inh *Inheritance) string {
	by := inh.By
	if by == "" {
		by = "the principal who set it (not recorded: set by an older coordd)"
	}
	return fmt.Sprintf("%s may no longer read %q (config.read): this namespace takes none of its releases until that right is given back, or the inheritance is set again by a principal who has it", by, inh.From)
}

// checkHeirs checks that a shared namespace's next content next holds no
// secrets, and that each heir can carry it: in one release of at most
// MaxKeysPerRelease keys (so a carry never grows past what one release
// may do, and an heir cannot get stuck behind), within its schema.
func (s *Store) checkHeirs(ctx context.Context, cur nsState, next map[string]string) error {
	if len(cur.heirs) == 0 {
		return nil
	}
	if hasSecrets(next) {
		return fmt.Errorf("%w: %q is shared by %v, and a shared namespace holds no secrets (a secret is bound to its namespace)", ErrInvalid, cur.Namespace, cur.heirs)
	}
	for _, h := range cur.heirs {
		heir, err := s.readNamespace(ctx, h, 0)
		if err != nil {
			return err
		}
		if heir.inherit == nil {
			continue
		}
		merged, _ := merge(next, ownOf(heir))
		if n := len(diff(heir.Content, merged)); n > s.limits.MaxKeysPerRelease {
			return fmt.Errorf("%w: %q, which inherits from %q, would change %d keys in one release, at most %d may: split the release", ErrTooLarge, h, cur.Namespace, n, s.limits.MaxKeysPerRelease)
		}
		if heir.schema == "" {
			continue
		}
		if err := s.checkSchema(ctx, commitRequest{ns: h}, heir, merged, nil); err != nil {
			return fmt.Errorf("the release would break the schema of %q, which inherits from %q: %w", h, cur.Namespace, err)
		}
	}
	return nil
}

// CatchUp makes heir carry its shared namespace's current content, as one
// release, if it does not yet. It is idempotent: heirs that are current
// change nothing.
func (s *Store) CatchUp(ctx context.Context, heir string) (Release, error) {
	return s.commit(ctx, commitRequest{ns: heir, inherited: true,
		plan: func(context.Context, nsState) ([]Mutation, error) { return nil, nil }})
}

// catchUpHeirs makes the heirs of shared carry its release, best effort:
// the caches catch up any it misses.
func (s *Store) catchUpHeirs(ctx context.Context, heirs []string) {
	if s.noCatchUp {
		return
	}
	for _, h := range heirs {
		_, _ = s.CatchUp(ctx, h)
	}
}

func inheritedSet(keys []string) map[string]bool {
	out := make(map[string]bool, len(keys))
	for _, k := range keys {
		out[k] = true
	}
	return out
}
