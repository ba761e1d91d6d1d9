package cluster_test

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStatusAndSnapshot(t *testing.T) {
	t.Parallel()
	member := etcdtest.Start(t)
	cli := member.Client(t)
	id := uint64(member.Etcd.Server.MemberID())
	m := cluster.NewManager(cli, cluster.Options{Endpoint: member.ClientURL, Local: cluster.Local{MemberID: id}, KeyRoot: "/coordd/"})
	ctx := t.Context()

	put, err := cli.Put(ctx, "/coordd/test/k", "v")
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if len(st.Members) != 1 || st.Members[0].ID != id || !st.Members[0].Leader || st.LeaderID != id || st.MemberID != id {
		t.Errorf("Status members = %+v leader %x member %x, want the one member %x leading", st.Members, st.LeaderID, st.MemberID, id)
	}
	if st.Revision < put.Header.Revision || st.ClusterID == 0 || st.DBSize <= 0 || st.EtcdVersion == "" {
		t.Errorf("Status = %+v, want revision >= %d, a cluster id, a database size and a version", st, put.Header.Revision)
	}

	rc, err := m.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { _ = rc.Close() })
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading the snapshot: %v", err)
	}
	// The snapshot is a bbolt file holding the key written above.
	if int64(len(data)) < 4096 || !bytes.Contains(data, []byte("/coordd/test/k")) {
		t.Errorf("snapshot of %d bytes does not hold the key written", len(data))
	}
}

func TestAlarmsAndDefragment(t *testing.T) {
	t.Parallel()
	member := etcdtest.Start(t)
	cli := member.Client(t)
	id := uint64(member.Etcd.Server.MemberID())
	m := cluster.NewManager(cli, cluster.Options{Endpoint: member.ClientURL, Local: cluster.Local{MemberID: id}, KeyRoot: "/coordd/"})
	ctx := t.Context()

	if as, err := m.Alarms(ctx); err != nil || len(as) != 0 {
		t.Fatalf("Alarms on a fresh member = %+v, %v; want none", as, err)
	}
	// Raise NOSPACE by hand, as etcd does when the quota is reached.
	if _, err := member.Etcd.Server.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	as, err := m.Alarms(ctx)
	if err != nil || len(as) != 1 || as[0].Type != cluster.AlarmNoSpace || as[0].MemberID != id || as[0].MemberName == "" {
		t.Fatalf("Alarms = %+v, %v; want NOSPACE of the member, named", as, err)
	}
	if st, err := m.Status(ctx); err != nil || len(st.Alarms) != 1 {
		t.Fatalf("Status alarms = %+v, %v", st.Alarms, err)
	}
	disarmed, err := m.DisarmAlarms(ctx)
	if err != nil || len(disarmed) != 1 || disarmed[0].Type != cluster.AlarmNoSpace {
		t.Fatalf("DisarmAlarms = %+v, %v", disarmed, err)
	}
	if as, err := m.Alarms(ctx); err != nil || len(as) != 0 {
		t.Fatalf("Alarms after disarming = %+v, %v; want none", as, err)
	}

	for i := range 200 {
		if _, err := cli.Put(ctx, "/coordd/test/big", strings.Repeat("x", 10<<10)+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, "/coordd/test/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	d, err := m.Defragment(ctx)
	if err != nil {
		t.Fatalf("Defragment: %v", err)
	}
	if d.MemberID != id || d.MemberName == "" || d.SizeAfter >= d.SizeBefore {
		t.Fatalf("Defragment = %+v; want the member, smaller after", d)
	}
}

// A slow leader hands over to the healthiest voter: fresh reports with a
// fast disk first (the most caught up first), then slow disks, then
// members without a fresh report (down, cut off), in their given order.
func TestHandOverOrderPrefersFreshFastCaughtUpMembers(t *testing.T) {
	t.Parallel()
	member := etcdtest.Start(t)
	cli := member.Client(t)
	m := cluster.NewManager(cli, cluster.Options{Endpoint: member.ClientURL, KeyRoot: "/coordd/", HealthInterval: time.Second})
	ctx := t.Context()
	report := func(id uint64, h cluster.Health) {
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "/coordd/cluster/health/"+strconv.FormatUint(id, 16), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	report(0xa, cluster.Health{At: now, AppliedIndex: 90})
	report(0xb, cluster.Health{At: now, AppliedIndex: 100})
	report(0xc, cluster.Health{At: now, AppliedIndex: 120, DiskSlow: true})
	report(0xd, cluster.Health{At: now.Add(-time.Minute), AppliedIndex: 130}) // stale
	got := m.HandOverOrder(ctx, []uint64{0xe, 0xd, 0xc, 0xa, 0xb})
	if want := []uint64{0xb, 0xa, 0xc, 0xe, 0xd}; !slices.Equal(got, want) {
		t.Fatalf("order = %x, want %x", got, want)
	}
}
