package history

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A lock's emptied queue is kept for its next acquisition, but queues of
// locks no longer used are swept out: the recorder's memory follows the
// locks in use, not every lock ever taken.
func TestEmptyQueuesAreSweptOut(t *testing.T) {
	s := newState("/r/")
	rev := int64(1)
	now := time.Unix(1, 0)
	cycle := func(name string) {
		key := []byte("/r/lock/" + name + "/q/0000000000000001/x")
		rev++
		grant := s.apply(rev, []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: key, Value: []byte(`{"limit":1}`), CreateRevision: rev, ModRevision: rev, Lease: 1}}}, now)
		if len(grant) != 1 || grant[0].Type != Granted || grant[0].Name != name {
			t.Fatalf("grant of %s: %+v", name, grant)
		}
		rev++
		end := s.apply(rev, []*clientv3.Event{{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: key, ModRevision: rev}}}, now)
		if len(end) != 1 || end[0].Type != Released || end[0].Token != rev-1 {
			t.Fatalf("release of %s: %+v", name, end)
		}
	}
	for i := range 20000 {
		cycle(fmt.Sprintf("lock-%d", i))
		if len(s.queues) > 8192 {
			t.Fatalf("%d queues kept after %d locks were taken and released", len(s.queues), i+1)
		}
	}
	// One lock taken again and again keeps its queue.
	cycle("again")
	q := s.queues["/r/lock/again/"]
	for range 10 {
		cycle("again")
	}
	if s.queues["/r/lock/again/"] != q {
		t.Fatal("the queue of a lock in use was made again")
	}
}
