package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
)

// Names the workers use.
const (
	LockName     = "chaos/lock"
	ElectionName = "chaos/election"
	HandoverName = "chaos/handover"
)

// KindHandover is a worker (two candidates in one process) that campaigns
// in HandoverName with a random priority and, when its term is over,
// hands the seat to a waiting candidate it picks (Transfer) instead of
// resigning (it resigns when
// nobody waits or the hand-over fails). Its records are checked as an
// election's: strictly increasing terms, fenced writes, never two
// leaders in their own view. Each hand-over is recorded (OpTransfer).
const KindHandover = "handover"

// OpTransfer records a hand-over: Token is the successor's term (0 if it
// failed, Err says why).
const OpTransfer = "transfer"

// KindSet is a worker that takes a set of locks at once (AcquireAll): the
// locks SetLocks, in the order its SetOrder names them. Its records are
// kept per lock, under the lock's kind (SetKind), each checked as a lock
// of its own: one token per lock, fenced writes with it to the lock's key.
const KindSet = "set"

// SetLocks are the locks of the set workers, by kind.
var SetLocks = map[string]string{"set-a": "chaos/set-a", "set-b": "chaos/set-b"}

// SetKinds are the set's lock kinds, sorted.
var SetKinds = []string{"set-a", "set-b"}

// ValueKey is the fenced key a worker of kind writes its token to.
func ValueKey(kind string) string { return "chaos/" + kind + "-value" }

// Sabotage modes switch a safety mechanism off, to show that the checkers
// catch what it prevents.
const (
	// SabotageNone runs with every mechanism on.
	SabotageNone = ""
	// SabotageUnfenced writes the value straight to etcd, unfenced: a
	// holder paused past its session writes late, with an older token.
	SabotageUnfenced = "unfenced"
	// SabotageDeadline has the worker trust its grant until TTL past the
	// local deadline instead of the SDK's deadline (as a client that
	// ignored the safety margin and the renewal time would).
	SabotageDeadline = "deadline"
	// SabotageTorn has the config publisher write the two keys of each
	// release in two releases, as a client without atomic publishes
	// would: subscribers see half-applied releases.
	SabotageTorn = "torn"
	// SabotageLateHandover has a handover worker go on acting as leader
	// for a moment after its Transfer returned (its view ends late), as a
	// client that handed over before finishing its work would: two
	// leaders at once in their own views.
	SabotageLateHandover = "late-handover"
)

// WorkerConfig configures one worker process.
type WorkerConfig struct {
	ID        string
	Kind      string // KindLock, KindElection, KindHandover, KindSet, KindBarrier, KindPublisher or KindSubscriber
	Endpoints []string
	// AnyMember keeps the worker's client on the member it connected to
	// (clientlib.Config.AnyMember) instead of following etcd's leader, so
	// that some workers use followers' members.
	AnyMember bool
	History   string // the history file to append to
	TTL       time.Duration
	Hold      time.Duration // how long each grant is held, writing
	Sabotage  string
	Etcd      []string // etcd client URLs, for SabotageUnfenced
	KeyRoot   string   // coordd's etcd key root, for SabotageUnfenced
	// SetOrder is the order in which a set worker names its locks (kinds
	// of SetKinds): two workers naming them in opposite orders would
	// deadlock without the server's ordering.
	SetOrder []string
}

// holding is what a worker holds: a lock or a leadership.
type holding interface {
	Put(ctx context.Context, key string, value []byte) (int64, error)
	Context() context.Context
}

// handover is a handover worker's leadership: given up by Transfer.
type handover struct {
	*clientlib.Leadership
	c *clientlib.Client
}

// handOver hands the seat to a waiting candidate, picked at random, and
// records it; false if nobody waits or it failed (the caller resigns).
func (h handover) handOver(ctx context.Context, rec *recorder) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cands, err := h.c.Candidates(cctx, HandoverName)
	if err != nil || len(cands) == 0 {
		return false
	}
	r := Record{Op: OpTransfer, Call: now(), Session: cands[rand.IntN(len(cands))].SessionID}
	term, err := h.Transfer(cctx, r.Session)
	r.Return, r.Token = now(), int64(term)
	if err != nil {
		r.Err = err.Error()
	}
	rec.add(r)
	return err == nil
}

// RunWorker takes the lock (or leads the election) over and over until
// ctx ends, writing its token to the fenced key while it holds it, and
// records every step. It survives coordd being unavailable and its own
// session ending; a kill -9 just stops it.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	rec, err := newRecorder(cfg.History, cfg.ID, cfg.Kind)
	if err != nil {
		return err
	}
	defer func() { _ = rec.close() }()
	logf, err := os.OpenFile(strings.TrimSuffix(cfg.History, ".jsonl")+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()
	lg := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("worker", cfg.ID)
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: cfg.Endpoints, AnyMember: cfg.AnyMember, NoWait: true, Logger: lg})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	switch cfg.Kind {
	case KindPublisher:
		runPublisher(ctx, c, rec, cfg.Sabotage)
		return nil
	case KindSubscriber:
		return runSubscriber(ctx, c, rec)
	case KindBarrier:
		runBarrier(ctx, lg, cfg, rec, c)
		return nil
	}
	var raw *clientv3.Client
	if cfg.Sabotage == SabotageUnfenced {
		raw, err = clientv3.New(clientv3.Config{Endpoints: cfg.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer func() { _ = raw.Close() }()
	}
	if cfg.Kind == KindHandover {
		// Two candidates in one process: a hand-over needs one waiting,
		// and a process fewer keeps the matrix's load down.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { work(ctx, lg, cfg, rec, raw, c) })
		}
		wg.Wait()
		return nil
	}
	work(ctx, lg, cfg, rec, raw, c)
	return nil
}

// work takes the grant over and over, with a new session whenever one
// ends, until ctx ends.
func work(ctx context.Context, lg *slog.Logger, cfg WorkerConfig, rec *recorder, raw *clientv3.Client, c *clientlib.Client) {
	for ctx.Err() == nil {
		sess, err := c.NewSession(ctx, clientlib.WithTTL(cfg.TTL), clientlib.WithOwner(cfg.ID))
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		context.AfterFunc(sess.Context(), func() {
			t := now()
			rec.add(Record{Op: OpSessionEnd, Session: sess.ID(), Call: t, Return: t, Err: fmt.Sprint(context.Cause(sess.Context()))})
		})
		for ctx.Err() == nil && sess.Err() == nil && cfg.Kind == KindSet {
			takeSet(ctx, lg, cfg, rec, raw, sess)
		}
		for ctx.Err() == nil && sess.Err() == nil && cfg.Kind != KindSet {
			call := now()
			h, token, err := take(ctx, c, sess, cfg.Kind)
			r := Record{Op: OpAcquire, Call: call, Return: now(), Token: token, Session: sess.ID()}
			if err != nil {
				r.Token, r.Err = 0, err.Error()
				rec.add(r)
				pause(ctx, 50*time.Millisecond)
				continue
			}
			rec.add(r)
			hold(ctx, lg, cfg, rec, raw, sess, h, token)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = sess.Close(cctx) // an ended session is closed by the SDK in the background anyway
		cancel()
	}
}

func take(ctx context.Context, c *clientlib.Client, sess *clientlib.Session, kind string) (holding, int64, error) {
	switch kind {
	case KindElection:
		l, err := sess.Campaign(ctx, ElectionName, "v")
		if err != nil {
			return nil, 0, err
		}
		return l, int64(l.Term()), nil
	case KindHandover:
		l, err := sess.Campaign(ctx, HandoverName, sess.ID(), clientlib.WithPriority(rand.Int32N(3)))
		if err != nil {
			return nil, 0, err
		}
		return handover{l, c}, int64(l.Term()), nil
	}
	l, err := sess.Lock(ctx, LockName)
	if err != nil {
		return nil, 0, err
	}
	return l, int64(l.Token()), nil
}

// hold writes the token a few times over cfg.Hold, whether or not the
// grant is still held (a paused holder does not know): fencing must refuse
// what comes too late. Then it gives the grant up and records its view.
func hold(ctx context.Context, lg *slog.Logger, cfg WorkerConfig, rec *recorder, raw *clientv3.Client, sess *clientlib.Session, h holding, token int64) {
	start := now()
	var lostAt atomic.Int64
	stop := context.AfterFunc(h.Context(), func() { lostAt.Store(now()) })
	defer stop()
	const writes = 5
	for i := range writes {
		if ctx.Err() != nil {
			break
		}
		put(ctx, cfg, rec, raw, h, token)
		if i < writes-1 {
			pause(ctx, cfg.Hold/writes)
		}
	}
	if g, ok := h.(handover); ok && cfg.Sabotage == SabotageLateHandover {
		if g.handOver(ctx, rec) {
			pause(ctx, 100*time.Millisecond) // still "leading"
			rec.add(Record{Op: OpView, Token: token, Call: start, Return: now(), Session: sess.ID()})
			return
		}
	}
	// In the SDK's view the grant ended at the session's local deadline
	// at the latest, whether or not this goroutine has seen its context
	// end yet (the process may have been paused past it).
	dl := sess.Deadline()
	if cfg.Sabotage == SabotageDeadline {
		dl = dl.Add(cfg.TTL)
	}
	end := min(now(), dl.UnixNano())
	why := ""
	if at := lostAt.Load(); at != 0 && at < end {
		end, why = at, fmt.Sprint(context.Cause(h.Context()))
	}
	rec.add(Record{Op: OpView, Token: token, Call: start, Return: end, Session: sess.ID(), Err: why})
	// Give the grant up for as long as the session lives (as RunLocked
	// does): a holder that walked away from a grant its live session still
	// holds would block everyone behind it.
	rctx, cancel := context.WithCancel(sess.Context())
	defer cancel()
	stopRelease := context.AfterFunc(ctx, cancel)
	defer stopRelease()
	// A release that failed (a member stopping under it) is repeated
	// until it succeeds or the grant is gone.
	if g, ok := h.(handover); ok && g.handOver(rctx, rec) {
		return
	}
	for rctx.Err() == nil {
		var err error
		switch g := h.(type) {
		case *clientlib.Lock:
			err = g.Release(rctx)
		case *clientlib.Leadership:
			err = g.Resign(rctx)
		case handover:
			err = g.Resign(rctx)
		}
		if err == nil || errors.Is(err, clientlib.ErrNotHolder) || errors.Is(err, clientlib.ErrNotLeader) {
			return
		}
		lg.Info("giving the grant up failed; trying again", "token", token, "err", err)
		pause(rctx, 100*time.Millisecond)
	}
}

// putTimeout bounds one fenced write, as a careful client bounds every
// call: a write stuck on a paused member must not hold the lock for long.
const putTimeout = time.Second

func put(ctx context.Context, cfg WorkerConfig, rec *recorder, raw *clientv3.Client, h holding, token int64) {
	putAs(ctx, cfg, cfg.Kind, rec, raw, h, token)
}

// putAs writes token to kind's fenced key, recorded under kind.
func putAs(ctx context.Context, cfg WorkerConfig, kind string, rec *recorder, raw *clientv3.Client, h holding, token int64) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), putTimeout)
	defer cancel()
	value := strconv.FormatInt(token, 10)
	r := Record{Kind: kind, Op: OpPut, Token: token, Call: now()}
	var err error
	if raw != nil {
		_, err = raw.Put(pctx, cfg.KeyRoot+"kv/"+ValueKey(kind), value)
	} else {
		_, err = h.Put(pctx, ValueKey(kind), []byte(value))
	}
	r.Return = now()
	switch {
	case err == nil:
		r.Result = ResultOK
	case errors.Is(err, clientlib.ErrStaleToken):
		r.Result = ResultStale
	default:
		r.Result, r.Err = ResultUnknown, fmt.Sprint(err)
	}
	rec.add(r)
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// takeSet takes the set's locks with one AcquireAll, writes each lock's
// token to its key over cfg.Hold whether or not it still holds (as hold
// does), records each lock's view, and gives the set up.
func takeSet(ctx context.Context, lg *slog.Logger, cfg WorkerConfig, rec *recorder, raw *clientv3.Client, sess *clientlib.Session) {
	names := make([]string, 0, len(cfg.SetOrder))
	for _, k := range cfg.SetOrder {
		names = append(names, SetLocks[k])
	}
	call := now()
	set, err := sess.LockAll(ctx, names)
	ret := now()
	if err != nil {
		for _, k := range cfg.SetOrder {
			rec.add(Record{Kind: k, Op: OpAcquire, Call: call, Return: ret, Session: sess.ID(), Err: err.Error()})
		}
		pause(ctx, 50*time.Millisecond)
		return
	}
	kindOf := map[string]string{}
	for k, n := range SetLocks {
		kindOf[n] = k
	}
	locks := set.Locks()
	lost := make([]atomic.Int64, len(locks))
	for i, l := range locks {
		rec.add(Record{Kind: kindOf[l.Name()], Op: OpAcquire, Call: call, Return: ret, Token: int64(l.Token()), Session: sess.ID()})
		stop := context.AfterFunc(l.Context(), func() { lost[i].Store(now()) })
		defer stop()
	}
	start := now()
	const writes = 5
	for i := range writes {
		if ctx.Err() != nil {
			break
		}
		for _, l := range locks {
			putAs(ctx, cfg, kindOf[l.Name()], rec, raw, l, int64(l.Token()))
		}
		if i < writes-1 {
			pause(ctx, cfg.Hold/writes)
		}
	}
	dl := sess.Deadline()
	if cfg.Sabotage == SabotageDeadline {
		dl = dl.Add(cfg.TTL)
	}
	for i, l := range locks {
		end, why := min(now(), dl.UnixNano()), ""
		if at := lost[i].Load(); at != 0 && at < end {
			end, why = at, fmt.Sprint(context.Cause(l.Context()))
		}
		rec.add(Record{Kind: kindOf[l.Name()], Op: OpView, Token: int64(l.Token()), Call: start, Return: end, Session: sess.ID(), Err: why})
	}
	rctx, cancel := context.WithCancel(sess.Context())
	defer cancel()
	stopRelease := context.AfterFunc(ctx, cancel)
	defer stopRelease()
	for rctx.Err() == nil {
		err := set.Release(rctx)
		if err == nil || errors.Is(err, clientlib.ErrNotHolder) {
			return
		}
		lg.Info("giving the set up failed; trying again", "err", err)
		pause(rctx, 100*time.Millisecond)
	}
}
