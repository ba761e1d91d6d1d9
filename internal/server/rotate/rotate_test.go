package rotate_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/server/rotate"
)

func TestRotatesBySizeKeepingTheNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f, err := rotate.Open(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"aaaa\n", "bbbb\n", "cccc\n", "dddd\n", "eeee\n", "ffff\n", "gggg\n"} {
		if _, err := f.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"audit.log": "gggg\n", "audit.log.1": "eeee\nffff\n", "audit.log.2": "cccc\ndddd\n"}
	for name, content := range want {
		got, err := os.ReadFile(filepath.Join(filepath.Dir(path), name))
		if err != nil || string(got) != content {
			t.Errorf("%s = %q, %v; want %q", name, got, err, content)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third old file was kept: %v", err)
	}
	if _, err := f.Write([]byte("x")); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("a write after Close: %v", err)
	}
}
