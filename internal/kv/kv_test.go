package kv_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/kv"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start returns a Store over a fresh etcd, and a function that writes
// under its root directly (as FencedPut would) and returns the revision.
func start(t *testing.T) (*kv.Store, *clientv3.Client, func(key, value string) int64) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cli := etcdtest.Start(t).Client(t)
	put := func(key, value string) int64 {
		t.Helper()
		resp, err := cli.Put(t.Context(), "/coordd/kv/"+key, value)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	return kv.NewStore(cli, "/coordd/"), cli, put
}

// Get reads the latest value or the one at a past revision, and says
// clearly what is missing, malformed, too new or compacted away.
func TestGetReadsNowOrAtARevision(t *testing.T) {
	t.Parallel()
	s, cli, put := start(t)
	ctx := t.Context()
	first := put("app/owner", "a")
	put("app/owner", "b")
	got, rev, err := s.Get(ctx, "app/owner", 0)
	if err != nil || string(got.Value) != "b" || got.Version != 2 || got.CreateRevision != first || rev < got.ModRevision {
		t.Fatalf("Get now = %+v at %d, %v; want b, version 2, created at %d", got, rev, err, first)
	}
	if old, _, err := s.Get(ctx, "app/owner", first); err != nil || string(old.Value) != "a" {
		t.Fatalf("Get at %d = %+v, %v; want a", first, old, err)
	}
	if _, _, err := s.Get(ctx, "app/none", 0); !errors.Is(err, kv.ErrKeyNotFound) {
		t.Errorf("Get of a missing key = %v, want ErrKeyNotFound", err)
	}
	for _, key := range []string{"", "a\x01b", strings.Repeat("k", kv.MaxKeyBytes+1), "\xff"} {
		if _, _, err := s.Get(ctx, key, 0); !errors.Is(err, kv.ErrInvalid) {
			t.Errorf("Get(%q) = %v, want ErrInvalid", key, err)
		}
	}
	if _, _, err := s.Get(ctx, "app/owner", -1); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Get at -1 = %v, want ErrInvalid", err)
	}
	if _, _, err := s.Get(ctx, "app/owner", rev+100); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Get at a future revision = %v, want ErrInvalid", err)
	}
	last := put("app/owner", "c")
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "app/owner", first); !errors.Is(err, kv.ErrCompacted) {
		t.Errorf("Get at a compacted revision = %v, want ErrCompacted", err)
	}
}

// List pages through a prefix in key order; every page of one listing
// reads at the first page's revision, so a write between pages does not
// show; a token only continues the listing it came from.
func TestListPagesAtOneRevision(t *testing.T) {
	t.Parallel()
	s, _, put := start(t)
	ctx := t.Context()
	for i := range 5 {
		put(fmt.Sprintf("jobs/%d", i), fmt.Sprint(i))
	}
	put("other/x", "x")
	var keys []string
	p, err := s.List(ctx, "jobs/", "", 2, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	at := p.Revision
	put("jobs/10", "late") // after the listing's revision
	for pages := 1; ; pages++ {
		for _, k := range p.KVs {
			keys = append(keys, k.Key)
		}
		if p.Next == "" {
			if pages != 3 {
				t.Fatalf("%d pages of 2 for 5 keys, want 3", pages)
			}
			break
		}
		if p, err = s.List(ctx, "jobs/", p.Next, 2, at, false); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"jobs/0", "jobs/1", "jobs/2", "jobs/3", "jobs/4"}; !slices.Equal(keys, want) {
		t.Fatalf("listed %v, want %v (a write after the first page must not show)", keys, want)
	}
	only, err := s.List(ctx, "jobs/", "", 1, 0, true)
	if err != nil || len(only.KVs) != 1 || only.KVs[0].Value != nil {
		t.Fatalf("keys only = %+v, %v; want one key without its value", only, err)
	}
	if _, err := s.List(ctx, "other/", only.Next, 1, 0, false); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("a token of another prefix = %v, want ErrInvalid", err)
	}
	for _, size := range []int{-1, kv.MaxPageSize + 1} {
		if _, err := s.List(ctx, "jobs/", "", size, 0, false); !errors.Is(err, kv.ErrInvalid) {
			t.Errorf("page size %d = %v, want ErrInvalid", size, err)
		}
	}
}

// Watch says where it starts, then delivers every change under its prefix
// in revision order (from a past revision too), and refuses a compacted
// start.
func TestWatchDeliversEveryChangeInOrder(t *testing.T) {
	t.Parallel()
	s, cli, put := start(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := put("w/a", "1")
	put("w/b", "2")
	put("elsewhere", "x")
	if _, err := cli.Delete(ctx, "/coordd/kv/w/a"); err != nil {
		t.Fatal(err)
	}
	var started int64
	var got []string
	stop := errors.New("enough")
	err := s.Watch(ctx, "w/", first, func(evs []kv.Event, rev int64) error {
		if evs == nil {
			started = rev
			return nil
		}
		for _, ev := range evs {
			got = append(got, fmt.Sprintf("%v %s %s", ev.Deleted, ev.KV.Key, ev.KV.Value))
		}
		if len(got) >= 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Watch = %v", err)
	}
	if started != first-1 {
		t.Errorf("the watch said it starts after %d, want %d", started, first-1)
	}
	if want := []string{"false w/a 1", "false w/b 2", "true w/a "}; !slices.Equal(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
	last := put("w/c", "3")
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	err = s.Watch(ctx, "w/", first, func([]kv.Event, int64) error { return nil })
	if !errors.Is(err, kv.ErrCompacted) {
		t.Fatalf("Watch from a compacted revision = %v, want ErrCompacted", err)
	}
}
