package queue

import (
	"fmt"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A mirror that always has waiters while notable holders come and go (a
// hot lock whose holders ask for a lock-delay) remembers only the gone
// holders some waiter still needs, not every one since it was made; each
// waiter still hears of the holders that went ahead of it.
func TestNotableGoneIsBounded(t *testing.T) {
	m := &mirror{ws: &Waiters{opts: WaitersOptions{Notable: func(*mvccpb.KeyValue) bool { return true }}},
		id: mirrorID{"/q/", 1}, byKey: map[string]*node{}, pending: map[string]*waiting{}, loaded: true}
	rev := int64(0)
	put := func(key string) *mvccpb.KeyValue {
		rev++
		kv := &mvccpb.KeyValue{Key: []byte(key), CreateRevision: rev, ModRevision: rev}
		m.apply([]*clientv3.Event{{Type: mvccpb.PUT, Kv: kv}})
		return kv
	}
	del := func(key string) {
		rev++
		m.apply([]*clientv3.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}})
	}
	// A holder and two waiters; each round the holder goes, the first
	// waiter's turn comes, and a new waiter joins at the tail.
	waiters := map[int]*waiting{}
	join := func(i int) {
		kv := put(fmt.Sprintf("/q/%d", i))
		waiters[i] = &waiting{key: string(kv.Key), rev: kv.CreateRevision, done: make(chan outcome, 1)}
		m.register(waiters[i], nil)
	}
	put("/q/0")
	join(1)
	join(2)
	for i := 1; i <= 5000; i++ {
		del(fmt.Sprintf("/q/%d", i-1))
		o := <-waiters[i].done
		delete(waiters, i)
		holder := func(g Gone) bool { return string(g.KV.Key) == fmt.Sprintf("/q/%d", i-1) && g.Rev == rev }
		if o.err != nil || len(o.gone) > 2 || !slices.ContainsFunc(o.gone, holder) {
			t.Fatalf("waiter %d: %+v; want its turn and the holder before it gone at %d", i, o, rev)
		}
		join(i + 2)
	}
	if n := len(m.notable); n > 600 {
		t.Errorf("after 5,000 holders went, %d are remembered; want the few a waiter may still need", n)
	}
}
