package cluster_test

import (
	"strings"
	"testing"

	"github.com/coordd/coordd/cluster"
)

func TestCompactionSettings(t *testing.T) {
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
