package cluster

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AlarmType is the kind of an etcd alarm.
type AlarmType string

// etcd's alarms.
const (
	// AlarmNoSpace: the database reached its quota (--quota-backend-bytes).
	// etcd then refuses every write that adds data (puts, transactions
	// with a put, lease grants): new sessions, lock acquisitions,
	// campaigns and publishes fail. Reads, deletes and lease revocations
	// still work, so holders can release, leaders resign and sessions
	// close. It stays raised until disarmed, after an operator made room:
	// compaction (automatic by default), then Defragment on every member.
	AlarmNoSpace AlarmType = "NOSPACE"
	// AlarmCorrupt: a member's data differs from the others'. etcd refuses
	// writes; the member must be replaced from a good one.
	AlarmCorrupt AlarmType = "CORRUPT"
)

// Alarm is one active alarm.
type Alarm struct {
	MemberID   uint64
	MemberName string // empty when the member is no longer in the list
	Type       AlarmType
}

// Alarms lists etcd's active alarms, cluster-wide. etcd answers through
// raft, so it needs a leader.
func (m *Manager) Alarms(ctx context.Context) ([]Alarm, error) {
	resp, err := m.cli.AlarmList(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: alarms: %w", err)
	}
	return m.named(ctx, resp.Alarms), nil
}

// DisarmAlarms clears every active alarm and returns them. A NOSPACE alarm
// cleared while the database is still over its quota comes back at the
// next write that does not fit.
func (m *Manager) DisarmAlarms(ctx context.Context) ([]Alarm, error) {
	resp, err := m.cli.AlarmList(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: alarms: %w", err)
	}
	for _, a := range resp.Alarms {
		if _, err := m.cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return nil, fmt.Errorf("cluster: disarm %s of member %x: %w", a.Alarm, a.MemberID, err)
		}
	}
	return m.named(ctx, resp.Alarms), nil
}

// AlarmsFrom turns etcd's alarm records into Alarms, without member names
// (for a member that reads its own copy of the alarms, without raft).
func AlarmsFrom(as []*pb.AlarmMember) []Alarm {
	out := make([]Alarm, 0, len(as))
	for _, a := range as {
		if a.Alarm == pb.AlarmType_NONE {
			continue
		}
		out = append(out, Alarm{MemberID: a.MemberID, Type: AlarmType(a.Alarm.String())})
	}
	return out
}

// named adds member names to alarms (best effort: without a member list
// they stay empty).
func (m *Manager) named(ctx context.Context, as []*pb.AlarmMember) []Alarm {
	out := AlarmsFrom(as)
	if len(out) == 0 {
		return out
	}
	names := map[uint64]string{}
	if members, err := m.cli.MemberList(ctx); err == nil {
		for _, mb := range members.Members {
			names[mb.ID] = mb.Name
		}
	}
	for i := range out {
		out[i].MemberName = names[out[i].MemberID]
	}
	return out
}

// Defrag reports one defragmentation.
type Defrag struct {
	MemberID   uint64
	MemberName string
	SizeBefore int64 // bytes of the database file before
	SizeAfter  int64 // and after
	Took       time.Duration
}

// Defragment defragments the member this Manager reports on (the embedded
// member, or the first external endpoint): it rewrites the database file
// without the pages that compaction freed. The member serves nothing while
// it runs, so callers defragment one member at a time.
func (m *Manager) Defragment(ctx context.Context) (Defrag, error) {
	_, before, err := m.measure(ctx, m.endpoint)
	if err != nil {
		return Defrag{}, fmt.Errorf("cluster: status: %w", err)
	}
	start := time.Now()
	if m.local.Defragment != nil {
		err = m.local.Defragment()
	} else {
		_, err = m.cli.Defragment(ctx, m.endpoint)
	}
	if err != nil {
		return Defrag{}, fmt.Errorf("cluster: defragment: %w", err)
	}
	took := time.Since(start)
	id, after, err := m.measure(ctx, m.endpoint)
	if err != nil {
		return Defrag{}, fmt.Errorf("cluster: status: %w", err)
	}
	out := Defrag{MemberID: id, SizeBefore: before.DBSize, SizeAfter: after.DBSize, Took: took}
	if members, err := m.cli.MemberList(ctx); err == nil {
		for _, mb := range members.Members {
			if mb.ID == out.MemberID {
				out.MemberName = mb.Name
			}
		}
	}
	return out, nil
}
