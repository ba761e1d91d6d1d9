package cluster

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Revisions returns the current revision and the compaction revision (the
// oldest revision still readable; 0 before any compaction), as the member
// this Manager reports on sees them (serializable reads). etcd does not
// report its compaction revision, so it is found by bisection, starting
// from known (a compaction revision seen before: it never goes back):
// about log2(current - known) reads of nothing, each a local call.
func (m *Manager) Revisions(ctx context.Context, known int64) (current, compacted int64, err error) {
	const probe = "\x00" // no key: every read is empty
	resp, err := m.cli.Get(ctx, probe, clientv3.WithSerializable(), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: revision: %w", err)
	}
	current = resp.Header.Revision
	readable := func(rev int64) (bool, error) {
		_, err := m.cli.Get(ctx, probe, clientv3.WithSerializable(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
		switch {
		case err == nil:
			return true, nil
		case errors.Is(rpctypes.Error(err), rpctypes.ErrCompacted):
			return false, nil
		}
		return false, fmt.Errorf("cluster: compaction revision: %w", err)
	}
	// Invariant: lo is not readable or is the compaction revision (0
	// stands for "nothing compacted"), hi is readable.
	lo, hi := max(known, 0), current
	if lo >= hi {
		return current, min(lo, hi), nil
	}
	if ok, err := readable(max(lo, 1)); err != nil {
		return 0, 0, err
	} else if ok {
		return current, lo, nil // nothing compacted past what was known
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := readable(mid)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return current, hi, nil
}
