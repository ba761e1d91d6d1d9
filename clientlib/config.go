package clientlib

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ConfigCenter reads, writes and follows the config center: namespaces of
// keys, published as numbered releases. It is obtained from Client.ConfigCenter,
// shares the Client's connection, and is safe for concurrent use.
//
// Writes (Put, Delete, Publish, Rollback) each make one release, atomically;
// with PublishOptions.ExpectedRevision they are compare-and-set. They are
// not retried: after ErrUnavailable a write may or may not have happened
// (Releases tells).
type ConfigCenter struct {
	c      *Client
	reveal bool // reads ask for secret values in clear
}

// ConfigCenter returns the config center's calls.
func (c *Client) ConfigCenter() *ConfigCenter { return &ConfigCenter{c: c} }

// RevealSecrets returns the config center's calls with reads (Get,
// Snapshot, Poll, Watch, Subscribe, Export) that ask for secret values in
// clear; the server lets them only if the caller is allowed
// config.read-secret on each namespace (else PermissionDenied). The member
// opens the values, over the connection's TLS: the SDK holds no key.
// Without it, reads leave secret values out (see NamespaceSnapshot.Hidden)
// and Get of a secret fails with ErrSecretHidden.
func (cc *ConfigCenter) RevealSecrets() *ConfigCenter { return &ConfigCenter{c: cc.c, reveal: true} }

// ConfigRelease is one published change of a namespace.
type ConfigRelease struct {
	Namespace  string
	Number     int64
	Revision   int64 // 0 for a dry run
	Author     string
	Message    string
	Time       time.Time
	RollbackOf int64
	// PromotedGray is the gray release this one promoted, if any.
	PromotedGray int64
	Changes      []KeyChange
	// Proposal is the approved proposal this release carried out (0:
	// none); ProposedBy and ApprovedBy name who proposed and approved it.
	Proposal               int64
	ProposedBy, ApprovedBy string
	// InheritedFrom is the shared namespace whose release InheritedRelease
	// this release carried to its heir (or, for an Inherit, started with).
	InheritedFrom    string
	InheritedRelease int64
}

func releaseFrom(r *coorddv1.ConfigRelease) ConfigRelease {
	out := ConfigRelease{Namespace: r.GetNamespace(), Number: r.GetNumber(), Revision: r.GetRevision(), Author: r.GetAuthor(), Message: r.GetMessage(), RollbackOf: r.GetRollbackOf(), PromotedGray: r.GetPromotedGray(), Changes: changesFrom(r.GetChanges()),
		Proposal: r.GetProposal(), ProposedBy: r.GetProposedBy(), ApprovedBy: r.GetApprovedBy(),
		InheritedFrom: r.GetInheritedFrom(), InheritedRelease: r.GetInheritedRelease()}
	if r.GetTime() != nil {
		out.Time = r.GetTime().AsTime()
	}
	return out
}

func changesFrom(cs []*coorddv1.ConfigChange) []KeyChange {
	out := make([]KeyChange, 0, len(cs))
	for _, c := range cs {
		out = append(out, KeyChange{Key: c.GetKey(), Old: c.OldValue, New: c.NewValue, Secret: c.GetSecret()})
	}
	return out
}

// ConfigMutation is one change a release asks for.
type ConfigMutation struct {
	Key    string
	Value  string
	Delete bool
	// Secret stores the value encrypted at rest and hides it from every
	// reader not allowed config.read-secret (the daemon needs
	// --secret-key-file). A secret key stays secret until it is deleted.
	Secret bool
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
func (cc *ConfigCenter) Publish(ctx context.Context, ns string, ms []ConfigMutation, o PublishOptions) (ConfigRelease, error) {
	req := &coorddv1.PublishRequest{Namespace: ns, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message, DryRun: o.DryRun}
	for _, m := range ms {
		req.Mutations = append(req.Mutations, &coorddv1.ConfigMutation{Key: m.Key, Value: m.Value, Delete: m.Delete, Secret: m.Secret})
	}
	resp, err := cc.c.config.Publish(ctx, req)
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// Put sets one key (a release of one change).
func (cc *ConfigCenter) Put(ctx context.Context, ns, key, value string, o PublishOptions) (ConfigRelease, error) {
	resp, err := cc.c.config.Put(ctx, &coorddv1.PutRequest{Namespace: ns, Key: key, Value: value, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// Delete removes one key; ErrKeyNotFound if it is missing.
func (cc *ConfigCenter) Delete(ctx context.Context, ns, key string, o PublishOptions) (ConfigRelease, error) {
	resp, err := cc.c.config.Delete(ctx, &coorddv1.DeleteRequest{Namespace: ns, Key: key, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// Get reads one key, now (revision 0) or at a past revision. It
// returns the value and the revision that last set it.
// A secret fails with ErrSecretHidden unless the calls reveal secrets.
func (cc *ConfigCenter) Get(ctx context.Context, ns, key string, revision int64) (string, int64, error) {
	resp, err := cc.c.config.Get(ctx, &coorddv1.GetRequest{Namespace: ns, Key: key, Revision: revision, RevealSecrets: cc.reveal})
	if err != nil {
		return "", 0, convert(ctx, err)
	}
	if resp.GetSecret() && !cc.reveal {
		return "", resp.GetModRevision(), fmt.Errorf("%w: %q in %q", ErrSecretHidden, key, ns)
	}
	return resp.GetValue(), resp.GetModRevision(), nil
}

// NamespaceSnapshot is a namespace's content at one revision.
type NamespaceSnapshot struct {
	Namespace string
	Release   int64
	Revision  int64
	Changed   int64 // revision of the last release
	// Gray (in a watch) is the gray release whose overrides Values include
	// for the watcher; 0: none.
	Gray   int64
	Values map[string]string
	// Secret lists the keys in Values whose values are secrets, revealed.
	Secret []string
	// Hidden lists the secret keys left out of Values: the read did not
	// reveal secrets.
	Hidden []string
	// Inherits is the shared namespace the namespace inherits from ("":
	// none), and Inherited the keys in Values that come from it.
	Inherits  string
	Inherited []string
	// InheritanceSuspended says why the namespace takes no more releases
	// of Inherits ("": it takes them): the principal who made it inherit
	// may no longer read it.
	InheritanceSuspended string
}

// Snapshot reads a whole namespace, now (revision 0) or at a past
// revision.
func (cc *ConfigCenter) Snapshot(ctx context.Context, ns string, revision int64) (NamespaceSnapshot, error) {
	resp, err := cc.c.config.Snapshot(ctx, &coorddv1.SnapshotRequest{Namespace: ns, Revision: revision, RevealSecrets: cc.reveal})
	if err != nil {
		return NamespaceSnapshot{}, convert(ctx, err)
	}
	return snapshotFrom(resp.GetSnapshot(), cc.reveal), nil
}

// Poll waits until the namespace has a release after afterRevision (pass
// the last snapshot's Changed), or wait passes (0: the server's default of
// 30 s; at most 5 m; the server adds up to wait/16 of jitter), and returns
// the namespace's snapshot and whether it changed. It is the long poll for
// callers that cannot hold a stream; Subscribe is the SDK's way to follow
// a namespace. ctx must allow more than wait.
func (cc *ConfigCenter) Poll(ctx context.Context, ns string, afterRevision int64, wait time.Duration) (NamespaceSnapshot, bool, error) {
	req := &coorddv1.PollRequest{Namespace: ns, AfterRevision: afterRevision, RevealSecrets: cc.reveal}
	if wait > 0 {
		req.Wait = durationpb.New(wait)
	}
	resp, err := cc.c.config.Poll(ctx, req)
	if err != nil {
		return NamespaceSnapshot{}, false, convert(ctx, err)
	}
	return snapshotFrom(resp.GetSnapshot(), cc.reveal), resp.GetModified(), nil
}

// snapshotFrom is the SDK's form of a snapshot message.
func snapshotFrom(s *coorddv1.NamespaceSnapshot, reveal bool) NamespaceSnapshot {
	out := NamespaceSnapshot{Namespace: s.GetNamespace(), Release: s.GetRelease(), Revision: s.GetRevision(), Changed: s.GetChangedRevision(), Gray: s.GetGray(), Values: map[string]string{}, Inherits: s.GetInherits(),
		InheritanceSuspended: s.GetInheritanceSuspended()}
	for _, e := range s.GetEntries() {
		if e.GetInherited() {
			out.Inherited = append(out.Inherited, e.GetKey())
		}
		switch {
		case !e.GetSecret():
			out.Values[e.GetKey()] = e.GetValue()
		case reveal:
			out.Values[e.GetKey()] = e.GetValue()
			out.Secret = append(out.Secret, e.GetKey())
		default:
			out.Hidden = append(out.Hidden, e.GetKey())
		}
	}
	return out
}

// PutSecret sets one key to a secret value; see ConfigMutation.Secret.
func (cc *ConfigCenter) PutSecret(ctx context.Context, ns, key, value string, o PublishOptions) (ConfigRelease, error) {
	return cc.Publish(ctx, ns, []ConfigMutation{{Key: key, Value: value, Secret: true}}, o)
}

// Releases lists up to n releases of a namespace, newest first,
// older than release before (0: from the newest).
func (cc *ConfigCenter) Releases(ctx context.Context, ns string, before int64, n int) ([]ConfigRelease, error) {
	resp, err := cc.c.config.ListReleases(ctx, &coorddv1.ListReleasesRequest{Namespace: ns, Before: before, PageSize: int32(n)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	var out []ConfigRelease
	for _, r := range resp.GetReleases() {
		out = append(out, releaseFrom(r))
	}
	return out, nil
}

// Diff lists the key changes from release from to release to.
func (cc *ConfigCenter) Diff(ctx context.Context, ns string, from, to int64) ([]KeyChange, error) {
	resp, err := cc.c.config.Diff(ctx, &coorddv1.DiffRequest{Namespace: ns, FromRelease: from, ToRelease: to})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return changesFrom(resp.GetChanges()), nil
}

// Rollback makes a new release with release to's content.
func (cc *ConfigCenter) Rollback(ctx context.Context, ns string, to int64, o PublishOptions) (ConfigRelease, error) {
	resp, err := cc.c.config.Rollback(ctx, &coorddv1.RollbackRequest{Namespace: ns, ToRelease: to, ExpectedRevision: o.ExpectedRevision, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}

// Schema returns a namespace's JSON Schema ("" if none).
func (cc *ConfigCenter) Schema(ctx context.Context, ns string) (string, error) {
	resp, err := cc.c.config.GetSchema(ctx, &coorddv1.GetSchemaRequest{Namespace: ns})
	if err != nil {
		return "", convert(ctx, err)
	}
	return resp.GetSchema(), nil
}

// SetSchema sets (or with "" removes) a namespace's JSON Schema.
func (cc *ConfigCenter) SetSchema(ctx context.Context, ns, schema string) error {
	_, err := cc.c.config.SetSchema(ctx, &coorddv1.SetSchemaRequest{Namespace: ns, Schema: schema})
	return convert(ctx, err)
}

// Namespaces lists namespace names starting with prefix.
func (cc *ConfigCenter) Namespaces(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := cc.c.config.ListNamespaces(ctx, &coorddv1.ListNamespacesRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNamespaces(), resp.GetNextPageToken(), err
	})
}

// InstanceApplyStatus is one instance's latest report for a namespace.
type InstanceApplyStatus struct {
	Instance string
	Labels   map[string]string
	Applied  int64
	Rejected int64
	// AppliedGray is the gray release it runs on top of Applied;
	// RejectedGray the gray release of Rejected, if it refused a gray's
	// content.
	AppliedGray  int64
	RejectedGray int64
	Reason       string
	Reported     time.Time
}

// ApplyStatus is what the live instances of a namespace run.
type ApplyStatus struct {
	Instances []InstanceApplyStatus
	Applied   map[int64]int // release -> instances running it
	Rejected  map[int64]int // release -> instances that refused it
	// AppliedGray and RejectedGray count the same per gray release.
	AppliedGray  map[int64]int
	RejectedGray map[int64]int
}

// AppliedStatus aggregates the instances' reports for a namespace.
func (cc *ConfigCenter) AppliedStatus(ctx context.Context, ns string) (ApplyStatus, error) {
	resp, err := cc.c.config.GetApplyStatus(ctx, &coorddv1.GetApplyStatusRequest{Namespace: ns})
	if err != nil {
		return ApplyStatus{}, convert(ctx, err)
	}
	out := ApplyStatus{Applied: map[int64]int{}, Rejected: map[int64]int{}, AppliedGray: map[int64]int{}, RejectedGray: map[int64]int{}}
	for _, in := range resp.GetInstances() {
		out.Instances = append(out.Instances, InstanceApplyStatus{Instance: in.GetInstance(), Labels: in.GetLabels(), Applied: in.GetAppliedRelease(), Rejected: in.GetRejectedRelease(),
			AppliedGray: in.GetAppliedGray(), RejectedGray: in.GetRejectedGray(), Reason: in.GetReason(), Reported: in.GetReportTime().AsTime()})
	}
	for _, rc := range resp.GetAppliedGray() {
		out.AppliedGray[rc.GetRelease()] = int(rc.GetInstances())
	}
	for _, rc := range resp.GetRejectedGray() {
		out.RejectedGray[rc.GetRelease()] = int(rc.GetInstances())
	}
	for _, rc := range resp.GetApplied() {
		out.Applied[rc.GetRelease()] = int(rc.GetInstances())
	}
	for _, rc := range resp.GetRejected() {
		out.Rejected[rc.GetRelease()] = int(rc.GetInstances())
	}
	return out, nil
}

// ConfigWatchEvent is one message of a config watch.
type ConfigWatchEvent struct {
	Type      string // "SNAPSHOT", "CHANGE" or "BOOKMARK"
	Revision  int64
	Snapshots []NamespaceSnapshot // SNAPSHOT
	Release   *ConfigRelease      // CHANGE
	// Gray (CHANGE) is the gray release the watcher runs in the release's
	// namespace; the changes then leave out the keys it overrides.
	Gray int64
}

// Watch streams a config watch's messages as they come, from revision
// from (0: a snapshot first), until ctx ends or fn fails. It does not
// reconnect and keeps no state: it shows the server's stream as it is.
// Programs that follow configuration use Subscribe, which resumes, keeps a
// consistent snapshot and calls back on changes.
func (cc *ConfigCenter) Watch(ctx context.Context, namespaces []string, from int64, fn func(ConfigWatchEvent) error) error {
	return cc.WatchAs(ctx, namespaces, from, "", nil, fn)
}

// WatchAs is Watch as the instance named instance with labels would watch:
// where a gray release's selector matches it, it sees the gray content.
func (cc *ConfigCenter) WatchAs(ctx context.Context, namespaces []string, from int64, instance string, labels map[string]string, fn func(ConfigWatchEvent) error) error {
	st, err := cc.c.config.Watch(ctx, &coorddv1.WatchRequest{Namespaces: namespaces, FromRevision: from, Instance: instance, Labels: labels, RevealSecrets: cc.reveal})
	if err != nil {
		return convert(ctx, err)
	}
	for {
		msg, err := st.Recv()
		if err != nil {
			return convert(ctx, err)
		}
		ev := ConfigWatchEvent{Revision: msg.GetRevision()}
		switch msg.GetType() {
		case coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT:
			ev.Type = "SNAPSHOT"
			for _, s := range msg.GetSnapshots() {
				ev.Snapshots = append(ev.Snapshots, snapshotFrom(s, cc.reveal))
			}
		case coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE:
			ev.Type = "CHANGE"
			r := releaseFrom(msg.GetRelease())
			ev.Release, ev.Gray = &r, msg.GetGray()
		default:
			ev.Type = "BOOKMARK"
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// RewrapResult is what RewrapSecretKeys did.
type RewrapResult struct {
	Primary   string         `json:"primary"`   // the key id that now wraps every data key
	Rewrapped int            `json:"rewrapped"` // data keys this call rewrapped
	ByKey     map[string]int `json:"byKey"`     // data keys by the key id that wraps them
}

// RewrapSecretKeys has the member rewrap every namespace's data key with
// the primary key of its --secret-key-file, after a key rotation; no value
// is encrypted again and readers never stop. Needs cluster.admin.
func (cc *ConfigCenter) RewrapSecretKeys(ctx context.Context) (RewrapResult, error) {
	resp, err := cc.c.config.RewrapSecretKeys(ctx, &coorddv1.RewrapSecretKeysRequest{})
	if err != nil {
		return RewrapResult{}, convert(ctx, err)
	}
	out := RewrapResult{Primary: resp.GetPrimary(), Rewrapped: int(resp.GetRewrapped()), ByKey: map[string]int{}}
	for k, n := range resp.GetByKey() {
		out.ByKey[k] = int(n)
	}
	return out, nil
}

// Inherit makes ns inherit from the shared namespace shared: its content
// becomes shared's keys under its own, and each release of shared reaches
// it as one release of ns (ConfigRelease.InheritedFrom says which). With
// shared "", ns stops inheriting and keeps only its own keys. It is one
// release of ns; needs config.admin on ns and config.read on shared.
func (cc *ConfigCenter) Inherit(ctx context.Context, ns, shared string, o PublishOptions) (ConfigRelease, error) {
	resp, err := cc.c.config.SetInheritance(ctx, &coorddv1.SetInheritanceRequest{Namespace: ns, Shared: shared, Author: o.Author, Message: o.Message})
	if err != nil {
		return ConfigRelease{}, convert(ctx, err)
	}
	return releaseFrom(resp.GetRelease()), nil
}
