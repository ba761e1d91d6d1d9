package clientlib

import (
	"context"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ConfigRelease is one published change of a namespace.
type ConfigRelease struct {
	Namespace  string
	Number     int64
	Revision   int64 // 0 for a dry run
	Author     string
	Message    string
	Time       time.Time
	RollbackOf int64
	Changes    []KeyChange
}

func releaseFrom(r *coorddv1.ConfigRelease) ConfigRelease {
	out := ConfigRelease{Namespace: r.GetNamespace(), Number: r.GetNumber(), Revision: r.GetRevision(), Author: r.GetAuthor(), Message: r.GetMessage(), RollbackOf: r.GetRollbackOf(), Changes: changesFrom(r.GetChanges())}
	if r.GetTime() != nil {
		out.Time = r.GetTime().AsTime()
	}
	return out
}

func changesFrom(cs []*coorddv1.ConfigChange) []KeyChange {
	out := make([]KeyChange, 0, len(cs))
	for _, c := range cs {
		out = append(out, KeyChange{Key: c.GetKey(), Old: c.OldValue, New: c.NewValue})
	}
	return out
}

// ConfigMutation is one change a release asks for.
type ConfigMutation struct {
	Key    string
	Value  string
	Delete bool
}

// PublishOptions qualify a write. ExpectedRevision, when set, makes it a
// compare-and-set (ErrRevisionMismatch if the namespace changed after it).
type PublishOptions struct {
	ExpectedRevision int64
	Author           string
	Message          string
	DryRun           bool // Publish only: validate and return the changes, write nothing
}

// Publish makes one release of many changes, atomically. A release that
// breaks the namespace's schema fails with ErrValidationFailed, listing
// every problem (see Problems).
func (c *Client) Publish(ctx context.Context, ns string, ms []ConfigMutation, o PublishOptions) (ConfigRelease, error) {
	req := &coorddv1.PublishRequest{Namespace: ns, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message, DryRun: o.DryRun}
	for _, m := range ms {
		req.Mutations = append(req.Mutations, &coorddv1.ConfigMutation{Key: m.Key, Value: m.Value, Delete: m.Delete})
	}
	resp, err := c.config.Publish(ctx, req)
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// PutConfig sets one key (a release of one change).
func (c *Client) PutConfig(ctx context.Context, ns, key, value string, o PublishOptions) (ConfigRelease, error) {
	resp, err := c.config.Put(ctx, &coorddv1.PutRequest{Namespace: ns, Key: key, Value: value, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// DeleteConfig removes one key; ErrKeyNotFound if it is missing.
func (c *Client) DeleteConfig(ctx context.Context, ns, key string, o PublishOptions) (ConfigRelease, error) {
	resp, err := c.config.Delete(ctx, &coorddv1.DeleteRequest{Namespace: ns, Key: key, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// GetConfig reads one key, now (revision 0) or at a past revision. It
// returns the value and the revision that last set it.
func (c *Client) GetConfig(ctx context.Context, ns, key string, revision int64) (string, int64, error) {
	resp, err := c.config.Get(ctx, &coorddv1.GetRequest{Namespace: ns, Key: key, Revision: revision})
	if err != nil {
		return "", 0, convert(ctx, err)
	}
	return resp.GetValue(), resp.GetModRevision(), nil
}

// NamespaceSnapshot is a namespace's content at one revision.
type NamespaceSnapshot struct {
	Namespace string
	Release   int64
	Revision  int64
	Changed   int64 // revision of the last release
	Values    map[string]string
}

// ConfigSnapshotOf reads a whole namespace, now (revision 0) or at a past
// revision.
func (c *Client) ConfigSnapshotOf(ctx context.Context, ns string, revision int64) (NamespaceSnapshot, error) {
	resp, err := c.config.Snapshot(ctx, &coorddv1.SnapshotRequest{Namespace: ns, Revision: revision})
	if err != nil {
		return NamespaceSnapshot{}, convert(ctx, err)
	}
	s := resp.GetSnapshot()
	out := NamespaceSnapshot{Namespace: s.GetNamespace(), Release: s.GetRelease(), Revision: s.GetRevision(), Changed: s.GetChangedRevision(), Values: map[string]string{}}
	for _, e := range s.GetEntries() {
		out.Values[e.GetKey()] = e.GetValue()
	}
	return out, nil
}

// ConfigReleases lists up to n releases of a namespace, newest first,
// older than release before (0: from the newest).
func (c *Client) ConfigReleases(ctx context.Context, ns string, before int64, n int) ([]ConfigRelease, error) {
	resp, err := c.config.ListReleases(ctx, &coorddv1.ListReleasesRequest{Namespace: ns, Before: before, PageSize: int32(n)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	var out []ConfigRelease
	for _, r := range resp.GetReleases() {
		out = append(out, releaseFrom(r))
	}
	return out, nil
}

// ConfigDiff lists the key changes from release from to release to.
func (c *Client) ConfigDiff(ctx context.Context, ns string, from, to int64) ([]KeyChange, error) {
	resp, err := c.config.Diff(ctx, &coorddv1.DiffRequest{Namespace: ns, FromRelease: from, ToRelease: to})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return changesFrom(resp.GetChanges()), nil
}

// RollbackConfig makes a new release with release to's content.
func (c *Client) RollbackConfig(ctx context.Context, ns string, to int64, o PublishOptions) (ConfigRelease, error) {
	resp, err := c.config.Rollback(ctx, &coorddv1.RollbackRequest{Namespace: ns, ToRelease: to, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// ConfigSchema returns a namespace's JSON Schema ("" if none).
func (c *Client) ConfigSchema(ctx context.Context, ns string) (string, error) {
	resp, err := c.config.GetSchema(ctx, &coorddv1.GetSchemaRequest{Namespace: ns})
	if err != nil {
		return "", convert(ctx, err)
	}
	return resp.GetSchema(), nil
}

// SetConfigSchema sets (or with "" removes) a namespace's JSON Schema.
func (c *Client) SetConfigSchema(ctx context.Context, ns, schema string) error {
	_, err := c.config.SetSchema(ctx, &coorddv1.SetSchemaRequest{Namespace: ns, Schema: schema})
	return convert(ctx, err)
}

// ConfigNamespaces lists namespace names starting with prefix.
func (c *Client) ConfigNamespaces(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := c.config.ListNamespaces(ctx, &coorddv1.ListNamespacesRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNamespaces(), resp.GetNextPageToken(), err
	})
}

// InstanceApplyStatus is one instance's latest report for a namespace.
type InstanceApplyStatus struct {
	Instance string            `json:"instance,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Applied  int64             `json:"applied,omitempty"`
	Rejected int64             `json:"rejected,omitempty"`
	Reason   string            `json:"reason,omitempty"`
	Reported time.Time         `json:"reported,omitzero"`
}

// ApplyStatus is what the live instances of a namespace run.
type ApplyStatus struct {
	Instances []InstanceApplyStatus `json:"instances,omitempty"`
	Applied   map[int64]int         `json:"applied,omitempty"`  // release -> instances running it
	Rejected  map[int64]int         `json:"rejected,omitempty"` // release -> instances that refused it
}

// ConfigApplyStatus aggregates the instances' reports for a namespace.
func (c *Client) ConfigApplyStatus(ctx context.Context, ns string) (ApplyStatus, error) {
	resp, err := c.config.GetApplyStatus(ctx, &coorddv1.GetApplyStatusRequest{Namespace: ns})
	if err != nil {
		return ApplyStatus{}, convert(ctx, err)
	}
	out := ApplyStatus{Applied: map[int64]int{}, Rejected: map[int64]int{}}
	for _, in := range resp.GetInstances() {
		out.Instances = append(out.Instances, InstanceApplyStatus{Instance: in.GetInstance(), Labels: in.GetLabels(), Applied: in.GetAppliedRelease(), Rejected: in.GetRejectedRelease(), Reason: in.GetReason(), Reported: in.GetReportTime().AsTime()})
	}
	for _, rc := range resp.GetApplied() {
		out.Applied[rc.GetRelease()] = int(rc.GetInstances())
	}
	for _, rc := range resp.GetRejected() {
		out.Rejected[rc.GetRelease()] = int(rc.GetInstances())
	}
	return out, nil
}
