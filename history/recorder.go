package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Defaults of Options.
const (
	DefaultRetention  = 7 * 24 * time.Hour
	DefaultMaxRecords = 100_000
)

// Options tune a Recorder.
type Options struct {
	// Retention is how long events are kept (DefaultRetention when zero).
	Retention time.Duration
	// MaxRecords bounds how many events are kept (DefaultMaxRecords when
	// zero); past it the oldest go first.
	MaxRecords int
	// Member names this member on its claim to record.
	Member string
	// PruneEvery is how often old events are removed (30s when zero).
	PruneEvery time.Duration
	// ClaimTTL is the lease of the recording member's claim, in seconds:
	// how long another member waits to take over from one that died
	// (5 when zero).
	ClaimTTL int
}

// Recorder records the history (see the package doc). Run it on every
// member: one records at a time, the others wait to take over.
type Recorder struct {
	cli  *clientv3.Client
	root string
	keys keys
	opts Options
	lg   *zap.Logger
	now  func() time.Time

	recording atomic.Bool  // this member holds the claim
	recorded  atomic.Int64 // events written by this member
	last      atomic.Int64 // the revision recorded last
	// fromNow makes the recorder start at the current revision, not at
	// its cursor (tests: the mechanism switched off).
	fromNow bool
}

// NewRecorder returns a Recorder of the history of the locks and elections
// under root, kept under root+"timeline/".
func NewRecorder(cli *clientv3.Client, root string, opts Options, lg *zap.Logger) *Recorder {
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.MaxRecords <= 0 {
		opts.MaxRecords = DefaultMaxRecords
	}
	if opts.PruneEvery <= 0 {
		opts.PruneEvery = 30 * time.Second
	}
	if opts.ClaimTTL <= 0 {
		opts.ClaimTTL = 5
	}
	return &Recorder{cli: cli, root: root, keys: keys{base: root + "timeline/"}, opts: opts, lg: lg, now: time.Now}
}

// Recording reports whether this member is the one recording now.
func (r *Recorder) Recording() bool { return r.recording.Load() }

// Recorded is how many events this member has written, and the last
// revision it recorded.
func (r *Recorder) Recorded() (events, revision int64) { return r.recorded.Load(), r.last.Load() }

// Run records until ctx ends. Failures are logged and retried.
func (r *Recorder) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.claimAndRecord(ctx)
		if ctx.Err() != nil {
			return
		}
		r.lg.Warn("history: recording stopped; starting again", zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// claimAndRecord waits for this member's turn to record and records until
// the turn or ctx ends.
func (r *Recorder) claimAndRecord(ctx context.Context) error {
	s, err := concurrency.NewSession(r.cli, concurrency.WithTTL(r.opts.ClaimTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	defer func() {
		s.Orphan()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = r.cli.Revoke(cctx, s.Lease())
	}()
	if err := concurrency.NewElection(s, r.keys.writer()).Campaign(ctx, r.opts.Member); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	r.recording.Store(true)
	defer r.recording.Store(false)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // ends with rctx
		select {
		case <-s.Done():
			cancel()
		case <-rctx.Done():
		}
	}()
	return r.record(rctx)
}

// cursor is what the history has recorded: every event of revisions
// before Rev, and the first Seq events of Rev (all of them when Seq is 0).
type cursor struct {
	Rev  int64     `json:"rev"`
	Seq  int       `json:"seq"`
	Time time.Time `json:"time"`
}

// errCursorMoved: another recorder wrote the cursor.
var errCursorMoved = errors.New("history: another member recorded meanwhile")

// record loads the state at the cursor and records from there until ctx
// ends or recording fails.
func (r *Recorder) record(ctx context.Context) error {
	w := &writer{r: r}
	if err := w.readCursor(ctx); err != nil {
		return err
	}
	st := newState(r.root)
	at, skip := w.cur.Rev, w.cur.Seq
	if skip > 0 {
		at-- // the cursor's revision was recorded in part: derive it again
	}
	if w.mod == 0 || r.fromNow {
		at, skip = 0, 0
	}
	// The first write says this recorder is the one: the cursor as it was,
	// or where this recorder starts.
	start := w.cur
	if at == 0 {
		start = cursor{Time: w.cur.Time}
	}
	loaded, err := st.load(ctx, r.cli, at)
	if errors.Is(err, rpctypes.ErrCompacted) {
		if loaded, err = st.load(ctx, r.cli, 0); err == nil {
			w.add(Event{Type: Gap, FromRevision: at + 1, Revision: loaded, Time: w.now(),
				Reason: "etcd compacted these revisions before they were recorded: no member recorded for longer than its compaction window"})
			start, skip = cursor{}, 0
		}
	}
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	if start.Rev == 0 {
		start = cursor{Rev: loaded, Time: w.now()}
	}
	if err := w.commit(ctx, w.pending, start); err != nil {
		return err
	}
	w.pending, w.upTo = nil, start.Rev
	return r.follow(ctx, st, w, loaded, skip)
}

// follow records the revisions after loaded as the watch delivers them;
// the first skip events of the revision after loaded were recorded before.
func (r *Recorder) follow(ctx context.Context, st *state, w *writer, loaded int64, skip int) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := r.cli.Watch(clientv3.WithRequireLeader(wctx), st.electionRoot,
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(st.sessionRoot)), clientv3.WithRev(loaded+1), clientv3.WithProgressNotify())
	prune := time.NewTicker(r.opts.PruneEvery)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-prune.C:
			if err := r.prune(ctx); err != nil {
				r.lg.Warn("history: removing old events failed; trying again later", zap.Error(err))
			}
		case resp, ok := <-wch:
			if !ok {
				return errors.New("history: the watch ended")
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			for i := 0; i < len(resp.Events); {
				rev := resp.Events[i].Kv.ModRevision
				j := i
				for j < len(resp.Events) && resp.Events[j].Kv.ModRevision == rev {
					j++
				}
				evs := st.apply(rev, resp.Events[i:j], w.now())
				if rev == loaded+1 && skip > 0 {
					evs = evs[min(skip, len(evs)):]
				}
				w.add(evs...)
				w.done(rev)
				i = j
			}
			if resp.Header.Revision > w.cur.Rev && len(resp.Events) == 0 {
				w.idle(resp.Header.Revision)
			}
			if err := w.flush(ctx); err != nil {
				return err
			}
		}
	}
}

// writer writes events and the cursor together.
type writer struct {
	r       *Recorder
	cur     cursor // as written
	mod     int64  // the cursor's mod revision (0: none yet)
	pending []Event
	upTo    int64 // every event of revisions up to it is in pending or written
	idleAt  int64 // a revision with nothing to record, to move the cursor to
	wrote   time.Time
}

// maxTxnEvents bounds the events of one transaction (two puts each; etcd
// takes 128 operations by default).
const maxTxnEvents = 60

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

func (w *writer) add(evs ...Event) { w.pending = append(w.pending, evs...) }

// done notes that every event of rev has been added.
func (w *writer) done(rev int64) { w.upTo = rev }

// idle notes that nothing happened up to rev; the cursor moves there when
// nothing else was written for a while, so that a later start need not
// derive again what it would find compacted.
func (w *writer) idle(rev int64) { w.idleAt = rev }

// flush writes the pending events, maxTxnEvents per transaction, each
// with the cursor that covers it, compared with the cursor it read.
func (w *writer) flush(ctx context.Context) error {
	for len(w.pending) > 0 {
		n := min(len(w.pending), maxTxnEvents)
		chunk := w.pending[:n]
		next := cursor{Rev: w.upTo, Time: chunk[n-1].Time}
		if n < len(w.pending) {
			last := chunk[n-1]
			if w.pending[n].Revision == last.Revision {
				next = cursor{Rev: last.Revision, Seq: last.seq + 1, Time: last.Time}
			} else {
				next.Rev = last.Revision
			}
		}
		if err := w.commit(ctx, chunk, next); err != nil {
			return err
		}
		w.pending = w.pending[n:]
	}
	if to := max(w.upTo, w.idleAt); to > w.cur.Rev && w.r.now().Sub(w.wrote) > 5*time.Second {
		return w.commit(ctx, nil, cursor{Rev: to, Time: w.cur.Time})
	}
	return nil
}

// commit writes evs and the cursor next, if the cursor is still the one
// this writer wrote or read last.
func (w *writer) commit(ctx context.Context, evs []Event, next cursor) error {
	ops := make([]clientv3.Op, 0, 2*len(evs)+1)
	for i := range evs {
		e := &evs[i]
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		suffix := e.suffix()
		ops = append(ops, clientv3.OpPut(w.r.keys.all()+suffix, string(b)))
		if twin := w.r.keys.twin(e, suffix); twin != "" {
			ops = append(ops, clientv3.OpPut(twin, string(b)))
		}
	}
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
	w.r.recorded.Add(int64(len(evs)))
	w.r.last.Store(next.Rev)
	return nil
}
