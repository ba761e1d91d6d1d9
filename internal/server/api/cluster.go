package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/cluster"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ClusterServer serves coordd.v1.ClusterService from package cluster.
type ClusterServer struct {
	coorddv1.UnsafeClusterServiceServer // compile errors when the service grows

	m       *cluster.Manager
	version string
	groups  func(auth.Principal) ([]string, bool) // ClusterOptions.Groups
}

// ClusterOptions is what a ClusterServer is built from (NewClusterServer).
type ClusterOptions struct {
	// Cluster is the cluster manager served; required.
	Cluster *cluster.Manager
	// Version is coordd's, reported in the cluster's status; "": none.
	Version string
	// Groups gives a principal's groups and whether a policy is in force
	// (for WhoAmI): auth.Authorizer.Groups. nil: WhoAmI reports the
	// groups the caller authenticated with, and no policy.
	Groups func(auth.Principal) ([]string, bool)
}

// NewClusterServer returns the ClusterService adapter.
func NewClusterServer(o ClusterOptions) *ClusterServer {
	return &ClusterServer{m: o.Cluster, version: o.Version, groups: o.Groups}
}

func hex(id uint64) string { return strconv.FormatUint(id, 16) }

// hexOrEmpty is hex, except that 0 (no such member) is empty.
func hexOrEmpty(id uint64) string {
	if id == 0 {
		return ""
	}
	return hex(id)
}

// GetClusterStatus implements ClusterService.
func (s *ClusterServer) GetClusterStatus(ctx context.Context, _ *coorddv1.GetClusterStatusRequest) (*coorddv1.GetClusterStatusResponse, error) {
	st, err := s.m.Status(ctx)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.GetClusterStatusResponse{
		ClusterId: hex(st.ClusterID), MemberId: hexOrEmpty(st.MemberID), LeaderId: hexOrEmpty(st.LeaderID),
		Revision: st.Revision, RaftTerm: st.RaftTerm, DbSizeBytes: st.DBSize, DbSizeInUseBytes: st.DBSizeInUse,
		EtcdVersion: st.EtcdVersion, CoorddVersion: s.version,
		Alarms: alarmsProto(st.Alarms), QuotaBackendBytes: st.Quota,
	}
	for _, m := range st.Members {
		resp.Members = append(resp.Members, memberProto(m))
	}
	return resp, nil
}

func memberProto(m cluster.Member) *coorddv1.ClusterMember {
	out := &coorddv1.ClusterMember{
		Id: hex(m.ID), Name: m.Name, PeerUrls: m.PeerURLs, ClientUrls: m.ClientURLs,
		IsLeader: m.Leader, IsLearner: m.Learner,
	}
	if h := m.Health; h != nil {
		out.Health = &coorddv1.MemberHealth{
			Stale: h.Stale, Error: h.Error, LeaderId: hexOrEmpty(h.LeaderID),
			RaftTerm: h.RaftTerm, RaftIndex: h.RaftIndex, RaftAppliedIndex: h.AppliedIndex,
			DbSizeBytes: h.DBSize, DbSizeInUseBytes: h.DBSizeInUse,
			EtcdVersion: h.EtcdVersion, CoorddVersion: h.CoorddVersion, Alarms: alarmsProto(h.Alarms),
		}
		if !h.At.IsZero() {
			out.Health.ReportedAt = timestamppb.New(h.At)
		}
	}
	return out
}

// ListMembers implements ClusterService.
func (s *ClusterServer) ListMembers(ctx context.Context, _ *coorddv1.ListMembersRequest) (*coorddv1.ListMembersResponse, error) {
	ms, leader, err := s.m.Members(ctx)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.ListMembersResponse{LeaderId: hexOrEmpty(leader)}
	for _, m := range ms {
		resp.Members = append(resp.Members, memberProto(m))
	}
	return resp, nil
}

// AddMember implements ClusterService.
func (s *ClusterServer) AddMember(ctx context.Context, req *coorddv1.AddMemberRequest) (*coorddv1.AddMemberResponse, error) {
	a, err := s.m.AddMember(ctx, req.GetName(), req.GetPeerUrls())
	if err != nil {
		return nil, err
	}
	return &coorddv1.AddMemberResponse{Member: memberProto(a.Member), InitialCluster: a.InitialCluster, InitialClusterState: a.InitialClusterState}, nil
}

// PromoteMember implements ClusterService.
func (s *ClusterServer) PromoteMember(ctx context.Context, req *coorddv1.PromoteMemberRequest) (*coorddv1.PromoteMemberResponse, error) {
	if req.GetMember() == "" {
		return nil, invalid("member: a member's name or id is required")
	}
	m, err := s.m.PromoteMember(ctx, req.GetMember())
	if err != nil {
		return nil, err
	}
	return &coorddv1.PromoteMemberResponse{Member: memberProto(m)}, nil
}

// RemoveMember implements ClusterService.
func (s *ClusterServer) RemoveMember(ctx context.Context, req *coorddv1.RemoveMemberRequest) (*coorddv1.RemoveMemberResponse, error) {
	if req.GetMember() == "" {
		return nil, invalid("member: a member's name or id is required")
	}
	m, err := s.m.RemoveMember(ctx, req.GetMember())
	if err != nil {
		return nil, err
	}
	return &coorddv1.RemoveMemberResponse{Member: memberProto(m)}, nil
}

// SaveSnapshot implements ClusterService.
func (s *ClusterServer) SaveSnapshot(_ *coorddv1.SaveSnapshotRequest, stream coorddv1.ClusterService_SaveSnapshotServer) error {
	rc, err := s.m.Snapshot(stream.Context())
	if err != nil {
		return err
	}
	defer func() { _ = rc.Close() }() // only read; a failed read is returned
	buf := make([]byte, 256<<10)
	for {
		n, err := rc.Read(buf)
		if n > 0 {
			if serr := stream.Send(&coorddv1.SaveSnapshotResponse{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cluster: snapshot: %w", err)
		}
	}
}

var alarmTypes = map[cluster.AlarmType]coorddv1.AlarmType{
	cluster.AlarmNoSpace: coorddv1.AlarmType_ALARM_TYPE_NOSPACE,
	cluster.AlarmCorrupt: coorddv1.AlarmType_ALARM_TYPE_CORRUPT,
}

func alarmsProto(as []cluster.Alarm) []*coorddv1.Alarm {
	out := make([]*coorddv1.Alarm, 0, len(as))
	for _, a := range as {
		out = append(out, &coorddv1.Alarm{MemberId: hex(a.MemberID), MemberName: a.MemberName, Type: alarmTypes[a.Type]})
	}
	return out
}

// ListAlarms implements ClusterService.
func (s *ClusterServer) ListAlarms(ctx context.Context, _ *coorddv1.ListAlarmsRequest) (*coorddv1.ListAlarmsResponse, error) {
	as, err := s.m.Alarms(ctx)
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListAlarmsResponse{Alarms: alarmsProto(as)}, nil
}

// DisarmAlarms implements ClusterService.
func (s *ClusterServer) DisarmAlarms(ctx context.Context, _ *coorddv1.DisarmAlarmsRequest) (*coorddv1.DisarmAlarmsResponse, error) {
	as, err := s.m.DisarmAlarms(ctx)
	if err != nil {
		return nil, err
	}
	return &coorddv1.DisarmAlarmsResponse{Disarmed: alarmsProto(as)}, nil
}

// Defragment implements ClusterService.
func (s *ClusterServer) Defragment(ctx context.Context, _ *coorddv1.DefragmentRequest) (*coorddv1.DefragmentResponse, error) {
	d, err := s.m.Defragment(ctx)
	if err != nil {
		return nil, err
	}
	return &coorddv1.DefragmentResponse{
		MemberId: hex(d.MemberID), MemberName: d.MemberName,
		DbSizeBeforeBytes: d.SizeBefore, DbSizeAfterBytes: d.SizeAfter, TookMs: d.Took.Milliseconds(),
	}, nil
}

// WhoAmI implements ClusterService.
func (s *ClusterServer) WhoAmI(ctx context.Context, _ *coorddv1.WhoAmIRequest) (*coorddv1.WhoAmIResponse, error) {
	p := PrincipalFrom(ctx)
	resp := &coorddv1.WhoAmIResponse{Principal: p.Name, Groups: p.Groups}
	if s.groups != nil {
		resp.Groups, resp.Policy = s.groups(p)
	}
	return resp, nil
}
