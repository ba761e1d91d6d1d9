package session_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func newManager(t *testing.T) (*session.Manager, *clientv3.Client) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	return session.NewManager(cli, "/coordd/"), cli
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	m, cli := newManager(t)
	ctx := t.Context()

	created, err := m.Create(ctx, session.Spec{TTL: 10 * time.Second, Owner: "worker", Hostname: "h1", Labels: map[string]string{"zone": "a"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if created.TTL != 10*time.Second || created.ID <= 0 {
		t.Fatalf("Create = %+v", created)
	}

	got, err := m.Get(ctx, created.ID)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got.Owner != "worker" || got.Hostname != "h1" || got.Labels["zone"] != "a" || !got.Created.Equal(created.Created) {
		t.Errorf("Get = %+v, want metadata of %+v", got, created)
	}
	if got.Remaining < 9*time.Second || got.Remaining > 10*time.Second {
		t.Errorf("Get remaining = %s, want [9s, 10s]", got.Remaining)
	}

	ttl, err := m.KeepAlive(ctx, created.ID)
	if err != nil || ttl != 10*time.Second {
		t.Fatalf("KeepAlive = %s, %v; want 10s", ttl, err)
	}

	// A key bound to the session's lease goes away with it.
	if _, err := cli.Put(ctx, "/coordd/test/attached", "x", clientv3.WithLease(clientv3.LeaseID(created.ID))); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx, created.ID); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if resp, err := cli.Get(ctx, "/coordd/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("keys left after Close: %v, %v", resp, err)
	}
	for name, call := range map[string]func() error{
		"Get":       func() error { _, err := m.Get(ctx, created.ID); return err },
		"KeepAlive": func() error { _, err := m.KeepAlive(ctx, created.ID); return err },
		"Close":     func() error { return m.Close(ctx, created.ID) },
	} {
		if err := call(); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("%s after Close: %v, want ErrNotFound", name, err)
		}
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t)
	ctx := t.Context()
	want := map[session.ID]bool{}
	for range 5 {
		s, err := m.Create(ctx, session.Spec{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		want[s.ID] = true
	}
	var after session.ID
	seen := 0
	for {
		page, more, err := m.List(ctx, after, 2)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, s := range page {
			if s.ID <= after {
				t.Fatalf("List out of order: %s after %s", s.ID, after)
			}
			if !want[s.ID] {
				t.Fatalf("List returned unknown session %s", s.ID)
			}
			after = s.ID
			seen++
		}
		if !more {
			break
		}
	}
	if seen != len(want) {
		t.Fatalf("List saw %d sessions, want %d", seen, len(want))
	}
	if _, _, err := m.List(ctx, 0, 0); !errors.Is(err, session.ErrInvalid) {
		t.Fatalf("List limit 0: %v, want ErrInvalid", err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	m, cli := newManager(t)
	ctx := t.Context()
	before, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []session.Spec{{}, {TTL: time.Millisecond}, {TTL: 2 * time.Hour}, {TTL: 5 * time.Second, Owner: "\xff"}} {
		if _, err := m.Create(ctx, spec); !errors.Is(err, session.ErrInvalid) {
			t.Errorf("Create(%+v) = %v, want ErrInvalid", spec, err)
		}
	}
	after, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Fatalf("revision moved from %d to %d after rejected creates", before.Header.Revision, after.Header.Revision)
	}
	leases, err := cli.Leases(ctx)
	if err != nil || len(leases.Leases) != 0 {
		t.Fatalf("leases after rejected creates: %v, %v", leases, err)
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t)
	ctx := t.Context()
	s, err := m.Create(ctx, session.Spec{TTL: session.MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Wait for the condition, not for a fixed time: etcd checks expiry
	// periodically, so the session ends at TTL or a little after.
	for {
		_, err := m.Get(ctx, s.ID)
		if errors.Is(err, session.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) > wait.Bound(10*time.Second) {
			t.Fatal("session still alive 10s after a 2s TTL")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if elapsed := time.Since(start); elapsed < session.MinTTL-100*time.Millisecond {
		t.Fatalf("session expired after %s, before its %s TTL", elapsed, session.MinTTL)
	}
}
