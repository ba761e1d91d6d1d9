package history

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneBatches is how many batches one pruning transaction reads at most.
const pruneBatches = 64

// prune removes the oldest batches: those whose last event is older than
// the retention, and then more while the history holds over MaxRecords
// events. Each transaction removes a run of the oldest batches with one
// range delete of t/ and one per lock or election in them, and lowers the
// cursor's count with them (compared, as every write of w's).
func (r *Recorder) prune(ctx context.Context, w *writer) error {
	for {
		more, err := r.pruneOldest(ctx, w)
		if err != nil || !more {
			return err
		}
	}
}

// pruneOldest removes a run of the oldest batches that are due, and
// reports whether more may be.
func (r *Recorder) pruneOldest(ctx context.Context, w *writer) (bool, error) {
	resp, err := r.cli.Get(ctx, r.keys.all(), clientv3.WithPrefix(), clientv3.WithLimit(pruneBatches))
	if err != nil {
		return false, fmt.Errorf("read oldest: %w", err)
	}
	cutoff := r.now().Add(-r.opts.Retention)
	// The last batch of each name among those removed: every earlier
	// one of that name goes too (keys sort by time alike in t/ and n/).
	lastOf := map[string]string{}
	last, removed, batches := "", int64(0), 0
	for _, kv := range resp.Kvs {
		evs, err := decodeBatch(kv.Value)
		if err != nil || len(evs) == 0 {
			continue
		}
		if !evs[len(evs)-1].Time.Before(cutoff) && w.cur.Count-removed <= int64(r.opts.MaxRecords) {
			break // neither too old nor too many
		}
		suffix := strings.TrimPrefix(string(kv.Key), r.keys.all())
		names := map[string]bool{}
		for i := range evs {
			if prefix := r.keys.prefixOf(&evs[i]); prefix != "" {
				names[prefix] = true
			}
		}
		if grown := len(lastOf) + len(names); grown > 120 && batches > 0 {
			break // a transaction takes 128 operations: the rest go next
		}
		for prefix := range names {
			lastOf[prefix] = suffix
		}
		last, removed, batches = string(kv.Key), removed+int64(len(evs)), batches+1
	}
	if batches == 0 {
		return false, nil
	}
	ops := []clientv3.Op{clientv3.OpDelete(r.keys.all(), clientv3.WithRange(last+"\x00"))}
	for prefix, suffix := range lastOf {
		ops = append(ops, clientv3.OpDelete(prefix, clientv3.WithRange(prefix+suffix+"\x00")))
	}
	next := w.cur
	next.Count = max(w.cur.Count-removed, 0)
	if err := w.write(ctx, ops, next); err != nil {
		return false, fmt.Errorf("remove oldest: %w", err)
	}
	return batches == len(resp.Kvs), nil
}
