package trends

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func put(key string, rev int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: rev, ModRevision: rev, Version: 1}}
}

func del(key string, rev int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
}

// A queue's grants are the changes of its head: the first entry, and each
// deletion of the head with entries behind it; deleting an entry behind
// the head is no grant, and its depth is what is left.
func TestQueuesCountGrantsAsHeadChanges(t *testing.T) {
	qs := newQueues("/l/", Options{MaxNames: 10, Points: 4})
	rev := int64(10)
	for i := range 5 {
		rev++
		qs.apply(put(fmt.Sprintf("/l/a/q/%d", i), rev))
	}
	rev++
	qs.apply(del("/l/a/q/2", rev)) // behind the head: no grant
	rev++
	qs.apply(del("/l/a/q/0", rev)) // the head: 1 takes over
	rev++
	qs.apply(del("/l/a/q/1", rev)) // 3 takes over
	qs.apply(del("/l/a/q/1", rev)) // again: nothing
	rate, depth, heads := qs.sample(1)
	if rate != 3 || depth != 2 || heads != 1 {
		t.Fatalf("sample = %g grants/s, depth %g, %g heads; want 3 (the first entry and two hand-overs), 2, 1", rate, depth, heads)
	}
	rev++
	qs.apply(put("/l/a/q/5", rev))
	rev++
	qs.apply(del("/l/a/q/3", rev))
	rev++
	qs.apply(del("/l/a/q/4", rev))
	rev++
	qs.apply(del("/l/a/q/5", rev)) // the last: the queue empties, no grant
	if rate, depth, heads := qs.sample(1); rate != 2 || depth != 0 || heads != 0 {
		t.Fatalf("second sample = %g, %g, %g; want 2 grants, an empty queue", rate, depth, heads)
	}
}
