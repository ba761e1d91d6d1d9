package api

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/configcenter"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// CreateGray implements ConfigService.
func (s *ConfigServer) CreateGray(ctx context.Context, req *coorddv1.CreateGrayRequest) (*coorddv1.CreateGrayResponse, error) {
	g, err := s.store.CreateGray(ctx, configcenter.GrayRequest{
		Namespace: req.GetNamespace(), Selector: selectorFrom(req.GetSelector()), Mutations: mutationsFrom(req.GetOverrides(), true),
		Author: author(ctx, req.GetAuthor()), Message: req.GetMessage(), DryRun: req.GetDryRun(),
	})
	if err != nil {
		return nil, err
	}
	if !req.GetDryRun() {
		s.metrics.released("gray")
	}
	return &coorddv1.CreateGrayResponse{Gray: grayProto(g)}, nil
}

// UpdateGray implements ConfigService.
func (s *ConfigServer) UpdateGray(ctx context.Context, req *coorddv1.UpdateGrayRequest) (*coorddv1.UpdateGrayResponse, error) {
	g, err := s.store.UpdateGray(ctx, configcenter.GrayRequest{
		Namespace: req.GetNamespace(), Selector: selectorFrom(req.GetSelector()), Mutations: mutationsFrom(req.GetOverrides(), false),
		Expected: req.GetExpectedGray(), Author: author(ctx, req.GetAuthor()), Message: req.GetMessage(), DryRun: req.GetDryRun(),
	})
	if err != nil {
		return nil, err
	}
	if !req.GetDryRun() {
		s.metrics.released("gray")
	}
	return &coorddv1.UpdateGrayResponse{Gray: grayProto(g)}, nil
}

// PromoteGray implements ConfigService.
func (s *ConfigServer) PromoteGray(ctx context.Context, req *coorddv1.PromoteGrayRequest) (*coorddv1.PromoteGrayResponse, error) {
	g, r, err := s.store.PromoteGray(ctx, req.GetNamespace(), req.GetExpectedGray(), author(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	s.metrics.released("promote")
	return &coorddv1.PromoteGrayResponse{Gray: grayProto(g), Release: releaseProto(r)}, nil
}

// AbandonGray implements ConfigService.
func (s *ConfigServer) AbandonGray(ctx context.Context, req *coorddv1.AbandonGrayRequest) (*coorddv1.AbandonGrayResponse, error) {
	g, err := s.store.AbandonGray(ctx, req.GetNamespace(), req.GetExpectedGray(), author(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	s.metrics.released("gray")
	return &coorddv1.AbandonGrayResponse{Gray: grayProto(g)}, nil
}

// GetGray implements ConfigService.
func (s *ConfigServer) GetGray(ctx context.Context, req *coorddv1.GetGrayRequest) (*coorddv1.GetGrayResponse, error) {
	g, err := s.store.CurrentGray(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetGrayResponse{Gray: grayProto(g)}, nil
}

// ListGrayReleases implements ConfigService.
func (s *ConfigServer) ListGrayReleases(ctx context.Context, req *coorddv1.ListGrayReleasesRequest) (*coorddv1.ListGrayReleasesResponse, error) {
	size, err := pageSizeOf(req.GetPageSize(), defaultReleasePageSize, maxReleasePageSize)
	if err != nil {
		return nil, err
	}
	grays, err := s.store.GrayReleases(ctx, req.GetNamespace(), req.GetBefore(), size)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.ListGrayReleasesResponse{}
	for _, g := range grays {
		resp.Grays = append(resp.Grays, grayProto(g))
	}
	if len(grays) == size && grays[len(grays)-1].Number > 1 {
		resp.NextBefore = grays[len(grays)-1].Number
	}
	return resp, nil
}

// selectorFrom converts a selector; nil stays nil (an update keeps the
// selector).
func selectorFrom(sel *coorddv1.GraySelector) *configcenter.GraySelector {
	if sel == nil {
		return nil
	}
	return &configcenter.GraySelector{Instances: sel.GetInstances(), Labels: sel.GetLabels(), Percent: int(sel.GetPercent())}
}

// mutationsFrom converts mutations. With none given it returns nil (an
// update keeps the overrides), or with required an empty list, which the
// store refuses as "needs at least one change".
func mutationsFrom(ms []*coorddv1.ConfigMutation, required bool) []configcenter.Mutation {
	if len(ms) == 0 {
		if required {
			return []configcenter.Mutation{}
		}
		return nil
	}
	out := make([]configcenter.Mutation, 0, len(ms))
	for _, m := range ms {
		out = append(out, configcenter.Mutation{Key: m.GetKey(), Value: m.GetValue(), Delete: m.GetDelete()})
	}
	return out
}

var grayActions = map[configcenter.GrayAction]coorddv1.GrayAction{
	configcenter.GrayCreate:  coorddv1.GrayAction_GRAY_ACTION_CREATE,
	configcenter.GrayUpdate:  coorddv1.GrayAction_GRAY_ACTION_UPDATE,
	configcenter.GrayPromote: coorddv1.GrayAction_GRAY_ACTION_PROMOTE,
	configcenter.GrayAbandon: coorddv1.GrayAction_GRAY_ACTION_ABANDON,
}

func grayProto(g configcenter.Gray) *coorddv1.GrayRelease {
	out := &coorddv1.GrayRelease{
		Namespace: g.Namespace, Number: g.Number, Action: grayActions[g.Action],
		Selector:    &coorddv1.GraySelector{Instances: g.Selector.Instances, Labels: g.Selector.Labels, Percent: int32(g.Selector.Percent)},
		BaseRelease: g.Base, Changes: changesProto(g.Changes), PromotedTo: g.PromotedTo,
		Author: g.Author, Message: g.Message, Revision: g.Revision,
	}
	for _, m := range g.Overrides {
		out.Overrides = append(out.Overrides, &coorddv1.ConfigMutation{Key: m.Key, Value: m.Value, Delete: m.Delete})
	}
	if !g.Time.IsZero() {
		out.Time = timestamppb.New(g.Time)
	}
	return out
}

// identityFrom is a watcher's stated identity (nil without one).
func identityFrom(instance string, labels map[string]string) *configcenter.Identity {
	if instance == "" && len(labels) == 0 {
		return nil
	}
	return &configcenter.Identity{Instance: instance, Labels: labels}
}
