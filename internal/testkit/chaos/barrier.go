package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// KindBarrier is a worker (two participants in one process, each with a
// session of its own) that goes through barriers of two, one after
// another: "chaos/barrier/1", "chaos/barrier/2", ... Both enter barrier n,
// wait until it opens, and leave it together once both saw it open; then
// both go on to n+1. A participant whose session ends (or whose call fails) enters
// barrier n again with a new session: the other is still in it. Each
// opening is recorded once, as an acquisition whose token is n, so the
// matrix can measure how long barriers stop opening during a fault.
const KindBarrier = "barrier"

// barrierPrefix names the workers' barriers.
const barrierPrefix = "chaos/barrier/"

// runBarrier runs the two participants until ctx ends.
func runBarrier(ctx context.Context, lg *slog.Logger, cfg WorkerConfig, rec *recorder, c *clientlib.Client) {
	ps := [2]*participant{{id: "0"}, {id: "1"}}
	defer func() {
		for _, p := range ps {
			p.close()
		}
	}()
	for n := int64(1); ctx.Err() == nil; n++ {
		name := fmt.Sprintf("%s%d", barrierPrefix, n)
		call := now()
		var wg sync.WaitGroup
		var opened sync.Once
		var bars [2]*clientlib.Barrier
		for i, p := range ps {
			wg.Go(func() {
				if bars[i] = p.enter(ctx, lg, cfg, c, name); bars[i] != nil {
					opened.Do(func() { rec.add(Record{Op: OpAcquire, Call: call, Return: now(), Token: n}) })
				}
			})
		}
		wg.Wait()
		// Both saw it open: now they leave, together (a leave waits for
		// every participant to be out).
		for _, b := range bars {
			if b != nil {
				wg.Go(func() {
					lctx, cancel := context.WithTimeout(ctx, cfg.TTL)
					defer cancel()
					_ = b.Leave(lctx) // the participant is out even when this fails
				})
			}
		}
		wg.Wait()
	}
}

// participant is one of the worker's two, with its current session.
type participant struct {
	id   string
	sess *clientlib.Session
}

// enter enters the barrier until it sees it open (nil once ctx ends),
// with a new session whenever the last one ended. The other participant
// stays in the barrier meanwhile, so entering again completes it.
func (p *participant) enter(ctx context.Context, lg *slog.Logger, cfg WorkerConfig, c *clientlib.Client, name string) *clientlib.Barrier {
	for ctx.Err() == nil {
		if p.sess == nil || p.sess.Err() != nil {
			p.close()
			s, err := c.NewSession(ctx, clientlib.WithTTL(cfg.TTL), clientlib.WithOwner(cfg.ID))
			if err != nil {
				pause(ctx, 100*time.Millisecond)
				continue
			}
			p.sess = s
		}
		b, err := p.sess.EnterBarrier(ctx, name, 2, clientlib.WithParticipant(p.id))
		if err == nil {
			return b
		}
		lg.Info("barrier: entering again", "barrier", name, "participant", p.id, "err", err)
		pause(ctx, 50*time.Millisecond)
	}
	return nil
}

// close closes the participant's session, if any, giving it a second.
func (p *participant) close() {
	if p.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.sess.Close(ctx) // an ended session is closed by the SDK in the background anyway
	p.sess = nil
}
