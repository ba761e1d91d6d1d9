package cluster_test

import (
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

func TestCompactionSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		c               cluster.Compaction
		mode, retention string // as etcd takes them
		err             string
	}{
		{cluster.DefaultCompaction, "periodic", "10s", ""},
		{cluster.Compaction{Mode: "periodic", Retention: "90m"}, "periodic", "1h30m0s", ""},
		{cluster.Compaction{Mode: "revision", Retention: "100000"}, "revision", "100000", ""},
		{cluster.Compaction{Mode: "off"}, "periodic", "0", ""},
		// A bare number means hours to etcd's periodic mode: refused.
		{cluster.Compaction{Mode: "periodic", Retention: "1"}, "", "", "periodic compaction keeps a duration"},
		{cluster.Compaction{Mode: "periodic", Retention: "500ms"}, "", "", "at least 1s"},
		{cluster.Compaction{Mode: "revision", Retention: "1h"}, "", "", "revision compaction keeps a number of revisions"},
		{cluster.Compaction{Mode: "revision", Retention: "0"}, "", "", "revision compaction keeps a number of revisions"},
		{cluster.Compaction{Mode: "weekly", Retention: "1"}, "", "", `--compaction-mode "weekly": want periodic, revision or off`},
	} {
		err := tt.c.Validate()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%+v: Validate = %v, want an error with %q", tt.c, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: Validate = %v", tt.c, err)
			continue
		}
		if mode, retention := tt.c.Etcd(); mode != tt.mode || retention != tt.retention {
			t.Errorf("%+v: Etcd = %q, %q; want %q, %q", tt.c, mode, retention, tt.mode, tt.retention)
		}
	}
}

func TestRevisionsFindTheCompactionRevision(t *testing.T) {
	t.Parallel()
	member := etcdtest.Start(t)
	cli := member.Client(t)
	m := cluster.NewManager(cli, cluster.Options{Endpoint: member.ClientURL, KeyRoot: "/coordd/"})
	ctx := t.Context()
	var revs []int64
	for range 50 {
		r, err := cli.Put(ctx, "/coordd/test/k", "v")
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Header.Revision)
	}
	cur, compacted, err := m.Revisions(ctx, 0)
	if err != nil || cur != revs[49] || compacted != 0 {
		t.Fatalf("before any compaction: Revisions = %d, %d, %v; want %d, 0", cur, compacted, err, revs[49])
	}
	known := int64(0)
	for _, at := range []int64{revs[10], revs[11], revs[37]} {
		if _, err := cli.Compact(ctx, at); err != nil {
			t.Fatal(err)
		}
		_, got, err := m.Revisions(ctx, known)
		if err != nil || got != at {
			t.Fatalf("after compacting at %d (known %d): compaction revision %d, %v", at, known, got, err)
		}
		known = got
	}
}
