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
// The package holds no gRPC or proto types; internal/server/api adapts
// it to coordd.v1.ClusterService.
package cluster

import (
	"context"
	"fmt"
	"io"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Manager answers cluster questions through an etcd client.
type Manager struct {
	cli      *clientv3.Client
	endpoint string // the etcd endpoint whose raft status is reported
	local    Local
	root     string        // coordd's key root: health reports live under it
	version  string        // this coordd's version
	interval time.Duration // how often embedded members report their health
}

// Local describes the embedded member a Manager reports on; it is zero
// with an external etcd.
type Local struct {
	MemberID uint64
	Quota    int64 // its database quota
	// Measure reads the member's raft position and database size from the
	// server itself: etcd's Status call reads the database file, and on a
	// member that has stopped (removed from the cluster, its file closed)
	// that dereferences nil in etcd v3.7.3 and crashes the process. nil
	// asks endpoint's Status.
	Measure func() Health
	// Defragment defragments it in process (etcd's in-process client
	// cannot); nil defragments endpoint through the client.
	Defragment func() error
}

// Options configure a Manager.
type Options struct {
	// Endpoint is the etcd endpoint whose raft status is reported: the
	// embedded member's client URL, or the first external endpoint.
	Endpoint string
	Local    Local
	KeyRoot  string // coordd's key root; members' health reports live under it
	Version  string // this coordd's version, shown in the answering member's health
	// HealthInterval is how often embedded members report their health
	// (DefaultHealthInterval if zero); a report three intervals old is stale.
	HealthInterval time.Duration
}

// NewManager returns a Manager.
func NewManager(cli *clientv3.Client, o Options) *Manager {
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	return &Manager{cli: cli, endpoint: o.Endpoint, local: o.Local, root: o.KeyRoot, version: o.Version, interval: o.HealthInterval}
}

// Member is one etcd member.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string
	Leader     bool
	Learner    bool
	// Health is the member's own account of itself; nil for a member added
	// but never started.
	Health *Health
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

// Status reads the member list with each member's health, the endpoint's
// raft status and the current revision.
func (m *Manager) Status(ctx context.Context) (Status, error) {
	v, err := m.view(ctx)
	if err != nil {
		return Status{}, err
	}
	rev, err := m.cli.Get(ctx, "\x00", clientv3.WithCountOnly()) // linearizable: the current revision
	if err != nil {
		return Status{}, fmt.Errorf("cluster: revision: %w", err)
	}
	st := v.self
	return Status{
		ClusterID: v.clusterID, MemberID: m.local.MemberID, LeaderID: st.LeaderID,
		Revision: rev.Header.Revision, RaftTerm: st.RaftTerm,
		DBSize: st.DBSize, DBSizeInUse: st.DBSizeInUse, EtcdVersion: st.EtcdVersion,
		Members: v.members, Alarms: v.alarms, Quota: m.local.Quota,
	}, nil
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
