package history

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// A local feed started behind etcd's compaction fails with ErrCompacted
// (as the gRPC watch does), so that the recorder starts again from its
// cursor and records the gap; one started at the current revision
// delivers the events after it, and a progress response moves the
// writer's revision on.
func TestLocalFeed(t *testing.T) {
	t.Parallel()
	m := etcdtest.Start(t)
	cli := m.Client(t)
	ctx := t.Context()
	var last int64
	for range 3 {
		resp, err := cli.Put(ctx, "/f/lock/a", "v")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	w := &writer{r: &Recorder{batch: defaultBatch}}
	var got []*clientv3.Event
	apply := func(evs []*clientv3.Event) { got = append(got, evs...) }

	behind, err := newLocalFeed(ctx, m.Etcd.Server.KV(), "/f/", "/f0", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer behind.close()
	var drainErr error
	wait.For(t, "the feed behind the compaction to fail", func() bool {
		_, drainErr = behind.drain(apply, w)
		return drainErr != nil
	})
	if !errors.Is(drainErr, rpctypes.ErrCompacted) {
		t.Fatalf("drain behind the compaction: %v, want ErrCompacted", drainErr)
	}

	current, err := newLocalFeed(ctx, m.Etcd.Server.KV(), "/f/", "/f0", last+1)
	if err != nil {
		t.Fatal(err)
	}
	defer current.close()
	resp, err := cli.Put(ctx, "/f/lock/b", "v")
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the put's event", func() bool {
		if _, err := current.drain(apply, w); err != nil {
			t.Fatal(err)
		}
		return len(got) > 0
	})
	if len(got) != 1 || string(got[0].Kv.Key) != "/f/lock/b" || got[0].Kv.ModRevision != resp.Header.Revision {
		t.Fatalf("events %v, want the put of /f/lock/b at %d", got, resp.Header.Revision)
	}
	other, err := cli.Put(ctx, "/elsewhere", "v") // outside the feed's range
	if err != nil {
		t.Fatal(err)
	}
	current.requestProgress()
	wait.For(t, "a progress response", func() bool {
		if _, err := current.drain(apply, w); err != nil {
			t.Fatal(err)
		}
		return w.upTo >= other.Header.Revision
	})
	if len(got) != 1 {
		t.Fatalf("events %v: the put outside the range was delivered", got)
	}
}
