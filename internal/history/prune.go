package history

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneBatches is how many batches one pruning transaction reads at most.
const pruneBatches = 64

// pruneNames bounds the locks and elections one pruning transaction
// changes: per name a delete of its oldest batches and a write of its
// floor, beside one delete of the timeline's and the cursor and floors'
// puts (etcd takes 128 operations in a transaction); its read reads two
// keys of each.
const pruneNames = 60

// Pruning removes the timeline's oldest batches (t/), and each name's
// part of them (n/), for age (Options.Retention) or for room
// (Options.MaxRecords). Removed for room, a name's newest Options.Floor
// events stay under n/ though the timeline's batch that held them goes:
// the name's floor, so that one tenant's flood of events cannot erase
// another's last grants. A floor record (f/<kind>/<name>/) names the
// principal of the name's newest event; each principal holds at most
// Options.FloorNames floors (a count per principal in floors), so that a
// tenant who makes many names cannot grow the floors without bound: past
// it, its further names get no floor. A floor goes once its newest event
// is older than the retention (sweepFloors), or when the name's newer
// events, still in the timeline, cover it.

// floorRecord is a name's floor: the principal of its newest event, and
// the time of the newest event it keeps.
type floorRecord struct {
	Principal string    `json:"p"`
	Newest    time.Time `json:"t"`
}

// floorKey is the floor record of the name whose n/ prefix is prefix.
func (k keys) floorKey(prefix string) string {
	return k.base + "f/" + strings.TrimPrefix(prefix, k.base+"n/")
}
func (k keys) floors() string { return k.base + "f/" }
func (k keys) counts() string { return k.base + "floors" }
func (k keys) prefixOfFloor(key string) string {
	return k.base + "n/" + strings.TrimPrefix(key, k.floors())
}

// prune removes what is due: the oldest batches, run after run, then the
// floors past the retention.
func (r *Recorder) prune(ctx context.Context, w *writer) error {
	for {
		more, err := r.pruneOldest(ctx, w)
		if err != nil {
			return err
		}
		if !more {
			return r.sweepFloors(ctx, w)
		}
	}
}

// run is one pruning transaction's batches: the last removed of each
// name, for age and for room.
type run struct {
	last            string            // the last batch's t/ key
	removed         int64             // events
	batches         int               // batches
	aged, forRoom   map[string]string // n/ prefix -> suffix of its last batch removed so
	names, maxNames int
}

// pruneOldest removes a run of the oldest batches that are due, and
// reports whether more may be.
func (r *Recorder) pruneOldest(ctx context.Context, w *writer) (bool, error) {
	resp, err := r.cli.Get(ctx, r.keys.all(), clientv3.WithPrefix(), clientv3.WithLimit(pruneBatches))
	if err != nil {
		return false, fmt.Errorf("read oldest: %w", err)
	}
	cutoff := r.now().Add(-r.opts.Retention)
	ru := run{aged: map[string]string{}, forRoom: map[string]string{}, maxNames: pruneNames}
	for _, kv := range resp.Kvs {
		evs, err := decodeBatch(kv.Value)
		if err != nil || len(evs) == 0 {
			continue
		}
		old := evs[len(evs)-1].Time.Before(cutoff)
		if !old && w.cur.Count-ru.removed <= int64(r.opts.MaxRecords) {
			break // neither too old nor too many
		}
		if !ru.add(r.keys, string(kv.Key), evs, old) {
			break // the rest go next
		}
	}
	if ru.batches == 0 {
		return false, nil
	}
	ops, err := r.removeRun(ctx, ru)
	if err != nil {
		return false, err
	}
	next := w.cur
	next.Count = max(w.cur.Count-ru.removed, 0)
	if err := w.write(ctx, ops, next); err != nil {
		return false, fmt.Errorf("remove oldest: %w", err)
	}
	return ru.batches == len(resp.Kvs), nil
}

// add takes the batch at key with its events into the run, unless it
// would change more names than a transaction may (and the run has one).
func (ru *run) add(k keys, key string, evs []Event, old bool) bool {
	suffix := strings.TrimPrefix(key, k.all())
	fresh := map[string]bool{}
	for i := range evs {
		if p := k.prefixOf(&evs[i]); p != "" && ru.aged[p] == "" && ru.forRoom[p] == "" {
			fresh[p] = true
		}
	}
	if ru.names+len(fresh) > ru.maxNames && ru.batches > 0 {
		return false
	}
	ru.names += len(fresh)
	for i := range evs {
		p := k.prefixOf(&evs[i])
		if p == "" {
			continue
		}
		if old {
			ru.aged[p] = suffix
		} else {
			ru.forRoom[p] = suffix
		}
	}
	ru.last, ru.removed, ru.batches = key, ru.removed+int64(len(evs)), ru.batches+1
	return true
}

// removeRun returns the operations that remove ru: the timeline's batches,
// and each name's part of them but its floor.
func (r *Recorder) removeRun(ctx context.Context, ru run) ([]clientv3.Op, error) {
	ops := []clientv3.Op{clientv3.OpDelete(r.keys.all(), clientv3.WithRange(ru.last+"\x00"))}
	ends := map[string]string{} // n/ prefix -> the first key it keeps
	for p, s := range ru.aged {
		ends[p] = p + s + "\x00"
	}
	if r.opts.Floor > 0 && len(ru.forRoom) > 0 {
		floorOps, err := r.keepFloors(ctx, ru, ends)
		if err != nil {
			return nil, err
		}
		ops = append(ops, floorOps...)
	} else {
		for p, s := range ru.forRoom {
			ends[p] = p + s + "\x00"
		}
	}
	for p, end := range ends {
		ops = append(ops, clientv3.OpDelete(p, clientv3.WithRange(end)))
	}
	return ops, nil
}

// keepFloors sets in ends, for each name whose batches ru removes for
// room, the first n/ key it keeps: the oldest that holds one of its newest
// Options.Floor events (or past the run: no floor), and returns the writes
// of the floor records and counts that change.
func (r *Recorder) keepFloors(ctx context.Context, ru run, ends map[string]string) ([]clientv3.Op, error) {
	var reads []clientv3.Op
	var order []string
	for p := range ru.forRoom {
		order = append(order, p)
		reads = append(reads,
			clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(r.opts.Floor))),
			clientv3.OpGet(r.keys.floorKey(p)))
	}
	reads = append(reads, clientv3.OpGet(r.keys.counts()))
	resp, err := r.cli.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read floors: %w", err)
	}
	counts := map[string]int{}
	if kvs := resp.Responses[len(reads)-1].GetResponseRange().Kvs; len(kvs) == 1 {
		if err := json.Unmarshal(kvs[0].Value, &counts); err != nil {
			return nil, fmt.Errorf("read floor counts: %w", err)
		}
	}
	var ops []clientv3.Op
	changed := false
	for i, p := range order {
		last := p + ru.forRoom[p] // the newest n/ key of the run
		keep, newest := floorStart(resp.Responses[2*i].GetResponseRange().Kvs, r.opts.Floor)
		var had *floorRecord
		if kvs := resp.Responses[2*i+1].GetResponseRange().Kvs; len(kvs) == 1 {
			had = &floorRecord{}
			if json.Unmarshal(kvs[0].Value, had) != nil {
				had = &floorRecord{}
			}
		}
		rec := floorRecord{Principal: newest.Principal, Newest: newest.Time}
		switch {
		case keep == "" || keep > last:
			// Its newest events are all past the run: no floor needed.
			ends[p] = maxKey(ends[p], last+"\x00")
			if had != nil {
				ops = append(ops, clientv3.OpDelete(r.keys.floorKey(p)))
				counts[had.Principal]--
				changed = true
			}
			continue
		case had == nil && counts[rec.Principal] >= r.opts.FloorNames:
			ends[p] = maxKey(ends[p], last+"\x00") // past its principal's share
			continue
		}
		ends[p] = maxKey(ends[p], keep)
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		ops = append(ops, clientv3.OpPut(r.keys.floorKey(p), string(b)))
		if had == nil || had.Principal != rec.Principal {
			if had != nil {
				counts[had.Principal]--
			}
			counts[rec.Principal]++
			changed = true
		}
	}
	if changed {
		op, err := countsOp(r.keys, counts)
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// floorStart is the oldest of a name's newest keys (kvs, newest first)
// that holds one of its newest n events: the first key its floor keeps
// ("" if it has none); and its newest event.
func floorStart(kvs []*mvccpb.KeyValue, n int) (string, Event) {
	seen, start := 0, ""
	var newest Event
	for _, kv := range kvs {
		evs, err := decodeBatch(kv.Value)
		if err != nil || len(evs) == 0 {
			continue
		}
		if seen == 0 {
			newest = evs[len(evs)-1]
		}
		seen, start = seen+len(evs), string(kv.Key)
		if seen >= n {
			break
		}
	}
	return start, newest
}

// countsOp writes the floors each principal holds (none left: not named).
func countsOp(k keys, counts map[string]int) (clientv3.Op, error) {
	for p, n := range counts {
		if n <= 0 {
			delete(counts, p)
		}
	}
	b, err := json.Marshal(counts)
	return clientv3.OpPut(k.counts(), string(b)), err
}

func maxKey(a, b string) string {
	if a > b {
		return a
	}
	return b
}

// sweepPages bounds the pages of floor records one sweep reads: the next
// sweep goes on where it stopped, so that with many floors each pruning
// reads a few thousand small keys, and every floor is looked at again
// within hours, not days.
const sweepPages = 10

// sweepFloors removes the floors whose newest event is older than the
// retention: the name's n/ keys up to the cutoff and its record. It reads
// the records a page at a time, from where the last sweep stopped (a
// floor is one key per name, and each principal holds at most FloorNames
// of them).
func (r *Recorder) sweepFloors(ctx context.Context, w *writer) error {
	cutoff := r.now().Add(-r.opts.Retention)
	end := clientv3.GetPrefixRangeEnd(r.keys.floors())
	from := max(r.sweptTo, r.keys.floors())
	for range sweepPages {
		resp, err := r.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pruneNames))
		if err != nil {
			return fmt.Errorf("read floors: %w", err)
		}
		var gone []clientv3.Op
		less := map[string]int{}
		for _, kv := range resp.Kvs {
			var rec floorRecord
			if json.Unmarshal(kv.Value, &rec) == nil && !rec.Newest.Before(cutoff) {
				continue
			}
			p := r.keys.prefixOfFloor(string(kv.Key))
			gone = append(gone, clientv3.OpDelete(p, clientv3.WithRange(p+timeKey(cutoff))), clientv3.OpDelete(string(kv.Key)))
			less[rec.Principal]++
		}
		if len(gone) > 0 {
			if err := r.forget(ctx, w, gone, less); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			r.sweptTo = "" // the next sweep starts again
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		r.sweptTo = from
	}
	return nil
}

// forget runs ops, which remove floors, and lowers their principals'
// counts by less, with the cursor as it is (compared, as every write).
func (r *Recorder) forget(ctx context.Context, w *writer, ops []clientv3.Op, less map[string]int) error {
	resp, err := r.cli.Get(ctx, r.keys.counts())
	if err != nil {
		return fmt.Errorf("read floor counts: %w", err)
	}
	counts := map[string]int{}
	if len(resp.Kvs) == 1 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &counts); err != nil {
			return fmt.Errorf("read floor counts: %w", err)
		}
	}
	for p, n := range less {
		counts[p] -= n
	}
	op, err := countsOp(r.keys, counts)
	if err != nil {
		return err
	}
	if err := w.write(ctx, append(ops, op), w.cur); err != nil {
		return fmt.Errorf("remove old floors: %w", err)
	}
	return nil
}
