package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// dataDirLock is an exclusive lock on a data dir, held from before etcd
// opens it until after etcd has closed it. The kernel drops it when the
// process dies, so a crash never leaves a stale lock behind.
type dataDirLock struct {
	f       *os.File
	dir     string
	created bool // this start made dir: it did not exist before
	// discard asks unlock to remove dir if this start made it and etcd
	// never wrote a member to it (etcd/member; a start that failed): nothing is left
	// behind but what a retry would make again.
	discard bool
}

// ErrDataDirInUse means that another process holds the data dir.
var ErrDataDirInUse = errors.New("data dir in use")

// lockDataDir creates dir if needed and takes its lock without waiting.
// Without it, a second coordd on the same dir would block forever inside
// etcd (opening its database) while holding its ports.
func lockDataDir(dir string) (*dataDirLock, error) {
	_, statErr := os.Stat(dir)
	created := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, "coordd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // nothing written; the lock's error is the one to return
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = fmt.Sprintf("another coordd (pid %d)", pid)
				}
			}
			abs, _ := filepath.Abs(dir)
			return nil, fmt.Errorf("%w: %s is used by %s; stop it or give this one its own --data-dir", ErrDataDirInUse, abs, holder)
		}
		return nil, fmt.Errorf("data dir: lock %s: %w", path, err)
	}
	// The PID is for the message above only; the lock is what counts, so
	// a failed write only makes that message say "another process".
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataDirLock{f: f, dir: dir, created: created}, nil
}

// unlock releases the lock. It is safe on a nil lock.
func (l *dataDirLock) unlock() {
	if l == nil {
		return
	}
	if l.discard && l.created {
		// Removed while still locked, so no other coordd has it yet.
		if _, err := os.Stat(filepath.Join(l.dir, "etcd", "member")); errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(l.dir) // best effort: a retry would use it as it is
		}
	}
	// Closing the last descriptor drops the flock. The file holds only the
	// PID, for the message of a second coordd: a failed close loses nothing.
	_ = l.f.Close()
}
