package history

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// writer writes events in batches, each with the cursor that covers it.
type writer struct {
	r       *Recorder
	cur     cursor // as written
	mod     int64  // the cursor's mod revision (0: none yet)
	pending []Event
	upTo    int64 // every event of revisions up to it is in pending or written
	wrote   time.Time
	// ops's buffers, used again for every batch: the batch's JSON
	// array, where each event's encoding ends in it, the events of each
	// name (by n/ prefix) in the order names first appear, one name's
	// array, and the last compressed value.
	all     []byte
	ends    []int
	byName  map[string][]int
	order   []string
	one     []byte
	scratch []byte
}

// batchLimits bound one batch: one t/ key and one n/ key per name in it,
// written in one transaction with the cursor (etcd takes 128 operations
// and 1.5 MiB by default).
type batchLimits struct {
	events int // events in a batch
	names  int // distinct locks and elections in a batch
	// bytes bounds the batch's stored values, all its keys together (0:
	// no bound). A batch over it is written as two, and so on.
	bytes int
}

// defaultBatch: a batch of 4,000 lock events is about 300 KB compressed
// (1.5 MB of JSON, written twice: by time and by name); 4,000 events of
// the longest names, owners and hosts, which compress less, would be over
// etcd's request limit (1.5 MiB): a recorder would fail on that batch for
// ever. The byte bound (1 MiB) keeps every batch under it, whatever the
// fields hold. Fewer, larger batches cost the member less: each key of the
// history is one more in etcd's index, which every lock operation
// searches.
var defaultBatch = batchLimits{events: 4000, names: 120, bytes: 1 << 20}

// flushDelay is how long events wait for more to share their batch: under
// load one batch (one transaction) carries thousands of events; alone, an
// event is written this long after etcd committed it.
const flushDelay = 250 * time.Millisecond

func (w *writer) readCursor(ctx context.Context) error {
	resp, err := w.r.cli.Get(ctx, w.r.keys.cursor())
	if err != nil {
		return fmt.Errorf("read cursor: %w", err)
	}
	if len(resp.Kvs) == 1 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &w.cur); err != nil {
			return fmt.Errorf("read cursor: %w", err)
		}
		w.mod = resp.Kvs[0].ModRevision
	}
	return nil
}

// now is the time of the next events: never before the last recorded.
func (w *writer) now() time.Time {
	t := w.r.now().UTC()
	if !t.After(w.cur.Time) {
		t = w.cur.Time.Add(time.Microsecond)
	}
	return t
}

// add queues the events of rev, and notes that every event of revisions
// up to rev is now queued or written.
func (w *writer) add(rev int64, evs []Event) {
	w.pending = append(w.pending, evs...)
	w.upTo = max(w.upTo, rev)
}

// flush writes the pending events, a batch per transaction. With nothing
// to write, it moves the cursor up to the revisions seen once every 5 s,
// so that a later start need not derive again what etcd may have
// compacted by then.
func (w *writer) flush(ctx context.Context) error {
	// The events written leave pending; what is left moves to the front,
	// so that pending keeps its array from batch to batch.
	written := 0
	defer func() { w.pending = append(w.pending[:0], w.pending[written:]...) }()
	for written < len(w.pending) {
		rest := w.pending[written:]
		n := batchLen(rest, w.r.batch, w.r.keys)
		ops, size := w.ops(rest[:n])
		for w.r.batch.bytes > 0 && size > w.r.batch.bytes && n > 1 {
			n = (n + 1) / 2
			ops, size = w.ops(rest[:n])
		}
		last := rest[n-1]
		next := cursor{Rev: w.upTo, Time: last.Time}
		if n < len(rest) {
			next.Rev = last.Revision
			if rest[n].Revision == last.Revision {
				next.Seq = last.seq + 1 // the revision goes on in the next batch
			}
		}
		if err := w.commit(ctx, ops, n, next); err != nil {
			return err
		}
		written += n
	}
	if w.upTo > w.cur.Rev && w.r.now().Sub(w.wrote) > 5*time.Second {
		return w.commit(ctx, nil, 0, cursor{Rev: w.upTo, Time: w.cur.Time})
	}
	return nil
}

// batchLen is how many of evs the next batch takes at most under lim (the
// byte bound may halve it).
func batchLen(evs []Event, lim batchLimits, k keys) int {
	names := map[string]bool{}
	for i := range evs {
		if i == lim.events {
			return i
		}
		if prefix := k.prefixOf(&evs[i]); prefix != "" && !names[prefix] {
			if len(names) == lim.names {
				return i
			}
			names[prefix] = true
		}
	}
	return len(evs)
}

// ops are the puts of evs as one batch: its t/ key, and an n/ key per
// name with that name's events; size is their values' bytes.
func (w *writer) ops(evs []Event) (ops []clientv3.Op, size int) {
	if len(evs) == 0 {
		return nil, 0
	}
	// Each event is encoded once, into the batch's array; each name's
	// array is joined from those encodings. The buffers are the writer's,
	// used again for every batch.
	suffix := evs[0].suffix()
	w.all = append(w.all[:0], '[')
	w.ends = w.ends[:0]
	clear(w.byName)
	w.order = w.order[:0]
	for i := range evs {
		if i > 0 {
			w.all = append(w.all, ',')
		}
		w.all = evs[i].appendJSON(w.all)
		w.ends = append(w.ends, len(w.all))
		if prefix := w.r.keys.prefixOf(&evs[i]); prefix != "" {
			if _, ok := w.byName[prefix]; !ok {
				w.order = append(w.order, prefix)
			}
			w.byName[prefix] = append(w.byName[prefix], i)
		}
	}
	w.all = append(w.all, ']')
	put := func(key string, arr []byte) {
		v := w.encode(arr)
		size += len(v)
		ops = append(ops, clientv3.OpPut(key, v))
	}
	put(w.r.keys.all()+suffix, w.all)
	for _, prefix := range w.order {
		w.one = append(w.one[:0], '[')
		for n, i := range w.byName[prefix] {
			if n > 0 {
				w.one = append(w.one, ',')
			}
			start := 1 // after the array's '['
			if i > 0 {
				start = w.ends[i-1] + 1 // after the ','
			}
			w.one = append(w.one, w.all[start:w.ends[i]]...)
		}
		w.one = append(w.one, ']')
		put(prefix+suffix, w.one)
	}
	return ops, size
}

// commit writes a batch of n events (ops) and the cursor next, if the
// cursor is still the one this writer wrote or read last.
func (w *writer) commit(ctx context.Context, ops []clientv3.Op, n int, next cursor) error {
	next.Count = w.cur.Count + int64(n)
	if err := w.write(ctx, ops, next); err != nil {
		return err
	}
	w.r.recorded.Add(int64(n))
	w.r.last.Store(next.Rev)
	return nil
}

// write runs ops with a put of the cursor next, if the cursor is still the
// one this writer wrote or read last (errCursorMoved if not).
func (w *writer) write(ctx context.Context, ops []clientv3.Op, next cursor) error {
	cb, err := json.Marshal(next)
	if err != nil {
		return err
	}
	ops = append(ops, clientv3.OpPut(w.r.keys.cursor(), string(cb)))
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := w.r.cli.Txn(tctx).If(clientv3.Compare(clientv3.ModRevision(w.r.keys.cursor()), "=", w.mod)).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !resp.Succeeded {
		return errCursorMoved
	}
	w.cur, w.mod, w.wrote = next, resp.Header.Revision, w.r.now()
	return nil
}

// encode is the stored value of a batch (or a name's part of it) whose
// JSON array is arr.
func (w *writer) encode(arr []byte) string {
	if w.r.plain {
		return string(arr)
	}
	w.scratch = encodeBatch(w.scratch, arr)
	return string(w.scratch)
}
