package clientlib

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// ExportFormat names the layout of a ConfigExport; Import refuses others.
const ExportFormat = "coordd-config-export/1"

// ConfigExport is namespaces as of one etcd revision of one cluster: what
// Export writes and Import reads, as JSON.
type ConfigExport struct {
	Format     string              `json:"format"`
	Exported   time.Time           `json:"exported"`
	Revision   int64               `json:"revision"` // every namespace is as of this revision
	Namespaces []ExportedNamespace `json:"namespaces"`
}

// ExportedNamespace is one namespace's content, its release number (in the
// cluster it came from) and its JSON Schema ("" if none).
type ExportedNamespace struct {
	Name    string            `json:"name"`
	Release int64             `json:"release"`
	Values  map[string]string `json:"values"`
	Schema  string            `json:"schema,omitempty"`
}

// Export reads the named namespaces (nil: every namespace) as of one
// revision: the first read's, which every other read names, so the export
// is one consistent state even while others publish. A schema is read
// as it is now (schemas are not versioned). A namespace with neither a
// release nor a schema is left out.
func (cc *ConfigCenter) Export(ctx context.Context, namespaces []string) (ConfigExport, error) {
	if namespaces == nil {
		all, err := cc.Namespaces(ctx, "")
		if err != nil {
			return ConfigExport{}, err
		}
		namespaces = all
	}
	out := ConfigExport{Format: ExportFormat, Exported: time.Now().UTC(), Namespaces: []ExportedNamespace{}}
	for _, ns := range slices.Compact(slices.Sorted(slices.Values(namespaces))) {
		snap, err := cc.Snapshot(ctx, ns, out.Revision)
		if err != nil {
			return ConfigExport{}, fmt.Errorf("exporting %s: %w", ns, err)
		}
		if out.Revision == 0 {
			out.Revision = snap.Revision
		}
		schema, err := cc.Schema(ctx, ns)
		if err != nil {
			return ConfigExport{}, fmt.Errorf("exporting the schema of %s: %w", ns, err)
		}
		if snap.Release == 0 && schema == "" {
			continue
		}
		out.Namespaces = append(out.Namespaces, ExportedNamespace{Name: ns, Release: snap.Release, Values: snap.Values, Schema: schema})
	}
	return out, nil
}

// ImportOptions qualify an Import.
type ImportOptions struct {
	// DryRun computes and returns what would change, writing nothing
	// (each namespace's new content is still validated against its
	// schema, when the schema does not change).
	DryRun bool
	// Merge keeps the keys a namespace has that the export lacks; by
	// default the namespace becomes exactly the exported content.
	Merge bool
	// Author and Message are recorded with every release.
	Author, Message string
}

// ImportResult is what Import did (or, in a dry run, would do) to one
// namespace.
type ImportResult struct {
	Namespace string
	// Changes are the keys the release changes, sorted; none: the
	// namespace's content already was the export's.
	Changes []KeyChange
	// SchemaChanged is true when the namespace's schema becomes the
	// export's.
	SchemaChanged bool
	// Release is the release made (Number 0: none, in a dry run or with no
	// change).
	Release ConfigRelease
}

// Import makes each namespace of the export what the export says: one
// release per namespace with every change at once (compare-and-set
// against what it read, so a concurrent publish makes it fail rather than
// be overwritten), and the export's schema. Namespaces are imported one
// after another, in the export's order; it is not atomic across them: on
// an error it returns the results of the namespaces imported before it.
func (cc *ConfigCenter) Import(ctx context.Context, exp ConfigExport, o ImportOptions) ([]ImportResult, error) {
	if exp.Format != ExportFormat {
		return nil, fmt.Errorf("%w: not a coordd config export (format %q, want %q)", ErrInvalidArgument, exp.Format, ExportFormat)
	}
	var results []ImportResult
	for _, ns := range exp.Namespaces {
		r, err := cc.importOne(ctx, ns, o)
		if err != nil {
			return results, fmt.Errorf("importing %s: %w", ns.Name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

func (cc *ConfigCenter) importOne(ctx context.Context, ns ExportedNamespace, o ImportOptions) (ImportResult, error) {
	cur, err := cc.Snapshot(ctx, ns.Name, 0)
	if err != nil {
		return ImportResult{}, err
	}
	schema, err := cc.Schema(ctx, ns.Name)
	if err != nil {
		return ImportResult{}, err
	}
	res := ImportResult{Namespace: ns.Name, SchemaChanged: schema != ns.Schema}
	var ms []ConfigMutation
	for _, k := range slices.Sorted(maps.Keys(ns.Values)) {
		v := ns.Values[k]
		old, ok := cur.Values[k]
		if ok && old == v {
			continue
		}
		ch := KeyChange{Key: k, New: &v}
		if ok {
			ch.Old = &old
		}
		res.Changes = append(res.Changes, ch)
		ms = append(ms, ConfigMutation{Key: k, Value: v})
	}
	if !o.Merge {
		for _, k := range slices.Sorted(maps.Keys(cur.Values)) {
			if _, ok := ns.Values[k]; !ok {
				old := cur.Values[k]
				res.Changes = append(res.Changes, KeyChange{Key: k, Old: &old})
				ms = append(ms, ConfigMutation{Key: k, Delete: true})
			}
		}
		slices.SortFunc(res.Changes, func(a, b KeyChange) int { return strings.Compare(a.Key, b.Key) })
	}
	po := PublishOptions{ExpectedRevision: cur.Revision, Author: o.Author, Message: o.Message}
	if o.DryRun {
		if len(ms) > 0 && !res.SchemaChanged {
			po.DryRun = true
			if _, err := cc.Publish(ctx, ns.Name, ms, po); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	publish := func() error {
		if len(ms) == 0 {
			return nil
		}
		r, err := cc.Publish(ctx, ns.Name, ms, po)
		res.Release = r
		return err
	}
	if !res.SchemaChanged {
		return res, publish()
	}
	// The schema changes too. Set it first when the current content
	// matches it, so the release is checked against the new schema; else
	// publish first (checked against the old one) and set it after.
	err = cc.SetSchema(ctx, ns.Name, ns.Schema)
	switch {
	case err == nil:
		return res, publish()
	case !errors.Is(err, ErrValidationFailed):
		return res, err
	}
	if err := publish(); err != nil {
		if errors.Is(err, ErrValidationFailed) {
			return res, fmt.Errorf("%w (the namespace's current content breaks the export's schema, and the export's content its current schema: remove the schema first, coordctl config schema %s --remove)", err, ns.Name)
		}
		return res, err
	}
	return res, cc.SetSchema(ctx, ns.Name, ns.Schema)
}
