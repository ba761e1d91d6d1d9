package api

import (
	"context"
	"math"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/server/trends"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// TrendServer adapts trends.Tracker to coordd.v1.TrendService: reads of
// the member's memory, O(points) per call.
type TrendServer struct {
	coorddv1.UnsafeTrendServiceServer // compile errors when the service grows

	t *trends.Tracker
}

// NewTrendServer serves t.
func NewTrendServer(t *trends.Tracker) *TrendServer { return &TrendServer{t: t} }

// GetClusterTrends implements TrendService.
func (s *TrendServer) GetClusterTrends(context.Context, *coorddv1.GetClusterTrendsRequest) (*coorddv1.GetClusterTrendsResponse, error) {
	return &coorddv1.GetClusterTrendsResponse{Trends: trendsOut(s.t.Cluster())}, nil
}

// GetLockTrends implements TrendService.
func (s *TrendServer) GetLockTrends(_ context.Context, req *coorddv1.GetLockTrendsRequest) (*coorddv1.GetLockTrendsResponse, error) {
	if err := names.Check("lock name", req.GetName()); err != nil {
		return nil, invalid(err.Error())
	}
	return &coorddv1.GetLockTrendsResponse{Trends: trendsOut(s.t.Lock(req.GetName()))}, nil
}

// GetElectionTrends implements TrendService.
func (s *TrendServer) GetElectionTrends(_ context.Context, req *coorddv1.GetElectionTrendsRequest) (*coorddv1.GetElectionTrendsResponse, error) {
	if err := names.Check("election name", req.GetName()); err != nil {
		return nil, invalid(err.Error())
	}
	return &coorddv1.GetElectionTrendsResponse{Trends: trendsOut(s.t.Election(req.GetName()))}, nil
}

// GetNamespaceTrends implements TrendService.
func (s *TrendServer) GetNamespaceTrends(_ context.Context, req *coorddv1.GetNamespaceTrendsRequest) (*coorddv1.GetNamespaceTrendsResponse, error) {
	if err := configcenter.ValidateNamespace(req.GetNamespace()); err != nil {
		return nil, err
	}
	return &coorddv1.GetNamespaceTrendsResponse{Trends: trendsOut(s.t.Namespace(req.GetNamespace()))}, nil
}

func trendsOut(s trends.Snapshot) *coorddv1.Trends {
	out := &coorddv1.Trends{Interval: durationpb.New(s.Every), Tracked: s.Tracked}
	if !s.End.IsZero() {
		out.EndTime = timestamppb.New(s.End)
	}
	for _, series := range s.Series {
		ts := &coorddv1.TrendSeries{Name: series.Name, Unit: series.Unit}
		for _, v := range series.Points {
			valid := !math.IsNaN(v)
			if !valid {
				v = 0
			}
			ts.Points, ts.Valid = append(ts.Points, v), append(ts.Valid, valid)
		}
		out.Series = append(out.Series, ts)
	}
	return out
}
