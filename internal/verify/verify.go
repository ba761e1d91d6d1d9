// Package verify checks a running coordd cluster's mutual exclusion live:
// for a bounded time, concurrent clients (lock holders and election
// candidates, each with its own session) take the lock or lead the
// election over and over, write their token to a fenced key while they
// hold it, and once more after they let go (a late write, as a paused
// holder would make, which the fence must refuse). The recorded history
// and the fenced keys' applied writes are then checked with
// fencing/histcheck's checkers: linearizability (porcupine), the order of
// the applied writes' tokens, and overlaps of the holders' own views.
//
// It uses names of its own under Prefix (default "coordd-verify/", then a
// random run id), so it never touches anyone else's locks, elections or
// keys, and cleans up after itself: its sessions are closed and its
// fenced keys deleted. Its load is bounded: at most Rate grants per
// second per kind (default 20), each with three fenced writes, from
// Lockers + Candidates sessions (default 3 + 2).
//
// A pass is evidence, not proof: it covers the operations made during the
// run. A fault that happens meanwhile (a member killed, a partition) is
// part of the test; its fail-over shows as the longest gap between
// grants.
package verify

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/histcheck"
)

// SabotageUnfenced has the clients write to an unfenced store (a config
// namespace under Prefix, published without any check) instead of the
// fenced KV: their late writes land, and the checks must fail. It shows
// that verify catches a broken fence.
const SabotageUnfenced = "unfenced"

// Options configure a run; zero values take the defaults.
type Options struct {
	Duration   time.Duration // how long clients take grants (default 30s)
	Lockers    int           // lock clients (default 3)
	Candidates int           // election candidates (default 2)
	TTL        time.Duration // each client's session TTL (default 5s)
	Hold       time.Duration // how long a grant is held, writing (default 20ms)
	Rate       float64       // grants per second per kind, at most (default 20)
	Prefix     string        // names are Prefix + a run id + "/..." (default "coordd-verify/")
	Sabotage   string        // "" or SabotageUnfenced
	// Timeout bounds the linearizability check (default 1m); past it the
	// verdict is inconclusive, a failure.
	Timeout time.Duration
}

// KindReport is what one kind of client did and saw.
type KindReport struct {
	Grants          int
	GrantP50        time.Duration // from the call to the grant
	GrantP99        time.Duration
	Writes          int           // fenced writes made while holding
	Refused         int           // of those, refused as stale (a grant that ended unseen)
	Unknown         int           // no answer: applied or not
	LateWrites      int           // writes after letting go, with the old token
	LateRefused     int           // of those, refused as stale: the fence at work
	Applied         int           // writes the store applied (read back)
	LongestGap      time.Duration // the longest time without a grant: a fail-over, if a fault happened
	Errors          map[string]int
	SessionsStarted int
}

// Report is a run's verdict and figures.
type Report struct {
	Passed     bool
	Name       string // the run's prefix
	Started    time.Time
	Duration   time.Duration
	Lock       KindReport
	Election   KindReport
	Violations []histcheck.Violation
	Sabotage   string
	// Leftovers is what cleaning up could not remove ("" when it all was).
	Leftovers string
}

// Run runs the clients for o.Duration, then checks their history. The
// error is for a run that could not be made (no daemon answered, the
// policy refuses the names); a run that finds violations returns a
// Report with Passed false and no error.
func Run(ctx context.Context, c *clientlib.Client, o Options) (Report, error) {
	o = withDefaults(o)
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	r := &run{c: c, o: o, name: o.Prefix + hex.EncodeToString(id) + "/"}
	return r.run(ctx)
}

func withDefaults(o Options) Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Duration, 30*time.Second)
	def(&o.TTL, 5*time.Second)
	def(&o.Hold, 20*time.Millisecond)
	def(&o.Timeout, time.Minute)
	if o.Lockers <= 0 && o.Candidates <= 0 {
		o.Lockers, o.Candidates = 3, 2
	}
	if o.Rate <= 0 {
		o.Rate = 20
	}
	if o.Prefix == "" {
		o.Prefix = "coordd-verify/"
	}
	return o
}

type run struct {
	c    *clientlib.Client
	o    Options
	name string

	// latest is the newest grant's token per kind: a late write waits for
	// a newer grant than its own, as a paused holder's comes after
	// someone else took over.
	latest map[string]*atomic.Int64

	mu   sync.Mutex
	recs []histcheck.Record
	errs map[string]map[string]int // kind -> message -> count
	sess map[string]int            // kind -> sessions started
}

func (r *run) lockName() string         { return r.name + "lock" }
func (r *run) electionName() string     { return r.name + "election" }
func (r *run) key(kind string) string   { return r.name + kind + "-value" }
func (r *run) namespace() string        { return r.name + "unfenced" }
func (r *run) add(rec histcheck.Record) { r.mu.Lock(); r.recs = append(r.recs, rec); r.mu.Unlock() }
func now() int64                        { return time.Now().UnixNano() }
func (r *run) sessionStarted(k string)  { r.mu.Lock(); r.sess[k]++; r.mu.Unlock() }

func (r *run) fail(kind string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs[kind] == nil {
		r.errs[kind] = map[string]int{}
	}
	r.errs[kind][err.Error()]++
}

func (r *run) run(ctx context.Context) (Report, error) {
	r.errs, r.sess = map[string]map[string]int{}, map[string]int{}
	r.latest = map[string]*atomic.Int64{histcheck.KindLock: {}, histcheck.KindElection: {}}
	rep := Report{Name: r.name, Started: time.Now(), Sabotage: r.o.Sabotage}
	// Fail early, with the reason, if the names cannot be used at all.
	probe, err := r.c.NewSession(ctx, clientlib.WithTTL(r.o.TTL), clientlib.WithOwner("coordd-verify"))
	if err != nil {
		return rep, fmt.Errorf("verify: creating a session: %w", err)
	}
	defer func() { r.cleanUp(&rep, probe) }()
	l, err := probe.TryLock(ctx, r.lockName())
	if err != nil {
		return rep, fmt.Errorf("verify: taking %s: %w", r.lockName(), err)
	}
	if err := l.Release(ctx); err != nil {
		return rep, fmt.Errorf("verify: releasing %s: %w", r.lockName(), err)
	}
	stopFollowing, err := r.follow(ctx)
	if err != nil {
		return rep, err
	}

	wctx, cancel := context.WithTimeout(ctx, r.o.Duration)
	defer cancel()
	limits := map[string]*rate.Limiter{
		histcheck.KindLock:     rate.NewLimiter(rate.Limit(r.o.Rate), 1),
		histcheck.KindElection: rate.NewLimiter(rate.Limit(r.o.Rate), 1),
	}
	var wg sync.WaitGroup
	for i := range r.o.Lockers {
		wg.Go(func() { r.client(wctx, histcheck.KindLock, fmt.Sprintf("lock-%d", i), limits[histcheck.KindLock]) })
	}
	for i := range r.o.Candidates {
		wg.Go(func() {
			r.client(wctx, histcheck.KindElection, fmt.Sprintf("candidate-%d", i), limits[histcheck.KindElection])
		})
	}
	wg.Wait()
	rep.Duration = time.Since(rep.Started)
	writes, err := stopFollowing()
	if err != nil {
		return rep, err
	}
	r.check(&rep, writes)
	return rep, ctx.Err()
}

// client is one lock holder or candidate: it takes the grant, writes its
// token over Hold, lets go, and writes once more with the old token,
// until ctx ends; every step is recorded.
func (r *run) client(ctx context.Context, kind, id string, limit *rate.Limiter) {
	var sess *clientlib.Session
	defer func() {
		if sess != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = sess.Close(cctx) // its grants go with it
			cancel()
		}
	}()
	for ctx.Err() == nil {
		if err := limit.Wait(ctx); err != nil {
			return
		}
		if sess == nil || sess.Err() != nil {
			s, err := r.c.NewSession(ctx, clientlib.WithTTL(r.o.TTL), clientlib.WithOwner("coordd-verify-"+id))
			if err != nil {
				if ctx.Err() == nil {
					r.fail(kind, err)
				}
				continue
			}
			sess = s
			r.sessionStarted(kind)
			context.AfterFunc(s.Context(), func() {
				t := now()
				r.add(histcheck.Record{Worker: id, Kind: kind, Op: histcheck.OpSessionEnd, Session: s.ID(), Call: t, Return: t, Err: fmt.Sprint(context.Cause(s.Context()))})
			})
		}
		r.cycle(ctx, kind, id, sess)
	}
}

type holding interface {
	Context() context.Context
}

func (r *run) cycle(ctx context.Context, kind, id string, sess *clientlib.Session) {
	call := now()
	var h holding
	var token int64
	var giveUp func(context.Context) error
	var put func(context.Context, []byte) error
	var err error
	if kind == histcheck.KindLock {
		var l *clientlib.Lock
		if l, err = sess.Lock(ctx, r.lockName()); err == nil {
			h, token, giveUp = l, int64(l.Token()), l.Release
			put = func(ctx context.Context, v []byte) error { _, err := l.Put(ctx, r.key(kind), v); return err }
		}
	} else {
		var l *clientlib.Leadership
		if l, err = sess.Campaign(ctx, r.electionName(), id); err == nil {
			h, token, giveUp = l, int64(l.Term()), l.Resign
			put = func(ctx context.Context, v []byte) error { _, err := l.Put(ctx, r.key(kind), v); return err }
		}
	}
	rec := histcheck.Record{Worker: id, Kind: kind, Session: sess.ID(), Op: histcheck.OpAcquire, Call: call, Return: now()}
	if err != nil {
		if ctx.Err() == nil {
			rec.Err = err.Error()
			r.add(rec)
			r.fail(kind, err)
		}
		return
	}
	rec.Token = token
	r.add(rec)
	storeMax(r.latest[kind], token)
	if r.o.Sabotage == SabotageUnfenced {
		put = func(ctx context.Context, v []byte) error {
			_, err := r.c.ConfigCenter().Put(ctx, r.namespace(), kind, string(v), clientlib.PublishOptions{Author: "coordd-verify"})
			return err
		}
	}

	start := now()
	var lostAt atomic.Int64
	stop := context.AfterFunc(h.Context(), func() { lostAt.Store(now()) })
	defer stop()
	const writes = 2
	for i := range writes {
		r.write(ctx, kind, id, token, put, false)
		if i < writes-1 {
			sleep(ctx, r.o.Hold/writes)
		}
	}
	// The holder's own view: until now, its loss, or the session's local
	// deadline, whichever came first.
	end := min(now(), sess.Deadline().UnixNano())
	why := ""
	if at := lostAt.Load(); at != 0 && at < end {
		end, why = at, fmt.Sprint(context.Cause(h.Context()))
	}
	r.add(histcheck.Record{Worker: id, Kind: kind, Session: sess.ID(), Op: histcheck.OpView, Token: token, Call: start, Return: end, Err: why})
	// Let go while the session lives (a failed release is repeated).
	rctx, cancel := context.WithCancel(sess.Context())
	defer cancel()
	for rctx.Err() == nil {
		err := giveUp(rctx)
		if err == nil || errors.Is(err, clientlib.ErrNotHolder) || errors.Is(err, clientlib.ErrNotLeader) {
			break
		}
		sleep(rctx, 50*time.Millisecond)
	}
	// A late write, as a holder paused past its grant would make: once
	// someone else was granted (and wrote), or after a while when nobody
	// else wants it; the fence must refuse it.
	wait := time.Now().Add(2*time.Duration(float64(time.Second)/r.o.Rate) + r.o.Hold)
	for r.latest[kind].Load() <= token && time.Now().Before(wait) && ctx.Err() == nil {
		sleep(ctx, time.Millisecond)
	}
	sleep(ctx, r.o.Hold/2)
	r.write(context.WithoutCancel(ctx), kind, id, token, put, true)
}

// putTimeout bounds one write, as a careful client bounds every call.
const putTimeout = 2 * time.Second

func (r *run) write(ctx context.Context, kind, id string, token int64, put func(context.Context, []byte) error, late bool) {
	pctx, cancel := context.WithTimeout(ctx, putTimeout)
	defer cancel()
	rec := histcheck.Record{Worker: id, Kind: kind, Op: histcheck.OpPut, Token: token, Call: now()}
	if late {
		rec.Err = "late"
	}
	err := put(pctx, []byte(strconv.FormatInt(token, 10)))
	rec.Return = now()
	switch {
	case err == nil:
		rec.Result = histcheck.ResultOK
	case errors.Is(err, clientlib.ErrStaleToken):
		rec.Result = histcheck.ResultStale
	default:
		rec.Result = histcheck.ResultUnknown
		if ctx.Err() == nil { // not the run's end
			r.fail(kind, err)
		}
	}
	r.add(rec)
}

// storeMax raises a to v unless it holds more already.
func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if cur >= v || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// follow reads every write applied to the fenced keys (or, sabotaged, to
// the unfenced namespace) from now on, until the function it returns is
// called; that returns the writes per kind, in the store's order.
func (r *run) follow(ctx context.Context) (stop func() (map[string][]histcheck.Write, error), err error) {
	if r.o.Sabotage == SabotageUnfenced {
		return func() (map[string][]histcheck.Write, error) { return r.unfencedWrites(ctx) }, nil
	}
	page, err := r.c.KV().List(ctx, r.name, clientlib.ListOptions{PageSize: 1, KeysOnly: true})
	if err != nil {
		return nil, fmt.Errorf("verify: reading %s: %w", r.name, err)
	}
	rev := page.Revision
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	out := map[string][]histcheck.Write{}
	var mu sync.Mutex
	var werr error
	last := rev
	done := make(chan struct{})
	go func() {
		defer close(done)
		for fctx.Err() == nil {
			w := r.c.KV().Watch(fctx, r.name, last+1)
			for ev := range w.Events() {
				mu.Lock()
				last = max(last, ev.KV.ModRevision)
				if !ev.Deleted {
					for _, kind := range []string{histcheck.KindLock, histcheck.KindElection} {
						if ev.KV.Key == r.key(kind) {
							out[kind] = append(out[kind], histcheck.Write{Revision: ev.KV.ModRevision, Value: string(ev.KV.Value)})
						}
					}
				}
				mu.Unlock()
			}
			if err := w.Err(); err != nil && fctx.Err() == nil {
				if errors.Is(err, clientlib.ErrCompacted) {
					mu.Lock()
					werr = fmt.Errorf("verify: the fenced keys' history was compacted while it was read (%w): the write order cannot be checked", err)
					mu.Unlock()
					return
				}
				sleep(fctx, 100*time.Millisecond) // broken stream: resume after the last revision seen
			}
		}
	}()
	stop = func() (map[string][]histcheck.Write, error) {
		// Every write made is in the watch once it has passed the keys'
		// latest revisions.
		page, err := r.c.KV().List(ctx, r.name, clientlib.ListOptions{KeysOnly: true})
		if err != nil {
			cancel()
			<-done
			return nil, fmt.Errorf("verify: reading %s: %w", r.name, err)
		}
		want := int64(0)
		for _, kv := range page.KVs {
			want = max(want, kv.ModRevision)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			caught, e := last >= want, werr
			mu.Unlock()
			if caught || e != nil {
				break
			}
			if time.Now().After(deadline) {
				mu.Lock()
				werr = fmt.Errorf("verify: the watch of the fenced keys did not reach revision %d within 30s", want)
				mu.Unlock()
				break
			}
			sleep(ctx, 20*time.Millisecond)
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(out), werr
	}
	return stop, nil
}

// unfencedWrites reads the sabotaged namespace's releases, oldest first.
func (r *run) unfencedWrites(ctx context.Context) (map[string][]histcheck.Write, error) {
	var all []clientlib.ConfigRelease
	before := int64(0)
	for {
		page, err := r.c.ConfigCenter().Releases(ctx, r.namespace(), before, 100)
		if err != nil {
			return nil, fmt.Errorf("verify: reading %s's releases: %w", r.namespace(), err)
		}
		all = append(all, page...)
		if len(page) < 100 {
			break
		}
		before = page[len(page)-1].Number
	}
	slices.Reverse(all)
	out := map[string][]histcheck.Write{}
	for _, rel := range all {
		for _, ch := range rel.Changes {
			if ch.New != nil {
				out[ch.Key] = append(out[ch.Key], histcheck.Write{Revision: rel.Revision, Value: *ch.New})
			}
		}
	}
	return out, nil
}

func (r *run) check(rep *Report, writes map[string][]histcheck.Write) {
	r.mu.Lock()
	recs := slices.Clone(r.recs)
	r.mu.Unlock()
	slices.SortStableFunc(recs, func(a, b histcheck.Record) int { return cmp.Compare(a.Call, b.Call) })
	for _, kind := range []string{histcheck.KindLock, histcheck.KindElection} {
		kr := KindReport{Applied: len(writes[kind]), Errors: r.errs[kind], SessionsStarted: r.sess[kind]}
		var waits []time.Duration
		var grantTimes []int64
		for _, rec := range recs {
			if rec.Kind != kind {
				continue
			}
			switch {
			case rec.Op == histcheck.OpAcquire && rec.Token > 0:
				kr.Grants++
				waits = append(waits, time.Duration(rec.Return-rec.Call))
				grantTimes = append(grantTimes, rec.Return)
			case rec.Op == histcheck.OpPut && rec.Err == "late":
				kr.LateWrites++
				if rec.Result == histcheck.ResultStale {
					kr.LateRefused++
				}
			case rec.Op == histcheck.OpPut:
				kr.Writes++
				switch rec.Result {
				case histcheck.ResultStale:
					kr.Refused++
				case histcheck.ResultUnknown:
					kr.Unknown++
				}
			}
		}
		kr.GrantP50, kr.GrantP99 = percentile(waits, 0.50), percentile(waits, 0.99)
		slices.Sort(grantTimes)
		for i := 1; i < len(grantTimes); i++ {
			kr.LongestGap = max(kr.LongestGap, time.Duration(grantTimes[i]-grantTimes[i-1]))
		}
		if kind == histcheck.KindLock {
			rep.Lock = kr
		} else {
			rep.Election = kr
		}
		if (kind == histcheck.KindLock && r.o.Lockers > 0 || kind == histcheck.KindElection && r.o.Candidates > 0) && kr.Grants == 0 {
			rep.Violations = append(rep.Violations, histcheck.Violation{Checker: "progress-" + kind, What: "no grant in the whole run"})
		}
		rep.Violations = append(rep.Violations, histcheck.Check(kind, recs, writes[kind], r.o.Timeout)...)
	}
	rep.Passed = len(rep.Violations) == 0
}

// cleanUp closes the probe session and deletes the fenced keys (with a
// grant of the run's own lock).
func (r *run) cleanUp(rep *Report, probe *clientlib.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var left []string
	if l, err := probe.Lock(ctx, r.lockName()); err == nil {
		for _, kind := range []string{histcheck.KindLock, histcheck.KindElection} {
			if _, err := l.Delete(ctx, r.key(kind)); err != nil && !errors.Is(err, clientlib.ErrKeyNotFound) {
				left = append(left, r.key(kind))
			}
		}
	} else {
		left = append(left, r.key(histcheck.KindLock), r.key(histcheck.KindElection))
	}
	if err := probe.Close(ctx); err != nil {
		left = append(left, "session "+probe.ID())
	}
	if r.o.Sabotage == SabotageUnfenced {
		left = append(left, "config namespace "+r.namespace()+" (namespaces are not deleted)")
	}
	rep.Leftovers = strings.Join(left, ", ")
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
