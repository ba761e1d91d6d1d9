package slowdisk_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/testkit/slowdisk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A file written through the mount, in a directory made there, lands in the backing directory, and
// its fsync takes the delay while one is set (and about nothing after).
// This test uses the mount from the serving process, which is safe only
// because it maps no file into memory.
func TestFsyncTakesTheDelay(t *testing.T) {
	if !slowdisk.Available() {
		t.Skip("no FUSE on this machine (/dev/fuse)")
	}
	backing, mnt := t.TempDir(), t.TempDir()
	d, err := slowdisk.Mount(t, backing, mnt)
	if err != nil {
		t.Skipf("cannot mount FUSE here: %v", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(mnt, "member", "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sync := func() time.Duration {
		if _, err := f.WriteString("entry\n"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	d.SetFsyncDelay(300 * time.Millisecond)
	if took := sync(); took < 300*time.Millisecond {
		t.Fatalf("fsync with a 300ms delay took %s", took)
	}
	d.SetFsyncDelay(0)
	sync()
	raw, err := os.ReadFile(filepath.Join(backing, "member", "wal"))
	if err != nil || string(raw) != "entry\nentry\n" {
		t.Fatalf("backing file = %q, %v", raw, err)
	}
}
