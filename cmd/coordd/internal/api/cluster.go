package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClusterServer serves coordd.v1.ClusterService from the etcd client.
type ClusterServer struct {
	coorddv1.UnsafeClusterServiceServer // compile errors when the service grows

	cli      *clientv3.Client
	endpoint string // the etcd endpoint to ask for status
	memberID uint64 // the embedded member's id; 0 with an external etcd
	version  string
}

// NewClusterServer returns the ClusterService adapter. endpoint is the etcd
// client URL whose status is reported.
func NewClusterServer(cli *clientv3.Client, endpoint string, memberID uint64, version string) *ClusterServer {
	return &ClusterServer{cli: cli, endpoint: endpoint, memberID: memberID, version: version}
}

func hex(id uint64) string { return strconv.FormatUint(id, 16) }

// GetClusterStatus implements ClusterService.
func (s *ClusterServer) GetClusterStatus(ctx context.Context, _ *coorddv1.GetClusterStatusRequest) (*coorddv1.GetClusterStatusResponse, error) {
	members, err := s.cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: member list: %w", err)
	}
	st, err := s.cli.Status(ctx, s.endpoint)
	if err != nil {
		return nil, fmt.Errorf("cluster: status: %w", err)
	}
	rev, err := s.cli.Get(ctx, "\x00", clientv3.WithCountOnly()) // linearizable: the current revision
	if err != nil {
		return nil, fmt.Errorf("cluster: revision: %w", err)
	}
	resp := &coorddv1.GetClusterStatusResponse{
		ClusterId: hex(st.Header.ClusterId), Revision: rev.Header.Revision, RaftTerm: st.RaftTerm,
		DbSizeBytes: st.DbSize, DbSizeInUseBytes: st.DbSizeInUse, EtcdVersion: st.Version, CoorddVersion: s.version,
	}
	if st.Leader != 0 {
		resp.LeaderId = hex(st.Leader)
	}
	if s.memberID != 0 {
		resp.MemberId = hex(s.memberID)
	}
	for _, m := range members.Members {
		resp.Members = append(resp.Members, &coorddv1.ClusterMember{
			Id: hex(m.ID), Name: m.Name, PeerUrls: m.PeerURLs, ClientUrls: m.ClientURLs,
			IsLeader: m.ID == st.Leader, IsLearner: m.IsLearner,
		})
	}
	return resp, nil
}

// SaveSnapshot implements ClusterService.
func (s *ClusterServer) SaveSnapshot(_ *coorddv1.SaveSnapshotRequest, stream coorddv1.ClusterService_SaveSnapshotServer) error {
	rc, err := s.cli.Snapshot(stream.Context())
	if err != nil {
		return fmt.Errorf("cluster: snapshot: %w", err)
	}
	defer rc.Close()
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
