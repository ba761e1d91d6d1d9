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
	// Health is the member's own account of itself; nil for a member
	// added but never started.
	Health *MemberHealth
}

// MemberHealth is one member's account of itself. Embedded members report
// every few seconds (the answering member's is read fresh); over an
// external etcd each member is asked directly.
type MemberHealth struct {
	ReportedAt time.Time // by the member's own clock; zero without a report
	// Stale: the report is older than three report intervals, or the member
	// did not answer (down, cut off, not reporting); Error says why.
	Stale        bool
	Error        string
	LeaderID     string // the raft leader as this member sees it
	RaftTerm     uint64
	RaftIndex    uint64 // last committed index
	AppliedIndex uint64
	DBSize       int64
	DBSizeInUse  int64
	EtcdVersion  string
	// CoorddVersion of the coordd that embeds it (empty with an external etcd).
	CoorddVersion string
	Alarms        []Alarm
}

func memberFrom(m *coorddv1.ClusterMember) ClusterMember {
	out := ClusterMember{ID: m.GetId(), Name: m.GetName(), PeerURLs: m.GetPeerUrls(), ClientURLs: m.GetClientUrls(), Leader: m.GetIsLeader(), Learner: m.GetIsLearner()}
	if h := m.GetHealth(); h != nil {
		out.Health = &MemberHealth{
			Stale: h.GetStale(), Error: h.GetError(), LeaderID: h.GetLeaderId(),
			RaftTerm: h.GetRaftTerm(), RaftIndex: h.GetRaftIndex(), AppliedIndex: h.GetRaftAppliedIndex(),
			DBSize: h.GetDbSizeBytes(), DBSizeInUse: h.GetDbSizeInUseBytes(),
			EtcdVersion: h.GetEtcdVersion(), CoorddVersion: h.GetCoorddVersion(), Alarms: alarmsFrom(h.GetAlarms()),
		}
		if h.GetReportedAt() != nil {
			out.Health.ReportedAt = h.GetReportedAt().AsTime()
		}
	}
	return out
}

// Members lists the members with their health, and the raft leader's id
// (empty while there is none).
func (a *Admin) Members(ctx context.Context) ([]ClusterMember, string, error) {
	resp, err := a.c.cluster.ListMembers(ctx, &coorddv1.ListMembersRequest{})
	if err != nil {
		return nil, "", convert(ctx, err)
	}
	out := make([]ClusterMember, 0, len(resp.GetMembers()))
	for _, m := range resp.GetMembers() {
		out = append(out, memberFrom(m))
	}
	return out, resp.GetLeaderId(), nil
}

// AddedMember is a learner just added, and how to start it.
type AddedMember struct {
	Member ClusterMember
	// InitialCluster and InitialClusterState are the new member's
	// --initial-cluster and --initial-cluster-state ("existing").
	InitialCluster      string
	InitialClusterState string
}

// AddMember adds a learner that will start with --name name and peer URLs
// peerURLs (where the other members reach it). It receives the log without
// voting; start it with the returned flags, then PromoteMember. Not
// retried: a repeat finds the member added (ErrMemberChangeRefused).
func (a *Admin) AddMember(ctx context.Context, name string, peerURLs ...string) (AddedMember, error) {
	resp, err := a.c.cluster.AddMember(ctx, &coorddv1.AddMemberRequest{Name: name, PeerUrls: peerURLs})
	if err != nil {
		return AddedMember{}, convert(ctx, err)
	}
	return AddedMember{Member: memberFrom(resp.GetMember()), InitialCluster: resp.GetInitialCluster(), InitialClusterState: resp.GetInitialClusterState()}, nil
}

// PromoteMember makes the learner of that name or id a voting member. It
// fails with ErrMemberChangeRefused until the learner has caught up with
// the leader: retry.
func (a *Admin) PromoteMember(ctx context.Context, nameOrID string) (ClusterMember, error) {
	resp, err := a.c.cluster.PromoteMember(ctx, &coorddv1.PromoteMemberRequest{Member: nameOrID})
	if err != nil {
		return ClusterMember{}, convert(ctx, err)
	}
	return memberFrom(resp.GetMember()), nil
}

// RemoveMember removes the member of that name or id for good; the coordd
// embedding it stops. Refused (ErrMemberChangeRefused) for the last voting
// member, the leader while a learner is unpromoted, and a removal that
// would leave no quorum of started members.
func (a *Admin) RemoveMember(ctx context.Context, nameOrID string) (ClusterMember, error) {
	resp, err := a.c.cluster.RemoveMember(ctx, &coorddv1.RemoveMemberRequest{Member: nameOrID})
	if err != nil {
		return ClusterMember{}, convert(ctx, err)
	}
	return memberFrom(resp.GetMember()), nil
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
		st.Members = append(st.Members, memberFrom(m))
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

// Identity is who coordd takes the caller to be.
type Identity struct {
	Principal string   // empty when anonymous
	Groups    []string // its groups in the policy
	Policy    bool     // a policy is in force (without one, anyone may do anything)
}

// WhoAmI asks coordd who the caller is: the principal its bearer token or
// client certificate names. With a policy in force, an anonymous caller
// gets ErrUnauthenticated.
func (a *Admin) WhoAmI(ctx context.Context) (Identity, error) {
	resp, err := a.c.cluster.WhoAmI(ctx, &coorddv1.WhoAmIRequest{})
	if err != nil {
		return Identity{}, convert(ctx, err)
	}
	return Identity{Principal: resp.GetPrincipal(), Groups: resp.GetGroups(), Policy: resp.GetPolicy()}, nil
}
