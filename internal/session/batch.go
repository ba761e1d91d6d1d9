package session

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Renewing the sessions of one client at once. coordd's SDK keeps all of a
// client's sessions on one shared keep-alive stream and renews them in
// batches; the member renews a batch in lots of renewLot sessions, on up to
// batchWorkers goroutines per stream, and answers each lot as it finishes.
// Renewing on the etcd leader takes microseconds; on another member each
// renewal is forwarded to it, a round trip, so a lot's sessions are renewed
// at once and a large batch's lots side by side: a batch is answered within
// about one round trip to the leader.
const (
	renewLot     = 32
	batchWorkers = 64
)

// Lot is what one worker renews and answers at once: one session, or up
// to renewLot sessions of a batch.
type Lot struct {
	single ID
	batch  []ID
}

// Lots splits a request into lots: the one session id names when batch is
// empty, else batch (with id first when it is not zero) in lots of at most
// renewLot sessions.
func Lots(id ID, batch []ID) []Lot {
	if len(batch) == 0 {
		return []Lot{{single: id}}
	}
	if id != 0 {
		batch = append([]ID{id}, batch...)
	}
	out := make([]Lot, 0, (len(batch)+renewLot-1)/renewLot)
	for len(batch) > 0 {
		n := min(len(batch), renewLot)
		out = append(out, Lot{batch: batch[:n:n]})
		batch = batch[n:]
	}
	return out
}

// Renewal is the outcome of renewing one session: the TTL it was renewed
// for, or Gone when the session no longer exists.
type Renewal struct {
	ID   ID
	TTL  time.Duration
	Gone bool
}

// LotResult answers one lot: Single says it named one session (not a
// batch); Err is a failure other than a gone session, which ends the
// stream.
type LotResult struct {
	Single   bool
	Renewals []Renewal
	Err      error
}

// Batches renews the lots of one shared keep-alive stream on up to
// batchWorkers goroutines, started at the first lot and ended with ctx;
// Wait waits for them. A gone session is answered as such, never an
// error: the stream's other sessions go on.
type Batches struct {
	m       *Manager
	ctx     context.Context
	observe func(error) // told each session's renewal outcome (metrics)
	in      chan Lot
	out     chan LotResult
	once    sync.Once
	workers sync.WaitGroup
}

// NewBatches returns the renewals of one stream; observe (if not nil) is
// told the outcome of every session's renewal.
func (m *Manager) NewBatches(ctx context.Context, observe func(error)) *Batches {
	if observe == nil {
		observe = func(error) {}
	}
	return &Batches{m: m, ctx: ctx, observe: observe, in: make(chan Lot), out: make(chan LotResult)}
}

// In takes lots to renew (it starts the workers on first use). A send
// blocks while every worker is busy: take their results meanwhile.
func (b *Batches) In() chan<- Lot {
	b.once.Do(func() {
		for range batchWorkers {
			b.workers.Go(b.work)
		}
	})
	return b.in
}

// Out gives each lot's result, as it finishes.
func (b *Batches) Out() <-chan LotResult { return b.out }

// Wait waits for the workers to end (after ctx has).
func (b *Batches) Wait() { b.workers.Wait() }

func (b *Batches) work() {
	for {
		select {
		case <-b.ctx.Done():
			return
		case l := <-b.in:
			select {
			case b.out <- b.renew(l):
			case <-b.ctx.Done():
				return
			}
		}
	}
}

// renew renews one lot.
func (b *Batches) renew(l Lot) LotResult {
	if len(l.batch) == 0 {
		ttl, err := b.m.KeepAlive(b.ctx, l.single)
		b.observe(err)
		switch {
		case errors.Is(err, ErrNotFound):
			return LotResult{Single: true, Renewals: []Renewal{{ID: l.single, Gone: true}}}
		case err != nil:
			return LotResult{Single: true, Err: err}
		}
		return LotResult{Single: true, Renewals: []Renewal{{ID: l.single, TTL: ttl}}}
	}
	ttls, errs, err := b.m.KeepAliveAll(b.ctx, l.batch)
	if err != nil {
		b.observe(err)
		return LotResult{Err: err}
	}
	rs := make([]Renewal, len(l.batch))
	for i, id := range l.batch {
		b.observe(errs[i])
		switch {
		case errors.Is(errs[i], ErrNotFound):
			rs[i] = Renewal{ID: id, Gone: true}
		case errs[i] != nil:
			return LotResult{Err: errs[i]}
		default:
			rs[i] = Renewal{ID: id, TTL: ttls[i]}
		}
	}
	return LotResult{Renewals: rs}
}
