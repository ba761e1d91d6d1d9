// Package revoke is the hand-shake with which a lock grant or a leadership
// is taken from outside (a release or resignation that its holder did not
// ask for): the holder is told first, and the next holder is given it only
// once the holder has let go, or once a bound has passed.
//
// The steps, shared by package lock and package election:
//
//  1. The revoker writes a mark (grantwatch.MarkKey of the holder's entry),
//     bound to the holder's session, in a transaction that checks the
//     entry still exists. A mark already there is joined, not replaced:
//     its bound stands.
//  2. The holder's member reports the mark to the holder's stream
//     (grantwatch.WatchRevocable); the holder's client ends the holding
//     (its context) and then releases or resigns it itself, which deletes
//     the entry and the mark in one commit: the next holder is granted in
//     that commit, after the holder knew.
//  3. The revoker waits for the entry's deletion. If the bound passes
//     first, it deletes the entry itself (and the mark) and records the
//     outcome in the name's "revoked" key (Ended), bound to the old
//     holder's session.
//
// Guarantees: the next holder is granted only after the holder's client
// ended its holding, or after the bound; a bound is never longer than what
// the revoker asked for. Non-guarantees: a holder whose client does not
// follow its holding (REST without a stream, an old client) is not asked,
// so its grant ends at the bound; if the member running the revocation
// stops before the bound, the mark stays until the holder lets go, its
// session ends or the release is asked for again (which joins the mark
// and ends the grant at its bound).
package revoke

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/grantwatch"
	"github.com/coordd/coordd/internal/base/groupcommit"
)

// Outcome is how a revocation ended.
type Outcome string

// Outcomes.
const (
	// Acknowledged: the holder let go when asked.
	Acknowledged Outcome = "acknowledged"
	// Bound: the holder did not let go within the bound; the revoker ended
	// the grant.
	Bound Outcome = "bound"
	// Forced: ended at once, without asking the holder.
	Forced Outcome = "forced"
)

// Revocation is how a grant taken from outside ended: Outcome is empty
// when nothing was revoked (a waiter that held nothing).
type Revocation struct {
	Outcome Outcome
	// Waited is how long the revoker waited for the holder.
	Waited time.Duration
}

// Options say how to revoke.
type Options struct {
	// Wait bounds how long the holder may take to let go: 0 or more than
	// the holder's session TTL means that TTL.
	Wait time.Duration
	// Force ends the grant at once, without asking.
	Force bool
	// TTL returns the TTL of the holder's session (its id). Required
	// unless Force.
	TTL func(ctx context.Context, session int64) (time.Duration, error)
}

// Bound is how long the holder of session may take to let go under o.
func (o Options) Bound(ctx context.Context, session int64) (time.Duration, error) {
	ttl, err := o.TTL(ctx, session)
	if err != nil {
		return 0, err
	}
	if o.Wait > 0 && o.Wait < ttl {
		return o.Wait, nil
	}
	return ttl, nil
}

// Mark is the value of a revocation mark.
type Mark struct {
	Key   string    `json:"key"` // the revoked entry's key (grantwatch reads it)
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
}

// Ended is the value of a name's "revoked" key: the last revocation that
// did not end by acknowledgement (a holder's own release deletes the mark
// and writes nothing).
type Ended struct {
	Token   int64     `json:"token"`
	Outcome Outcome   `json:"outcome"`
	Since   time.Time `json:"since,omitzero"`
}

// Encode returns m as a mark's value.
func (m Mark) Encode() string {
	b, _ := json.Marshal(m)
	return string(b)
}

// Encode returns e as the "revoked" key's value.
func (e Ended) Encode() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// DecodeMark reads a mark's value.
func DecodeMark(v []byte) (Mark, bool) {
	var m Mark
	if json.Unmarshal(v, &m) != nil || m.Key == "" {
		return Mark{}, false
	}
	return m, true
}

// DecodeEnded reads a "revoked" key's value.
func DecodeEnded(v []byte) (Ended, bool) {
	var e Ended
	if json.Unmarshal(v, &e) != nil || e.Token <= 0 {
		return Ended{}, false
	}
	return e, true
}

// Background runs the wait of a revocation beyond its caller: a release
// from outside that its caller abandons still ends at its bound.
type Background interface {
	TryGo(fn func(stop context.Context)) bool
}

// errStopping fails a revocation that cannot start: its owner is closing.
var errStopping = errkind.Unavailable.New("revoke: the member is stopping")

// Await waits, on bg, until the entry at key created at token is deleted
// (ended true) or until passes (ended false); then, unless it ended,
// calls end (which deletes the entry if it still exists). The result is
// returned once it is known, or ctx's error if ctx ends first (the wait
// and end go on). A wait that cannot start (etcd unreadable) fails.
func Await(ctx context.Context, bg Background, w *grantwatch.Watcher, key string, token int64, until time.Time, end func(ctx context.Context) error) (ended bool, err error) {
	type result struct {
		ended bool
		err   error
	}
	done := make(chan result, 1)
	ok := bg.TryGo(func(stop context.Context) {
		gone := make(chan struct{})
		unwatch, err := w.Watch(stop, key, token, func() { close(gone) })
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unwatch()
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-gone:
			done <- result{ended: true}
		case <-t.C:
			done <- result{err: end(stop)}
		case <-stop.Done():
			done <- result{err: stop.Err()}
		}
	})
	if !ok {
		return false, errStopping
	}
	select {
	case r := <-done:
		return r.ended, r.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// Grace is how long a revoker that asked the holder directly (its stream
// is on the revoker's member, see grantwatch.Watcher.Revoking) waits for
// the holder's answer before it writes the mark: a holder that answers at
// once costs the hand-over one commit (its own release), not two.
const Grace = 100 * time.Millisecond

// EndsWithin reports whether the entry at key created at token ends (is
// deleted) within d, or has already.
func EndsWithin(ctx context.Context, w *grantwatch.Watcher, key string, token int64, d time.Duration) (bool, error) {
	gone := make(chan struct{})
	unwatch, err := w.Watch(ctx, key, token, func() { close(gone) })
	if err != nil {
		return false, err
	}
	defer unwatch()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-gone:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// tokensOf reads the create revisions of the targets' keys (0: gone), a
// batch of keys per read.
func tokensOf(ctx context.Context, cli *clientv3.Client, targets []Target) ([]int64, error) {
	const batch = 64 // under etcd's default of 128 operations per transaction
	out := make([]int64, len(targets))
	for from := 0; from < len(targets); from += batch {
		part := targets[from:min(from+batch, len(targets))]
		ops := make([]clientv3.Op, len(part))
		for i, t := range part {
			ops[i] = clientv3.OpGet(t.Key, clientv3.WithKeysOnly())
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, err
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				out[from+i] = kvs[0].CreateRevision
			}
		}
	}
	return out, nil
}

// Target is a grant to revoke: its lock's or election's name and its
// entry's key (its token is the key's create revision).
type Target struct {
	Name, Key string
}

// All reads the targets' tokens and runs revoke for each that still
// exists, all at once, and returns the revocations that revoked
// something (a non-empty outcome).
func All(ctx context.Context, cli *clientv3.Client, targets []Target, revoke func(ctx context.Context, t Target, token int64) (Revocation, error)) ([]Revocation, error) {
	var (
		mu   sync.Mutex
		out  []Revocation
		errs []error
		wg   sync.WaitGroup
	)
	tokens, err := tokensOf(ctx, cli, targets)
	if err != nil {
		return nil, err
	}
	for i, t := range targets {
		token := tokens[i]
		if token == 0 {
			continue // gone meanwhile
		}
		wg.Go(func() {
			r, err := revoke(ctx, t, token)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if r.Outcome != "" {
				out = append(out, r)
			}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Ask is one revocation of a holding that exists, once the revoker has
// found it: what package lock and package election share of the
// hand-shake (see the package doc).
type Ask struct {
	W       *grantwatch.Watcher
	BG      Background
	Txns    *groupcommit.Committer
	TxnName string // the group committer's name for the holding's queue
	Entry   string // the holding's key; its create revision is Token
	Token   int64
	Lease   int64  // the holder's session: the mark is bound to it
	MarkKey string // grantwatch.MarkKey of the entry
	Now     func() time.Time
	// End ends the holding at the bound (mark is the revocation's).
	End func(ctx context.Context, mark Mark) error
}

// Run asks the holder (directly, when its stream is on this member, and
// through the mark otherwise or when it does not answer within Grace),
// waits for its answer or the bound (o.Bound of the holder's session), and
// returns how the revocation ended. gone says the holding no longer
// existed when the mark was to be written, and nobody was asked: the
// caller's "holds nothing".
func (a Ask) Run(ctx context.Context, o Options) (r Revocation, gone bool, err error) {
	// A holder whose stream is on this member is asked now, while the
	// bound is read and the mark commits: its answer may come in the same
	// batch as the mark, or before it.
	asked := a.W.Revoking(a.Entry, a.Token) > 0
	bound, err := o.Bound(ctx, a.Lease)
	if err != nil {
		return Revocation{}, false, err
	}
	start := a.Now()
	acknowledged := func() Revocation { return Revocation{Outcome: Acknowledged, Waited: a.Now().Sub(start)} }
	if asked {
		// Its answer usually comes at once: then no mark is written.
		ended, err := EndsWithin(ctx, a.W, a.Entry, a.Token, min(bound, Grace))
		if err != nil || ended {
			return acknowledged(), false, err
		}
	}
	mark := Mark{Key: a.Entry, Since: start, Until: start.Add(bound)}
	resp, err := a.Txns.Commit(ctx, groupcommit.Txn{
		Name: a.TxnName,
		If: []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(a.Entry), "=", a.Token),
			clientv3.Compare(clientv3.CreateRevision(a.MarkKey), "=", 0),
		},
		Then: []clientv3.Op{clientv3.OpPut(a.MarkKey, mark.Encode(), clientv3.WithLease(clientv3.LeaseID(a.Lease)))},
		Else: []clientv3.Op{clientv3.OpGet(a.Entry, clientv3.WithKeysOnly()), clientv3.OpGet(a.MarkKey)},
	})
	if err != nil {
		return Revocation{}, false, err
	}
	if !resp.Succeeded {
		entry, marks := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(entry) == 0 || entry[0].CreateRevision != a.Token {
			if asked { // it let go before the mark was written
				return acknowledged(), false, nil
			}
			return Revocation{}, true, nil
		}
		if len(marks) > 0 { // another revocation of it is under way: join it
			if old, ok := DecodeMark(marks[0].Value); ok {
				mark = old
			}
		}
	}
	ended, err := Await(ctx, a.BG, a.W, a.Entry, a.Token, mark.Until, func(ctx context.Context) error { return a.End(ctx, mark) })
	waited := a.Now().Sub(mark.Since)
	switch {
	case err != nil:
		return Revocation{}, false, err
	case ended:
		return Revocation{Outcome: Acknowledged, Waited: waited}, false, nil
	}
	return Revocation{Outcome: Bound, Waited: waited}, false, nil
}
