package clientlib

import (
	"maps"
	"slices"
	"sync"
)

// ConfigSnapshot is an immutable, consistent view of a subscription's
// namespaces: every namespace as of one revision, each at a complete
// release. Reading it never blocks.
type ConfigSnapshot struct {
	revision int64
	cluster  string
	spaces   map[string]*nsView // never modified once published
}

type nsView struct {
	release int64
	gray    int64 // the gray release whose overrides values include (0: none)
	changed int64 // the revision of the release (0 when not known)
	values  map[string]string
	// from is the release whose values this view's were made from by
	// applying this release's changes (0: made from a whole snapshot), and
	// keys the keys those changes touched: the callbacks of a subscriber
	// that saw release from diff those keys only, not the whole namespace.
	from int64
	keys []string
	// changes are the changes from release from (see keyChanges), made
	// once for every subscription of the client that sees the release.
	changes []KeyChange
}

// Revision is the etcd revision the snapshot is consistent at.
func (s *ConfigSnapshot) Revision() int64 { return s.revision }

// Release is the namespace's release in the snapshot (0: never written).
func (s *ConfigSnapshot) Release(ns string) int64 {
	if v := s.spaces[ns]; v != nil {
		return v.release
	}
	return 0
}

// Gray is the gray (canary) release of the namespace this instance runs in
// the snapshot, on top of Release: its selector matched the instance named
// with WithInstance. 0: none, the normal content.
func (s *ConfigSnapshot) Gray(ns string) int64 {
	if v := s.spaces[ns]; v != nil {
		return v.gray
	}
	return 0
}

// Get returns a key's value.
func (s *ConfigSnapshot) Get(ns, key string) (string, bool) {
	v := s.spaces[ns]
	if v == nil {
		return "", false
	}
	val, ok := v.values[key]
	return val, ok
}

// Keys returns a namespace's keys, sorted.
func (s *ConfigSnapshot) Keys(ns string) []string {
	v := s.spaces[ns]
	if v == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(v.values))
}

// Values returns a copy of a namespace's keys and values.
func (s *ConfigSnapshot) Values(ns string) map[string]string {
	if v := s.spaces[ns]; v != nil {
		return maps.Clone(v.values)
	}
	return map[string]string{}
}

// viewCache lets the subscriptions of one client share namespace views: a
// view is immutable, and a release committed at a given revision of a
// cluster, with a given gray release or none, has one content (a restored backup reuses release numbers, but
// not revisions if restored with --bump-revision, as the docs require).
// It keeps the newest view per namespace.
type viewCache struct {
	mu     sync.Mutex
	latest map[string]*nsView         // cluster + "\x00" + namespace -> newest view
	snaps  map[string]*ConfigSnapshot // namespace list -> newest snapshot
}

// share returns a snapshot equal to snap (same cluster, revision and
// views) that another subscription of the same namespaces already holds,
// or records snap as that one. Subscriptions in the same state then share
// the snapshots they derive from it.
func (vc *viewCache) share(nsKey string, snap *ConfigSnapshot) *ConfigSnapshot {
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if cur := vc.snaps[nsKey]; cur != nil && cur.revision == snap.revision && cur.cluster == snap.cluster && sameViews(cur, snap) {
		return cur
	}
	if vc.snaps == nil {
		vc.snaps = map[string]*ConfigSnapshot{}
	}
	vc.snaps[nsKey] = snap
	return snap
}

func sameViews(a, b *ConfigSnapshot) bool {
	if len(a.spaces) != len(b.spaces) {
		return false
	}
	for ns, v := range a.spaces {
		if b.spaces[ns] != v {
			return false
		}
	}
	return true
}

func (vc *viewCache) get(cluster, ns string, release, changed, gray int64) *nsView {
	if cluster == "" || changed == 0 {
		return nil // nothing to compare with
	}
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if v := vc.latest[cluster+"\x00"+ns]; v != nil && v.release == release && v.changed == changed && v.gray == gray {
		return v
	}
	return nil
}

// put records v as the newest view of ns, unless a newer one is known, and
// returns the view to use.
func (vc *viewCache) put(cluster, ns string, v *nsView) *nsView {
	if cluster == "" || v.changed == 0 {
		return v
	}
	vc.mu.Lock()
	defer vc.mu.Unlock()
	key := cluster + "\x00" + ns
	if cur := vc.latest[key]; cur != nil && cur.changed >= v.changed {
		if cur.changed == v.changed && cur.release == v.release && cur.gray == v.gray {
			return cur
		}
		return v
	}
	if vc.latest == nil {
		vc.latest = map[string]*nsView{}
	}
	vc.latest[key] = v
	return v
}
