package history

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneBatch is how many events one pruning transaction removes at most.
const pruneBatch = 1000

// prune removes the events older than the retention, then the oldest
// events past MaxRecords. Each transaction removes a run of the oldest
// events with one range delete of t/ and one per lock or election among
// them, so the cost is per batch, not per event.
func (r *Recorder) prune(ctx context.Context) error {
	cutoff := r.all() + timeKey(r.now().Add(-r.opts.Retention))
	for {
		n, err := r.pruneOldest(ctx, pruneBatch, cutoff)
		if err != nil || n < pruneBatch {
			break
		}
	}
	for {
		resp, err := r.cli.Get(ctx, r.all(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return fmt.Errorf("count: %w", err)
		}
		over := resp.Count - int64(r.opts.MaxRecords)
		if over <= 0 {
			return nil
		}
		if _, err := r.pruneOldest(ctx, int(min(over, pruneBatch)), clientv3.GetPrefixRangeEnd(r.all())); err != nil {
			return err
		}
	}
}

func (r *Recorder) all() string { return r.keys.all() }

// pruneOldest removes the oldest events, at most n of them and only those
// whose t/ keys are before end, and returns how many it removed.
func (r *Recorder) pruneOldest(ctx context.Context, n int, end string) (int, error) {
	resp, err := r.cli.Get(ctx, r.all(), clientv3.WithRange(end), clientv3.WithLimit(int64(n)))
	if err != nil {
		return 0, fmt.Errorf("read oldest: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	// The last of each name's events among them: every earlier event of
	// that name is among them too (keys sort by time alike in t/ and n/).
	// A transaction takes 128 operations: the batch stops before a 120th
	// name.
	lastOf := map[string]string{}
	last, removed := "", 0
	for _, kv := range resp.Kvs {
		var e Event
		suffix := strings.TrimPrefix(string(kv.Key), r.all())
		if json.Unmarshal(kv.Value, &e) == nil && r.keys.twin(&e, suffix) != "" {
			prefix := r.keys.named(e.Kind, e.Name)
			if _, ok := lastOf[prefix]; !ok && len(lastOf) == 119 {
				break
			}
			lastOf[prefix] = suffix
		}
		last, removed = string(kv.Key), removed+1
	}
	ops := []clientv3.Op{clientv3.OpDelete(r.all(), clientv3.WithRange(last+"\x00"))}
	for prefix, suffix := range lastOf {
		ops = append(ops, clientv3.OpDelete(prefix, clientv3.WithRange(prefix+suffix+"\x00")))
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.cli.Txn(tctx).Then(ops...).Commit(); err != nil {
		return 0, fmt.Errorf("remove oldest: %w", err)
	}
	return removed, nil
}
