package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// DefaultRevisionBump is how far Restore moves etcd's revision past the
// snapshot's by default: more than any cluster writes between a snapshot
// and its restore (a trillion revisions is 20 years at 1,500 a second, a
// busy lock's rate), so that no fencing token, term or config revision
// handed out after the snapshot is ever handed out again.
const DefaultRevisionBump = 1_000_000_000_000

// RestoreOptions say what to restore and how far to move the revision.
type RestoreOptions struct {
	Snapshot      string // a file coordctl snapshot save (SaveSnapshot) wrote
	RevisionBump  uint64 // DefaultRevisionBump when zero
	SkipHashCheck bool   // for a database file copied from a data dir, which has no hash
}

// Restored reports a restore.
type Restored struct {
	DataDir string
	// Sessions counts the etcd leases in the snapshot, all ended when the
	// member starts: the sessions, and the grant history recorder's claim
	// (one more while a member recorded when the snapshot was taken).
	Sessions int
}

// restoredSessions is the file, in the data dir, that lists the sessions
// (etcd lease ids) of a restored snapshot until Start has ended them.
const restoredSessions = "restored-sessions"

// Restore makes cfg.DataDir (which must not hold data yet) the data dir of
// a member of a new cluster restored from a snapshot, with etcd's own
// restore: every member of the new cluster restores the same snapshot with
// its own cfg (name, initial cluster, peer URLs, as it will start with).
//
// Guarantees: the revision jumps by RevisionBump and everything before it
// is marked compacted, so fencing tokens, terms and config revisions only
// grow across the restore, and watches from before it resume into the
// current state. Sessions in the snapshot are ended when the member first
// starts, before it serves: what they held is released and their owners
// see ErrSessionNotFound (a holder that kept running must not find itself
// holding, in the restored cluster, a lock it released after the
// snapshot). Not guaranteed: anything written after the snapshot is lost.
func Restore(cfg Config, o RestoreOptions) (Restored, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(true); err != nil {
		return Restored{}, fmt.Errorf("invalid configuration: %w", err)
	}
	if len(cfg.EtcdEndpoints) > 0 {
		return Restored{}, errors.New("restore is for coordd's embedded etcd; restore an external etcd with etcdutl")
	}
	if o.RevisionBump == 0 {
		o.RevisionBump = DefaultRevisionBump
	}
	if entries, err := os.ReadDir(cfg.DataDir); err == nil && len(entries) > 0 {
		return Restored{}, fmt.Errorf("--data-dir %s is not empty: restore into a new directory (nothing was changed)", cfg.DataDir)
	}
	if _, err := os.Stat(o.Snapshot); err != nil {
		return Restored{}, fmt.Errorf("--snapshot: %w", err)
	}
	dir := filepath.Join(cfg.DataDir, "etcd")
	err := snapshot.NewV3(cfg.Logger.Named("restore")).Restore(snapshot.RestoreConfig{
		SnapshotPath:        o.Snapshot,
		Name:                cfg.Name,
		OutputDataDir:       dir,
		PeerURLs:            cfg.AdvertisePeerURLs,
		InitialCluster:      cfg.InitialCluster,
		InitialClusterToken: cfg.InitialClusterToken,
		SkipHashCheck:       o.SkipHashCheck,
		RevisionBump:        o.RevisionBump,
		MarkCompacted:       true,
	})
	if err != nil {
		_ = os.RemoveAll(dir) // a partial restore; the error says why
		return Restored{}, fmt.Errorf("restore %s: %w", o.Snapshot, err)
	}
	leases, err := leaseIDs(filepath.Join(dir, "member", "snap", "db"))
	if err == nil {
		err = writeRestoredSessions(cfg.DataDir, leases)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return Restored{}, fmt.Errorf("restore %s: %w", o.Snapshot, err)
	}
	return Restored{DataDir: cfg.DataDir, Sessions: len(leases)}, nil
}

// leaseIDs lists the leases in an etcd database file (bucket "lease", keys
// the big-endian lease ids).
func leaseIDs(db string) ([]int64, error) {
	b, err := bbolt.Open(db, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("reading the sessions of the restored database: %w", err)
	}
	defer func() { _ = b.Close() }()
	var ids []int64
	err = b.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket([]byte("lease"))
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, _ []byte) error {
			if len(k) == 8 {
				ids = append(ids, int64(binary.BigEndian.Uint64(k)))
			}
			return nil
		})
	})
	return ids, err
}

func writeRestoredSessions(dataDir string, ids []int64) error {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(strconv.FormatInt(id, 16))
		b.WriteByte('\n')
	}
	return os.WriteFile(filepath.Join(dataDir, restoredSessions), []byte(b.String()), 0o600)
}

// endRestoredSessions ends the sessions a restore left listed, marks the
// restore for the config center (mark), then forgets the list. Every
// member of a restored cluster does it when it first starts; a session
// already ended is no error.
func endRestoredSessions(ctx context.Context, dataDir string, cli *clientv3.Client, lg *zap.Logger, mark func(context.Context) error) error {
	path := filepath.Join(dataDir, restoredSessions)
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	n := 0
	for _, line := range strings.Fields(string(raw)) {
		id, err := strconv.ParseInt(line, 16, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is no session id", path, line)
		}
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("ending session %x of the restored snapshot: %w", id, err)
		}
		n++
	}
	if err := mark(ctx); err != nil {
		return err
	}
	lg.Info("ended the sessions of the restored snapshot", zap.Int("sessions", n))
	return os.Remove(path)
}
