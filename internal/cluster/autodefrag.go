package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// AutoDefrag is when an embedded member defragments itself: once at least
// FreeRatio of its database file, and at least MinFree bytes, are free
// (compaction frees pages; only defragmentation gives them back to the
// file system). The zero value is off.
type AutoDefrag struct {
	FreeRatio float64       // 0 < FreeRatio < 1; 0 is off
	MinFree   int64         // bytes; default DefaultAutoDefragMinFree
	Every     time.Duration // how often to look; default a minute
}

// DefaultAutoDefragMinFree keeps small databases from being defragmented
// for a few free megabytes: a defragmentation stops the member for a
// moment, and a small file costs nothing.
const DefaultAutoDefragMinFree = 64 << 20

// On reports whether a is on.
func (a AutoDefrag) On() bool { return a.FreeRatio > 0 }

// Validate reports a setting that cannot work.
func (a AutoDefrag) Validate() error {
	if a.FreeRatio < 0 || a.FreeRatio >= 1 {
		return fmt.Errorf("auto-defrag free ratio %v: want 0 (off) or a fraction between 0 and 1, e.g. 0.5", a.FreeRatio)
	}
	if a.MinFree < 0 || a.Every < 0 {
		return errors.New("auto-defrag: minimum free bytes and interval must not be negative")
	}
	return nil
}

// defragLockTTL bounds how long a member that died while defragmenting
// keeps the others from starting.
const defragLockTTL = 10 * 60 // seconds

// RunAutoDefrag defragments the embedded member whenever a says, until
// ctx ends. Members take turns: a member defragments only while it holds
// the cluster-wide defragmentation key (a lease-bound etcd key), so two
// members never defragment at once, and a quorum always serves. Not while
// etcd's NOSPACE alarm is raised: taking the key is a write etcd then
// refuses (run coordctl cluster defrag instead). With an external etcd
// (no embedded member) it returns at once.
func (m *Manager) RunAutoDefrag(ctx context.Context, a AutoDefrag, lg *zap.Logger) {
	if !a.On() || m.local.Measure == nil {
		return
	}
	if a.MinFree == 0 {
		a.MinFree = DefaultAutoDefragMinFree
	}
	if a.Every == 0 {
		a.Every = time.Minute
	}
	t := time.NewTicker(a.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h := m.local.Measure()
		free := h.DBSize - h.DBSizeInUse
		if h.DBSize == 0 || free < a.MinFree || float64(free)/float64(h.DBSize) < a.FreeRatio {
			continue
		}
		d, took, err := m.defragInTurn(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			lg.Warn("automatic defragmentation failed; retrying at the next check", zap.Error(err))
		case took:
			lg.Info("defragmented automatically", zap.Int64("before", d.SizeBefore), zap.Int64("after", d.SizeAfter), zap.Duration("took", d.Took))
		}
	}
}

// defragInTurn defragments this member if no other member is
// defragmenting; took reports whether it did.
func (m *Manager) defragInTurn(ctx context.Context) (d Defrag, took bool, err error) {
	key := m.root + "cluster/defragmenting"
	lease, err := m.cli.Grant(ctx, defragLockTTL)
	if err != nil {
		return Defrag{}, false, fmt.Errorf("cluster: defragmentation turn: %w", err)
	}
	// Revoked on the way out, also when ctx has ended.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = m.cli.Revoke(rctx, lease.ID) // a failure leaves the key to expire with its lease
	}()
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, fmt.Sprintf("%x", m.local.MemberID), clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil {
		return Defrag{}, false, fmt.Errorf("cluster: defragmentation turn: %w", err)
	}
	if !resp.Succeeded {
		return Defrag{}, false, nil // another member's turn; look again later
	}
	d, err = m.Defragment(ctx)
	return d, err == nil, err
}
