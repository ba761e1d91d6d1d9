package clientlib

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

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
	Alarms        []Alarm // etcd's active alarms, cluster-wide
	Quota         int64   // the answering member's database quota (0 with an external etcd)
}

// Alarm is one of etcd's active alarms.
type Alarm struct {
	MemberID   string
	MemberName string
	// Type is "NOSPACE" (the database reached its quota: writes that add
	// data fail with ErrNoSpace) or "CORRUPT" (a member's data differs).
	Type string
}

func alarmsFrom(as []*coorddv1.Alarm) []Alarm {
	out := make([]Alarm, 0, len(as))
	for _, a := range as {
		out = append(out, Alarm{MemberID: a.GetMemberId(), MemberName: a.GetMemberName(), Type: strings.TrimPrefix(a.GetType().String(), "ALARM_TYPE_")})
	}
	return out
}

// Alarms lists etcd's active alarms.
func (a *Admin) Alarms(ctx context.Context) ([]Alarm, error) {
	resp, err := a.c.cluster.ListAlarms(ctx, &coorddv1.ListAlarmsRequest{})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return alarmsFrom(resp.GetAlarms()), nil
}

// DisarmAlarms clears every active alarm and returns them. Clear NOSPACE
// only once there is room again (compaction, then Defragment on every
// member), or it comes back at the next write that does not fit.
func (a *Admin) DisarmAlarms(ctx context.Context) ([]Alarm, error) {
	resp, err := a.c.cluster.DisarmAlarms(ctx, &coorddv1.DisarmAlarmsRequest{})
	if err != nil {
		return nil, convert(ctx, err)
	}
	return alarmsFrom(resp.GetDisarmed()), nil
}

// Defrag reports one member's defragmentation.
type Defrag struct {
	MemberID, MemberName  string
	SizeBefore, SizeAfter int64 // bytes of the database file
	Took                  time.Duration
}

// Defragment defragments the database of the member the client is
// connected to (a Client with one endpoint names it). The member serves
// nothing while it runs: defragment one member at a time, never all at
// once. Not retried: a second defragmentation just finds nothing to do.
func (a *Admin) Defragment(ctx context.Context) (Defrag, error) {
	resp, err := a.c.cluster.Defragment(ctx, &coorddv1.DefragmentRequest{})
	if err != nil {
		return Defrag{}, convert(ctx, err)
	}
	return Defrag{MemberID: resp.GetMemberId(), MemberName: resp.GetMemberName(), SizeBefore: resp.GetDbSizeBeforeBytes(),
		SizeAfter: resp.GetDbSizeAfterBytes(), Took: time.Duration(resp.GetTookMs()) * time.Millisecond}, nil
}

// ClusterStatus describes the cluster.
func (a *Admin) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	resp, err := a.c.cluster.GetClusterStatus(ctx, &coorddv1.GetClusterStatusRequest{})
	if err != nil {
		return ClusterStatus{}, convert(ctx, err)
	}
	st := ClusterStatus{ClusterID: resp.GetClusterId(), MemberID: resp.GetMemberId(), LeaderID: resp.GetLeaderId(), Revision: resp.GetRevision(), RaftTerm: resp.GetRaftTerm(),
		DBSize: resp.GetDbSizeBytes(), DBSizeInUse: resp.GetDbSizeInUseBytes(), EtcdVersion: resp.GetEtcdVersion(), CoorddVersion: resp.GetCoorddVersion(),
		Alarms: alarmsFrom(resp.GetAlarms()), Quota: resp.GetQuotaBackendBytes()}
	for _, m := range resp.GetMembers() {
		st.Members = append(st.Members, ClusterMember{ID: m.GetId(), Name: m.GetName(), PeerURLs: m.GetPeerUrls(), ClientURLs: m.GetClientUrls(), Leader: m.GetIsLeader(), Learner: m.GetIsLearner()})
	}
	return st, nil
}

// SaveSnapshot writes a backup of etcd's database to w and returns its
// size. Restore it with coordd restore, which moves the revision past every
// token handed out since, so fencing tokens never go backwards.
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
