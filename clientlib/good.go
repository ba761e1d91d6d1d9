package clientlib

// goodViews is, per namespace, the last view delivered to the callbacks
// without one of them rejecting it. Most deliveries are accepted whole, so
// it is kept as the last snapshot delivered (base) and the namespaces
// whose view differs from base's (pins: a rejected release, or the cache
// file's last accepted view): an accepted delivery costs a pointer, not a
// map write per namespace. A dispatcher delivers to every subscription of
// a client for each release, so this is on the path of each.
//
// Invariant: a namespace not in pins has base's view as its good view.
// The zero value has none. Not safe for concurrent use (Subscription.mu).
type goodViews struct {
	base *ConfigSnapshot
	pins map[string]*nsView // a nil view: none known
}

// of returns ns's good view, or nil.
func (g *goodViews) of(ns string) *nsView {
	if v, ok := g.pins[ns]; ok {
		return v
	}
	if g.base == nil {
		return nil
	}
	return g.base.spaces[ns]
}

// start sets the snapshot the dispatcher starts from: the good view of
// every namespace not pinned (by the cache file) is its view there.
func (g *goodViews) start(s *ConfigSnapshot) {
	g.base = s
	for ns, v := range g.pins {
		if v == nil || v == s.spaces[ns] {
			delete(g.pins, ns) // none known, or s's anyway
		}
	}
}

// delivered records that cur replaced old, the snapshot delivered before
// it, and that callbacks rejected the namespaces in rejected: a
// namespace whose view changed is good in cur unless rejected; a rejected
// one keeps the good view it had.
func (g *goodViews) delivered(old, cur *ConfigSnapshot, rejected map[string]error) {
	if len(rejected) == 0 && len(g.pins) == 0 {
		g.base = cur
		return
	}
	for ns, v := range cur.spaces {
		if v == old.spaces[ns] {
			continue // unchanged: its good view stays (base's, or its pin)
		}
		if _, bad := rejected[ns]; !bad {
			delete(g.pins, ns)
			continue
		}
		if _, pinned := g.pins[ns]; !pinned {
			if g.pins == nil {
				g.pins = map[string]*nsView{}
			}
			g.pins[ns] = g.of(ns)
		}
	}
	g.base = cur
}

// all returns the good view of each of namespaces that has one.
func (g *goodViews) all(namespaces []string) map[string]*nsView {
	out := make(map[string]*nsView, len(namespaces))
	for _, ns := range namespaces {
		if v := g.of(ns); v != nil {
			out[ns] = v
		}
	}
	return out
}
