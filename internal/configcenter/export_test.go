package configcenter

import (
	"context"
	"time"
)

// SetBeforeWatch makes c call f before each etcd watch it opens. Call it
// before Run.
func SetBeforeWatch(c *Cache, f func()) { c.beforeWatch = f }

// SetLocalCopyAt makes s plan its first attempt at every release on the
// namespace as it was at revision rev: a member's copy that is behind.
func SetLocalCopyAt(s *Store, rev int64) {
	s.readLocal = func(ctx context.Context, ns string) (nsState, error) { return s.readNamespace(ctx, ns, rev) }
}

// SetSealingOff makes s store secret values in clear: the sabotage that
// the tests which look for clear text in etcd must catch.
func SetSealingOff(s *Store) { s.secrets.off = true }

// SetSelfApproval lets proposers approve their own proposals: the
// sabotage that the four-eyes tests must catch.
func SetSelfApproval(s *Store) { s.approvalSelfOK = true }

// SetNow makes s read the time from now.
func SetNow(s *Store, now func() time.Time) { s.now = now }

// SetNoCatchUp stops shared releases from reaching heirs at once.
func SetNoCatchUp(s *Store) { s.noCatchUp = true }

// QueueArray reports the room of s's queue array (0: none kept).
func QueueArray(s *Subscription) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cap(s.queue)
}

// TrimRange is the range of release records that release number's
// transaction deletes, given the meta's Trimmed (ok false: none).
func TrimRange(s *Store, ns string, number, trimmed int64) (from, end string, ok bool) {
	ops, _, err := s.releaseOps(ns, Release{Namespace: ns, Number: number}, trimmed)
	if err != nil {
		panic(err)
	}
	for _, op := range ops {
		if op.IsDelete() {
			return string(op.KeyBytes()), string(op.RangeBytes()), true
		}
	}
	return "", "", false
}

// RelKey is the key of release n's record.
func RelKey(s *Store, ns string, n int64) string { return s.relKey(ns, n) }
