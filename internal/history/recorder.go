package history

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"
)

// Defaults of Options.
const (
	DefaultRetention  = 7 * 24 * time.Hour
	DefaultMaxRecords = 100_000
	DefaultFloor      = 10
	DefaultFloorNames = 5_000
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
	// Floor is how many of each lock's or election's newest events are
	// kept past MaxRecords (DefaultFloor when zero; negative: none), up to
	// FloorNames names per principal: a flood of one tenant's events
	// removes the oldest of the timeline of every name, not another
	// tenant's last grants. Floors go with the retention.
	Floor int
	// FloorNames bounds the floors each principal holds
	// (DefaultFloorNames when zero): the principal of a name's newest
	// event; past it, further names of that principal keep no floor.
	FloorNames int
	// PruneEvery is how often old events are removed (30s when zero).
	PruneEvery time.Duration
	// ClaimTTL is the lease of the recording member's claim, in seconds:
	// how long another member waits to take over from one that died
	// (5 when zero).
	ClaimTTL int
	// Local is this member's own etcd store, when the member runs one
	// (coordd's embedded etcd): the recorder then reads etcd's events from
	// it in place, draining them every few milliseconds, instead of
	// through a gRPC watch. A watch wakes half a dozen goroutines for
	// every revision, just as the grant that made it answers its client;
	// on two CPUs that slowed a lone client's lock cycle by about 10 %
	// (go run ./bench -only history-cost). Nil when etcd runs elsewhere.
	Local LocalStore
}

// LocalStore is a member's etcd store (etcd's mvcc.WatchableKV).
type LocalStore interface {
	NewWatchStream() mvcc.WatchStream
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
	batch   batchLimits
	// plain writes batches uncompressed (tests: events that do not
	// compress, against the batch's byte bound).
	plain bool
	// sweptTo is where the next sweep of floors goes on ("": from the
	// first); the recording goroutine's alone.
	sweptTo string
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
	if opts.Floor == 0 {
		opts.Floor = DefaultFloor
	}
	if opts.FloorNames <= 0 {
		opts.FloorNames = DefaultFloorNames
	}
	if opts.ClaimTTL <= 0 {
		opts.ClaimTTL = 5
	}
	// Pruning removes whole batches: a batch is at most a quarter of what
	// is kept, so that at least three quarters of it stay.
	batch := defaultBatch
	batch.events = max(min(batch.events, opts.MaxRecords/4), 1)
	return &Recorder{cli: cli, root: root, keys: keys{base: root + "timeline/"}, opts: opts, lg: lg, now: time.Now, batch: batch}
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
		// Revoking lets another member take over at once; if it cannot
		// (no quorum while the cluster stops), the claim's lease ends
		// within ClaimTTL anyway, so a stopping member waits little.
		s.Orphan()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
		defer cancel()
		_, _ = r.cli.Revoke(cctx, s.Lease())
	}()
	if err := r.claim(ctx, s.Lease()); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
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

// claim takes the recording turn: the claim key, bound to the claim's
// lease, once no member holds it; until then it watches the key go. Every
// call is bound to ctx, so a stopping member leaves at once (etcd's
// election recipe, used before, resigns on cancel with the client's own
// context, which a cluster stopping without quorum held for etcd's whole
// request timeout). Safety does not rest on the claim: every batch is
// written with a compare of the cursor.
func (r *Recorder) claim(ctx context.Context, lease clientv3.LeaseID) error {
	key := r.keys.writer() + "/claim"
	for {
		resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, r.opts.Member, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && clientv3.LeaseID(kvs[0].Lease) == lease {
			return nil // ours: an earlier attempt's answer was lost
		}
		wctx, cancel := context.WithCancel(ctx)
		for wr := range r.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut()) {
			if wr.Err() != nil || len(wr.Events) > 0 { // gone (or the watch failed): try again
				break
			}
		}
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// cursor is what the history has recorded: every event of revisions
// before Rev, and the first Seq events of Rev (all of them when Seq is 0).
type cursor struct {
	Rev  int64     `json:"rev"`
	Seq  int       `json:"seq"`
	Time time.Time `json:"time"`
	// Count is how many events the history holds.
	Count int64 `json:"count"`
}

// errCursorMoved: another recorder wrote the cursor.
var errCursorMoved = errors.New("history: another member recorded meanwhile")

// record loads the state at the cursor and records from there until ctx
// ends or recording fails.
func (r *Recorder) record(ctx context.Context) error {
	w := &writer{r: r, byName: map[string][]int{}}
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
			w.pending = append(w.pending, Event{Type: Gap, FromRevision: at + 1, Revision: loaded, Time: w.now(),
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
	ops, _ := w.ops(w.pending) // a gap event, or nothing
	if err := w.commit(ctx, ops, len(w.pending), start); err != nil {
		return err
	}
	w.pending, w.upTo = nil, start.Rev
	r.recording.Store(true) // from its first write on
	return r.follow(ctx, st, w, loaded, skip)
}

// follow records the revisions after loaded as etcd delivers them; the
// first skip events of the revision after loaded were recorded before.
// Events come from one of two feeds: this member's store, drained when
// its timer fires (Options.Local), or a watch through etcd's gRPC API.
func (r *Recorder) follow(ctx context.Context, st *state, w *writer, loaded int64, skip int) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from, end := st.electionRoot, clientv3.GetPrefixRangeEnd(st.sessionRoot)
	var wch clientv3.WatchChan
	var local *localFeed
	if r.opts.Local != nil {
		var err error
		if local, err = newLocalFeed(wctx, r.opts.Local, from, end, loaded+1); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		defer local.close()
	} else {
		wch = r.cli.Watch(clientv3.WithRequireLeader(wctx), from,
			clientv3.WithRange(end), clientv3.WithRev(loaded+1), clientv3.WithProgressNotify())
	}
	ap := applier{st: st, w: w, first: loaded + 1, skip: skip}
	prune := time.NewTicker(r.opts.PruneEvery)
	defer prune.Stop()
	var flushAt <-chan time.Time // armed while events wait to be written
	// batchWaits arms flushAt when events wait: up to flushDelay for more
	// to share their batch. A full batch goes at once.
	batchWaits := func() bool {
		if len(w.pending) == 0 || len(w.pending) >= w.r.batch.events {
			return false
		}
		if flushAt == nil {
			flushAt = time.After(flushDelay)
		}
		return true
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-prune.C:
			if err := r.prune(ctx, w); errors.Is(err, errCursorMoved) {
				return err
			} else if err != nil {
				r.lg.Warn("history: removing old events failed; trying again later", zap.Error(err))
			}
			local.requestProgress() // the cursor moves on while nothing happens
			continue
		case <-flushAt:
		case <-local.due():
			got, err := local.drain(ap.apply, w)
			if err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			if !got || batchWaits() {
				continue
			}
		case resp, ok := <-wch:
			if !ok {
				return errors.New("history: the watch ended")
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			ap.apply(resp.Events)
			if len(resp.Events) == 0 {
				w.add(resp.Header.Revision, nil) // nothing happened up to it
			}
			if batchWaits() {
				continue
			}
		}
		flushAt = nil
		if err := w.flush(ctx); err != nil {
			return err
		}
	}
}

// applier records a feed's events, revision by revision; the first skip
// events of revision first were recorded before.
type applier struct {
	st    *state
	w     *writer
	first int64
	skip  int
}

func (a *applier) apply(evs []*clientv3.Event) {
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		j := i
		for j < len(evs) && evs[j].Kv.ModRevision == rev {
			j++
		}
		out := a.st.apply(rev, evs[i:j], a.w.now())
		if rev == a.first && a.skip > 0 {
			out = out[min(a.skip, len(out)):]
		}
		a.w.add(rev, out)
		i = j
	}
}

// How often the recorder drains a local feed: while events come, and
// after a drain that found none. etcd holds 128 responses for a watcher
// (a revision each, while the watcher keeps up) before it sets the
// watcher aside and sends it the rest in batches.
const (
	localPollBusy = 5 * time.Millisecond
	localPollIdle = 50 * time.Millisecond
)

// localFeed is a watch on a member's own store. Nothing waits on its
// channel: etcd's send of each revision readies no goroutine, and the
// recorder takes what came when the feed is due. A nil feed is never due.
type localFeed struct {
	ws    mvcc.WatchStream
	id    mvcc.WatchID
	timer *time.Timer
	evs   []*clientv3.Event // drain's scratch
}

func newLocalFeed(ctx context.Context, s LocalStore, key, end string, from int64) (*localFeed, error) {
	ws := s.NewWatchStream()
	id, err := ws.Watch(ctx, mvcc.WatchID(clientv3.AutoWatchID), []byte(key), []byte(end), from)
	if err != nil {
		ws.Close()
		return nil, err
	}
	return &localFeed{ws: ws, id: id, timer: time.NewTimer(localPollBusy)}, nil
}

// due fires when the feed is to be drained.
func (f *localFeed) due() <-chan time.Time {
	if f == nil {
		return nil
	}
	return f.timer.C
}

// drain gives apply the events of the responses that came since the
// last drain (up to a batch's worth, so that a flush comes between), and w
// the revision of a progress response; it reports whether any came.
func (f *localFeed) drain(apply func([]*clientv3.Event), w *writer) (got bool, err error) {
	defer func() {
		if got {
			f.timer.Reset(localPollBusy)
		} else {
			f.timer.Reset(localPollIdle)
		}
	}()
	for len(w.pending) < w.r.batch.events {
		select {
		case resp, ok := <-f.ws.Chan():
			if !ok {
				return got, errors.New("history: the watch ended")
			}
			if resp.CompactRevision != 0 {
				return got, rpctypes.ErrCompacted
			}
			got = true
			if len(resp.Events) == 0 {
				w.add(resp.Revision, nil) // a progress response: nothing happened up to it
				continue
			}
			f.evs = f.evs[:0]
			for _, ev := range resp.Events {
				f.evs = append(f.evs, (*clientv3.Event)(ev))
			}
			apply(f.evs)
		default:
			return got, nil
		}
	}
	return got, nil
}

func (f *localFeed) requestProgress() {
	if f != nil {
		f.ws.RequestProgress(f.id)
	}
}

func (f *localFeed) close() {
	f.timer.Stop()
	f.ws.Close()
}
