package cluster_test

import (
	"bytes"
	"io"
	"testing"

	"go.uber.org/goleak"

	"github.com/coordd/coordd/cluster"
	"github.com/coordd/coordd/internal/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStatusAndSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	member := etcdtest.Start(t)
	cli := member.Client(t)
	id := uint64(member.Etcd.Server.MemberID())
	m := cluster.NewManager(cli, member.ClientURL, id)
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
