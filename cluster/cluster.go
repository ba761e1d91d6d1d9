// Package cluster reports on the etcd cluster under coordd and takes its
// backups: which members there are, who leads, how large the database is,
// and a consistent snapshot of it.
//
// Guarantees: Status's Revision is read linearizably (the cluster's current
// revision when the call was served); the member list and the answering
// member's raft status come from that member and may be a moment apart from
// each other. Snapshot streams one consistent point-in-time copy of the
// database from the member the client is connected to.
//
// Not guaranteed: a Status describes the cluster as one member saw it; a
// member cut off from the others reports its own, possibly stale, view of
// the leader and the members.
//
// The package holds no gRPC or proto types; internal/api adapts
// it to coordd.v1.ClusterService.
package cluster

import (
	"context"
	"fmt"
	"io"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Manager answers cluster questions through an etcd client.
type Manager struct {
	cli      *clientv3.Client
	endpoint string // the etcd endpoint whose raft status is reported
	local    Local
}

// Local describes the embedded member a Manager reports on; it is zero
// with an external etcd.
type Local struct {
	MemberID uint64
	Quota    int64 // its database quota
	// Defragment defragments it in process (etcd's in-process client
	// cannot); nil defragments endpoint through the client.
	Defragment func() error
}

// NewManager returns a Manager that reports endpoint's raft status (the
// embedded member's client URL, or the first external endpoint).
func NewManager(cli *clientv3.Client, endpoint string, local Local) *Manager {
	return &Manager{cli: cli, endpoint: endpoint, local: local}
}

// Member is one etcd member.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string
	Leader     bool
	Learner    bool
}

// Status is the cluster as the answering member sees it.
type Status struct {
	ClusterID   uint64
	MemberID    uint64 // the embedded member; 0 with an external etcd
	LeaderID    uint64 // 0 while there is no leader
	Members     []Member
	Revision    int64 // the cluster's current revision (linearizable read)
	RaftTerm    uint64
	DBSize      int64 // bytes of the database file
	DBSizeInUse int64 // bytes in use in it (the rest is free after compaction)
	EtcdVersion string
	Alarms      []Alarm // active alarms, cluster-wide
	Quota       int64   // the embedded member's database quota; 0 with an external etcd
}

// Status reads the member list, the endpoint's raft status and the
// current revision.
func (m *Manager) Status(ctx context.Context) (Status, error) {
	members, err := m.cli.MemberList(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("cluster: member list: %w", err)
	}
	st, err := m.cli.Status(ctx, m.endpoint)
	if err != nil {
		return Status{}, fmt.Errorf("cluster: status: %w", err)
	}
	rev, err := m.cli.Get(ctx, "\x00", clientv3.WithCountOnly()) // linearizable: the current revision
	if err != nil {
		return Status{}, fmt.Errorf("cluster: revision: %w", err)
	}
	out := Status{
		ClusterID: st.Header.ClusterId, MemberID: m.local.MemberID, LeaderID: st.Leader,
		Revision: rev.Header.Revision, RaftTerm: st.RaftTerm,
		DBSize: st.DbSize, DBSizeInUse: st.DbSizeInUse, EtcdVersion: st.Version,
	}
	alarms, err := m.cli.AlarmList(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("cluster: alarms: %w", err)
	}
	out.Alarms = AlarmsFrom(alarms.Alarms)
	out.Quota = m.local.Quota
	names := map[uint64]string{}
	for _, mb := range members.Members {
		names[mb.ID] = mb.Name
		out.Members = append(out.Members, Member{
			ID: mb.ID, Name: mb.Name, PeerURLs: mb.PeerURLs, ClientURLs: mb.ClientURLs,
			Leader: mb.ID == st.Leader, Learner: mb.IsLearner,
		})
	}
	for i := range out.Alarms {
		out.Alarms[i].MemberName = names[out.Alarms[i].MemberID]
	}
	return out, nil
}

// Snapshot opens a stream of a consistent backup of the database. The
// caller reads it to the end (io.EOF) and closes it; closing early, or
// ctx ending, abandons the backup.
func (m *Manager) Snapshot(ctx context.Context) (io.ReadCloser, error) {
	rc, err := m.cli.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot: %w", err)
	}
	return rc, nil
}
