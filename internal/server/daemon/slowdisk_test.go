package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The slow-disk decision over ticks of 500 ms with a 100 ms threshold and
// a 2 s window: slow ticks add up, a fast one resets, a histogram none of
// whose operations finished in a tick keeps its last verdict (an fsync
// still under way on a crawling disk), whatever the other does, and either
// histogram alone makes a tick slow.
func TestDiskStateNeedsAWindowOfSlowTicks(t *testing.T) {
	const tick, threshold, window = 500 * time.Millisecond, 100 * time.Millisecond, 2 * time.Second
	const wal, commit = "etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds"
	type delta struct {
		wal, commit diskSample // added during the tick
	}
	fast := delta{wal: diskSample{sum: 0.010, count: 5}, commit: diskSample{sum: 0.004, count: 2}}
	slowWAL := delta{wal: diskSample{sum: 0.400, count: 2}}
	slowCommit := delta{wal: diskSample{sum: 0.001, count: 1}, commit: diskSample{sum: 0.250, count: 1}}
	none := delta{}
	slowWALFastCommits := delta{commit: diskSample{sum: 0.002, count: 1}} // the WAL's fsync still under way
	for _, tc := range []struct {
		name  string
		ticks []delta
		want  []bool // after each tick
	}{
		{"four slow ticks", []delta{slowWAL, slowWAL, slowWAL, slowWAL, slowWAL}, []bool{false, false, false, true, true}},
		{"a fast tick resets", []delta{slowWAL, slowWAL, slowWAL, fast, slowWAL, slowWAL, slowWAL, slowWAL}, []bool{false, false, false, false, false, false, false, true}},
		{"a stuck fsync carries slow", []delta{slowWAL, none, none, none}, []bool{false, false, false, true}},
		{"idle stays healthy", []delta{none, none, none, none, none}, []bool{false, false, false, false, false}},
		{"commits alone", []delta{slowCommit, slowCommit, slowCommit, slowCommit}, []bool{false, false, false, true}},
		{"fast commits beside a stuck fsync", []delta{slowWAL, slowWALFastCommits, slowWALFastCommits, slowWALFastCommits}, []bool{false, false, false, true}},
		{"healthy again", []delta{slowWAL, slowWAL, slowWAL, slowWAL, fast}, []bool{false, false, false, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st diskState
			total := map[string]diskSample{}
			for i, d := range tc.ticks {
				before := map[string]diskSample{wal: total[wal], commit: total[commit]}
				total[wal] = diskSample{total[wal].sum + d.wal.sum, total[wal].count + d.wal.count}
				total[commit] = diskSample{total[commit].sum + d.commit.sum, total[commit].count + d.commit.count}
				if got := st.tick(tick, threshold, window, before, map[string]diskSample{wal: total[wal], commit: total[commit]}); got != tc.want[i] {
					t.Fatalf("after tick %d: slow = %v, want %v", i+1, got, tc.want[i])
				}
			}
		})
	}
}

// A --wal-dir without a log is refused while the data dir holds one (it
// would start the member without its data); an empty data dir, or a log in
// --wal-dir, is fine.
func TestWALDirWithoutTheLogIsRefused(t *testing.T) {
	etcdDir, walDir := t.TempDir(), t.TempDir()
	if err := checkWALDir(etcdDir, walDir); err != nil {
		t.Fatalf("empty data dir: %v", err)
	}
	inData := filepath.Join(etcdDir, "member", "wal")
	if err := os.MkdirAll(inData, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inData, "0000000000000000-0000000000000000.wal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkWALDir(etcdDir, walDir); err == nil || !strings.Contains(err.Error(), "move its files") {
		t.Fatalf("log in the data dir only: %v", err)
	}
	if err := checkWALDir(etcdDir, ""); err != nil {
		t.Fatalf("no --wal-dir: %v", err)
	}
	if err := os.WriteFile(filepath.Join(walDir, "0000000000000000-0000000000000000.wal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkWALDir(etcdDir, walDir); err != nil {
		t.Fatalf("log in --wal-dir: %v", err)
	}
}

// The watch reads etcd's own two disk histograms, not the whole default
// registry: both are found (by registering look-alikes) and gathered
// alone, with their samples.
func TestEtcdDiskGathererFindsEtcdsHistograms(t *testing.T) {
	g := etcdDiskGatherer()
	if g == prometheus.DefaultGatherer {
		t.Fatal("etcd's disk histograms were not found on the default registry")
	}
	w := &diskWatch{gather: g}
	got, err := w.read()
	if err != nil {
		t.Fatal(err)
	}
	fams, _ := g.Gather()
	if len(fams) != 2 || len(got) != 2 {
		t.Fatalf("gathered %d families (%v), want etcd's 2 disk histograms", len(fams), got)
	}
}
