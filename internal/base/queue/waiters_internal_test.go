package queue

import (
	"errors"
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
	m := testMirror(WaitersOptions{Notable: func(*mvccpb.KeyValue) bool { return true }}, 1)
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

// An entry taken over by a retry is waited for by the retry, whichever of
// the two calls registers first and however the call it replaced gives
// up: its turn is told to the retry, and the replaced call ends with
// ErrTakenOver. It fails when a later registration simply replaces the
// entry's waiter (the replaced call, registering last and then giving up,
// left the entry with no waiter: a retried acquire waited on a free lock).
func TestTakeOverKeepsTheOwnersWait(t *testing.T) {
	for _, tc := range []struct {
		name         string
		retryFirst   bool // the retry registers before the call it replaced
		pendingFirst bool // both register before the mirror has loaded
	}{
		{name: "the replaced call registers first"},
		{name: "the retry registers first", retryFirst: true},
		{name: "both pending, the retry first", retryFirst: true, pendingFirst: true},
		{name: "both pending, the replaced call first", pendingFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMirror(WaitersOptions{}, 1)
			m.loaded = !tc.pendingFirst
			holder := &mvccpb.KeyValue{Key: []byte("/q/holder"), CreateRevision: 1, ModRevision: 1}
			entry := &mvccpb.KeyValue{Key: []byte("/q/job-42"), CreateRevision: 2, ModRevision: 2}
			retried := &mvccpb.KeyValue{Key: entry.Key, CreateRevision: 2, ModRevision: 3, Version: 2}
			if !tc.pendingFirst {
				m.apply([]*clientv3.Event{{Type: mvccpb.PUT, Kv: holder}, {Type: mvccpb.PUT, Kv: entry}, {Type: mvccpb.PUT, Kv: retried}})
			}
			first := &waiting{key: string(entry.Key), rev: 2, owned: 2, done: make(chan outcome, 1)}
			retry := &waiting{key: string(entry.Key), rev: 2, owned: 3, done: make(chan outcome, 1)}
			order := []*waiting{first, retry}
			if tc.retryFirst {
				order = []*waiting{retry, first}
			}
			for _, wt := range order {
				m.register(wt, nil)
			}
			if tc.pendingFirst {
				// The mirror's load: the queue as of revision 3.
				m.loaded, m.pos = true, 3
				m.append(&node{kv: holder, exclusive: true}, 3)
				m.append(&node{kv: retried, exclusive: true}, 3)
				m.settlePending()
			}
			// The replaced call gives up (its context ended).
			select {
			case o := <-first.done:
				if !errors.Is(o.err, ErrTakenOver) {
					t.Fatalf("the replaced call's wait ended with %+v; want ErrTakenOver", o)
				}
			default:
				m.unregister(first)
			}
			m.apply([]*clientv3.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: holder.Key, ModRevision: 4}}})
			select {
			case o := <-retry.done:
				if o.err != nil || o.rev != 4 {
					t.Fatalf("the retry's wait ended with %+v; want its turn at revision 4", o)
				}
			default:
				t.Fatal("the holder went and the retry, at the head now, was not told: its wait was lost")
			}
			if m.waiters != 0 || len(m.pending) != 0 {
				t.Fatalf("%d waiters and %d pending left; want none", m.waiters, len(m.pending))
			}
		})
	}
}

// testMirror is a loaded mirror of queue "/q/" with no goroutine: a test
// drives it with apply.
func testMirror(opts WaitersOptions, limit int) *mirror {
	return &mirror{ws: &Waiters{opts: opts}, id: mirrorID{"/q/", limit}, byKey: map[string]*node{}, byRev: newRevIndex(),
		pending: map[string]*waiting{}, loaded: true}
}
