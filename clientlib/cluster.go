package clientlib

import (
	"context"
	"errors"
	"io"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ClusterMember is one etcd member.
type ClusterMember struct {
	ID         string
	Name       string
	PeerURLs   []string
	ClientURLs []string
	Leader     bool
	Learner    bool
}

// ClusterStatus describes the cluster as the answering member sees it.
type ClusterStatus struct {
	ClusterID     string
	MemberID      string // the answering member (empty with an external etcd)
	LeaderID      string
	Members       []ClusterMember
	Revision      int64
	RaftTerm      uint64
	DBSize        int64
	DBSizeInUse   int64
	EtcdVersion   string
	CoorddVersion string
}

// ClusterStatus describes the cluster.
func (a *Admin) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	resp, err := a.c.cluster.GetClusterStatus(ctx, &coorddv1.GetClusterStatusRequest{})
	if err != nil {
		return ClusterStatus{}, convert(ctx, err)
	}
	st := ClusterStatus{ClusterID: resp.GetClusterId(), MemberID: resp.GetMemberId(), LeaderID: resp.GetLeaderId(), Revision: resp.GetRevision(), RaftTerm: resp.GetRaftTerm(),
		DBSize: resp.GetDbSizeBytes(), DBSizeInUse: resp.GetDbSizeInUseBytes(), EtcdVersion: resp.GetEtcdVersion(), CoorddVersion: resp.GetCoorddVersion()}
	for _, m := range resp.GetMembers() {
		st.Members = append(st.Members, ClusterMember{ID: m.GetId(), Name: m.GetName(), PeerURLs: m.GetPeerUrls(), ClientURLs: m.GetClientUrls(), Leader: m.GetIsLeader(), Learner: m.GetIsLearner()})
	}
	return st, nil
}

// SaveSnapshot writes a backup of etcd's database to w and returns its
// size. Restore it with etcdutl snapshot restore --bump-revision …
// --mark-compacted, so fencing tokens never go backwards.
func (a *Admin) SaveSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	st, err := a.c.cluster.SaveSnapshot(ctx, &coorddv1.SaveSnapshotRequest{})
	if err != nil {
		return 0, convert(ctx, err)
	}
	var n int64
	for {
		chunk, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, convert(ctx, err)
		}
		m, err := w.Write(chunk.GetData())
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
}
