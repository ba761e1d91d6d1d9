package clientlib

import (
	"context"
	"strings"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// GraySelector chooses the instances a gray (canary) release reaches, as
// they name themselves with WithInstance: an instance matches if its id is
// in Instances, or it carries every label in Labels (when any), or it falls
// within Percent of instances (a stable hash of namespace and id: raising
// the percentage only adds instances).
type GraySelector struct {
	Instances []string
	Labels    map[string]string
	Percent   int
}

// GrayRelease is one change of a namespace's gray release: Action is
// "create", "update", "promote" or "abandon".
type GrayRelease struct {
	Namespace string
	Number    int64 // 1, 2, 3, … per namespace, apart from release numbers
	Action    string
	Selector  GraySelector
	Overrides []ConfigMutation
	// BaseRelease is the normal release in effect when it was made.
	BaseRelease int64
	// Changes are what a matching instance sees change (for an abandon,
	// change back).
	Changes    []KeyChange
	PromotedTo int64 // the normal release a promote made
	Author     string
	Message    string
	Time       time.Time
	Revision   int64 // 0 for a dry run
}

// GrayOptions qualify a gray write. ExpectedGray, when set, names the gray
// the caller means (update, promote, abandon): another one running fails
// with ErrReleaseNotFound.
type GrayOptions struct {
	ExpectedGray int64
	Author       string
	Message      string
	DryRun       bool // create and update only
}

func selectorProto(s *GraySelector) *coorddv1.GraySelector {
	if s == nil {
		return nil
	}
	return &coorddv1.GraySelector{Instances: s.Instances, Labels: s.Labels, Percent: int32(s.Percent)}
}

func mutationsProto(ms []ConfigMutation) []*coorddv1.ConfigMutation {
	out := make([]*coorddv1.ConfigMutation, 0, len(ms))
	for _, m := range ms {
		out = append(out, &coorddv1.ConfigMutation{Key: m.Key, Value: m.Value, Delete: m.Delete})
	}
	return out
}

func grayFrom(g *coorddv1.GrayRelease) GrayRelease {
	out := GrayRelease{
		Namespace: g.GetNamespace(), Number: g.GetNumber(),
		Action:      strings.ToLower(strings.TrimPrefix(g.GetAction().String(), "GRAY_ACTION_")),
		Selector:    GraySelector{Instances: g.GetSelector().GetInstances(), Labels: g.GetSelector().GetLabels(), Percent: int(g.GetSelector().GetPercent())},
		BaseRelease: g.GetBaseRelease(), Changes: changesFrom(g.GetChanges()), PromotedTo: g.GetPromotedTo(),
		Author: g.GetAuthor(), Message: g.GetMessage(), Revision: g.GetRevision(),
	}
	for _, m := range g.GetOverrides() {
		out.Overrides = append(out.Overrides, ConfigMutation{Key: m.GetKey(), Value: m.GetValue(), Delete: m.GetDelete()})
	}
	if g.GetTime() != nil {
		out.Time = g.GetTime().AsTime()
	}
	return out
}

// CreateGray starts a gray release of ns: the overrides reach only the
// subscriptions whose instance the selector matches, through the same
// snapshots and callbacks. One runs per namespace at a time: a second
// fails with ErrRevisionMismatch.
func (cc *ConfigCenter) CreateGray(ctx context.Context, ns string, sel GraySelector, overrides []ConfigMutation, o GrayOptions) (GrayRelease, error) {
	resp, err := cc.c.config.CreateGray(ctx, &coorddv1.CreateGrayRequest{Namespace: ns, Selector: selectorProto(&sel), Overrides: mutationsProto(overrides),
		Author: o.Author, Message: o.Message, DryRun: o.DryRun})
	if err != nil {
		return GrayRelease{}, convert(ctx, err)
	}
	return grayFrom(resp.GetGray()), nil
}

// UpdateGray replaces the running gray's selector (unless sel is nil) and
// overrides (unless there are none).
func (cc *ConfigCenter) UpdateGray(ctx context.Context, ns string, sel *GraySelector, overrides []ConfigMutation, o GrayOptions) (GrayRelease, error) {
	resp, err := cc.c.config.UpdateGray(ctx, &coorddv1.UpdateGrayRequest{Namespace: ns, ExpectedGray: o.ExpectedGray, Selector: selectorProto(sel),
		Overrides: mutationsProto(overrides), Author: o.Author, Message: o.Message, DryRun: o.DryRun})
	if err != nil {
		return GrayRelease{}, convert(ctx, err)
	}
	return grayFrom(resp.GetGray()), nil
}

// PromoteGray makes the running gray's overrides the next normal release
// and ends the gray, atomically. It returns the promote record and the
// release.
func (cc *ConfigCenter) PromoteGray(ctx context.Context, ns string, o GrayOptions) (GrayRelease, ConfigRelease, error) {
	resp, err := cc.c.config.PromoteGray(ctx, &coorddv1.PromoteGrayRequest{Namespace: ns, ExpectedGray: o.ExpectedGray, Author: o.Author, Message: o.Message})
	if err != nil {
		return GrayRelease{}, ConfigRelease{}, convert(ctx, err)
	}
	return grayFrom(resp.GetGray()), releaseFrom(resp.GetRelease()), nil
}

// AbandonGray ends the running gray: its instances return to the normal
// content.
func (cc *ConfigCenter) AbandonGray(ctx context.Context, ns string, o GrayOptions) (GrayRelease, error) {
	resp, err := cc.c.config.AbandonGray(ctx, &coorddv1.AbandonGrayRequest{Namespace: ns, ExpectedGray: o.ExpectedGray, Author: o.Author, Message: o.Message})
	if err != nil {
		return GrayRelease{}, convert(ctx, err)
	}
	return grayFrom(resp.GetGray()), nil
}

// Gray returns the running gray release of ns; ErrReleaseNotFound if none
// runs.
func (cc *ConfigCenter) Gray(ctx context.Context, ns string) (GrayRelease, error) {
	resp, err := cc.c.config.GetGray(ctx, &coorddv1.GetGrayRequest{Namespace: ns})
	if err != nil {
		return GrayRelease{}, convert(ctx, err)
	}
	return grayFrom(resp.GetGray()), nil
}

// GrayReleases lists up to n gray records of ns, newest first, older than
// number before (0: from the newest).
func (cc *ConfigCenter) GrayReleases(ctx context.Context, ns string, before int64, n int) ([]GrayRelease, error) {
	resp, err := cc.c.config.ListGrayReleases(ctx, &coorddv1.ListGrayReleasesRequest{Namespace: ns, Before: before, PageSize: int32(n)})
	if err != nil {
		return nil, convert(ctx, err)
	}
	out := make([]GrayRelease, 0, len(resp.GetGrays()))
	for _, g := range resp.GetGrays() {
		out = append(out, grayFrom(g))
	}
	return out, nil
}

// DiffGray lists the key changes between two releases, either of which
// may be a gray release (the content its instances saw).
func (cc *ConfigCenter) DiffGray(ctx context.Context, ns string, from int64, fromGray bool, to int64, toGray bool) ([]KeyChange, error) {
	resp, err := cc.c.config.Diff(ctx, &coorddv1.DiffRequest{Namespace: ns, FromRelease: from, ToRelease: to, FromGray: fromGray, ToGray: toGray})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return changesFrom(resp.GetChanges()), nil
}
