// Package grantwatch tells a holder when what it holds ends, a waiter when
// an entry ahead of it goes, and an observer what changed: one etcd watch
// per daemon and prefix (lock entries, elections) reports the deletion of
// any entry a subscriber watches (Watch), whoever deleted it (a Release or
// Resign from another client, an admin, a CloseSession, the lease's
// expiry), and every change under a subscribed prefix (Subscribe, a Feed;
// see Feed for its guarantees). However many holders, waiters and
// observers a member serves, it keeps one etcd watch per prefix.
//
// Guarantees:
//
//   - An entry watched with Watch is reported ended exactly once: as soon as
//     this member applies its deletion, or at once if it was already gone
//     (or is another incarnation of the key) when the watch began. A
//     deletion is never missed, also across restarts of the etcd watch (a
//     restart checks every watched entry again).
//
//   - An entry that still exists is never reported ended.
//
//   - WatchFrom an entry known alive at a revision reads nothing from etcd
//     when the member's watch has not dispatched past that revision, or
//     remembers every deletion since it (the last few thousand per prefix,
//     forgotten when the etcd watch restarts); otherwise it reads, as
//     Watch does.
//
//   - A revocation mark (see MarkKey) written for a watched entry is
//     reported to its subscriber (WatchRevocable) once, as soon as this
//     member applies it, or at once if it was there when the watch began:
//     the holder is asked to let go before anyone else is given what it
//     holds (package lock and package election wait for that).
//
// Non-guarantees: a report reaches the subscriber after the deletion was
// applied: another holder may already hold the lock by then (the gap is one
// etcd watch delivery, well under a millisecond on the same host). Only
// fencing tokens protect against that. While this member has no etcd
// leader, reports wait for it.
package grantwatch

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watcher watches entries under a set of key prefixes for their deletion.
// Its zero value is not usable; use New, then run Run. It is safe for
// concurrent use.
type Watcher struct {
	cli      *clientv3.Client
	prefixes []string

	mu    sync.Mutex
	subs  map[string]map[*sub]struct{}  // by key; guarded by mu
	feeds map[string]map[*Feed]struct{} // by prefix; guarded by mu
	// pos is, per watched prefix, the revision up to which every change
	// has been dispatched; guarded by mu.
	pos map[string]int64
	// recent are, per watched prefix, the latest deletions dispatched;
	// guarded by mu.
	recent map[string]*deletions
	// delivered is, per watched prefix, the revision up to which every
	// change has been handed to the Feeds and Watch subscribers (pos, once
	// the hand-over is done); moved is closed, and replaced, when it
	// moves; stream is the context of the running etcd watch (for
	// RequestProgress on its stream). All guarded by mu.
	delivered map[string]int64
	moved     chan struct{}
	stream    context.Context
}

// deletions remembers the latest deletions dispatched under one prefix
// (up to recentDeletions of them), so that WatchFrom an entry known alive
// at a recent revision needs no read of etcd.
type deletions struct {
	floor  int64            // every deletion after floor, up to pos, is in byKey
	byKey  map[string]int64 // key -> revision of its latest deletion
	marked map[string]int64 // entry key -> revision of its latest revocation mark
	order  []deletion       // oldest first, to forget them in order
}

type deletion struct {
	key  string
	rev  int64
	mark bool // a revocation mark of the entry at key, not its deletion
}

// recentDeletions is how many deletions a Watcher remembers per prefix:
// at a few thousand grants a second, the last second or so, which is
// what a holder that reports its grant right away needs.
var recentDeletions = 4096 // a variable for tests

// reset forgets everything: no deletion at or before floor is known.
func (d *deletions) reset(floor int64) {
	d.floor = floor
	clear(d.byKey)
	clear(d.marked)
	d.order = d.order[:0]
}

func (d *deletions) add(key string, rev int64, mark bool) {
	if mark {
		d.marked[key] = rev
	} else {
		d.byKey[key] = rev
	}
	d.order = append(d.order, deletion{key, rev, mark})
	if len(d.order) > recentDeletions {
		old := d.order[0]
		d.order = d.order[1:]
		d.floor = max(d.floor, old.rev)
		m := d.byKey
		if old.mark {
			m = d.marked
		}
		if m[old.key] == old.rev {
			delete(m, old.key)
		}
	}
}

type sub struct {
	key       string
	createRev int64
	once      sync.Once
	ended     func()
	revoking  func() // nil: not told of revocation marks
	asked     sync.Once
}

func (s *sub) end() {
	s.once.Do(func() {
		s.asked.Do(func() {}) // no revocation report after the end
		s.ended()
	})
}

// revoke tells the subscriber its entry is being revoked, once.
func (s *sub) revoke() {
	if s.revoking != nil {
		s.asked.Do(s.revoking)
	}
}

// MarkKey is the key of the revocation mark of the entry at entryKey
// created at token, an entry under one of prefixes: the entry's first
// segment below its prefix (a lock's or election's escaped name) followed
// by "/revoke/" and the token. Its value is JSON with at least the
// entry's key ({"key": ...}). A lock or election that revokes a grant
// writes it first, and waits for the holder to let go (or a bound) before
// it gives the grant to anyone else; the holder's member reports it to
// the subscribers of the entry (WatchRevocable). "" when entryKey is not
// under prefixes.
func MarkKey(prefixes []string, entryKey string, token int64) string {
	for _, p := range prefixes {
		rest, ok := strings.CutPrefix(entryKey, p)
		if !ok {
			continue
		}
		seg, _, ok := strings.Cut(rest, "/")
		if !ok {
			return ""
		}
		return p + seg + "/revoke/" + strconv.FormatInt(token, 10)
	}
	return ""
}

// Revoking tells this member's subscribers of the entry at key created at
// token (WatchRevocable) that it is being revoked, at once, without
// waiting for its mark to be committed and watched: a revocation whose
// holder's stream is on this member asks it a commit sooner. Each
// subscriber is told once (the mark, when it comes, is not told again).
// It returns how many it told.
func (w *Watcher) Revoking(key string, token int64) int {
	var told []*sub
	w.mu.Lock()
	for s := range w.subs[key] {
		if s.createRev == token && s.revoking != nil {
			told = append(told, s)
		}
	}
	w.mu.Unlock()
	for _, s := range told {
		s.revoke()
	}
	return len(told)
}

// markOf decodes a revocation mark at key with value: the entry it
// revokes and its token (ok false when key is not a mark).
func markOf(prefix, key string, value []byte) (entryKey string, token int64, ok bool) {
	rest, _ := strings.CutPrefix(key, prefix)
	_, sub, found := strings.Cut(rest, "/")
	if !found {
		return "", 0, false
	}
	t, found := strings.CutPrefix(sub, "revoke/")
	if !found {
		return "", 0, false
	}
	token, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return "", 0, false
	}
	var v struct {
		Key string `json:"key"`
	}
	if json.Unmarshal(value, &v) != nil || v.Key == "" {
		return "", 0, false
	}
	return v.Key, token, true
}

// New returns a Watcher for entries under the given key prefixes. Watch
// reports deletions only once Run runs.
func New(cli *clientv3.Client, prefixes ...string) *Watcher {
	w := &Watcher{cli: cli, prefixes: prefixes, subs: make(map[string]map[*sub]struct{}),
		feeds: make(map[string]map[*Feed]struct{}), pos: make(map[string]int64), recent: make(map[string]*deletions),
		delivered: make(map[string]int64), moved: make(chan struct{})}
	for _, p := range prefixes {
		w.recent[p] = &deletions{byKey: make(map[string]int64), marked: make(map[string]int64)}
	}
	return w
}

// Watch reports, by calling ended once, the end of the entry at key that
// was created at revision createRev (a lock's token, an election's term).
// ended runs on the Watcher's goroutine or on Watch's caller's, and must not
// block. If the entry is already gone, ended is called before Watch
// returns. stop ends the watch; ended is not called after stop returns
// unless it was already running. Watch fails (and watches nothing) when
// etcd cannot be read before ctx ends.
func (w *Watcher) Watch(ctx context.Context, key string, createRev int64, ended func()) (stop func(), err error) {
	return w.WatchFrom(ctx, key, createRev, 0, ended)
}

// WatchFrom is Watch of an entry the caller knows was alive at revision
// aliveAt (at least createRev; 0 if unknown), e.g. the revision its grant
// was observed at. When this member's watch has not dispatched past
// aliveAt yet, or remembers every deletion since (the last few thousand),
// it watches without reading etcd. aliveAt is trusted: a caller that
// names one at which the entry did not exist may not hear of its end.
func (w *Watcher) WatchFrom(ctx context.Context, key string, createRev, aliveAt int64, ended func()) (stop func(), err error) {
	return w.WatchRevocable(ctx, key, createRev, aliveAt, ended, nil)
}

// WatchRevocable is WatchFrom that also calls revoking, once, when a
// revocation mark of the entry (MarkKey) is written, or at once if one is
// there when the watch begins (revoking nil: not told). revoking runs as
// ended does, and never after ended or stop.
func (w *Watcher) WatchRevocable(ctx context.Context, key string, createRev, aliveAt int64, ended, revoking func()) (stop func(), err error) {
	s := &sub{key: key, createRev: createRev, ended: ended, revoking: revoking}
	// Register before reading: a deletion applied after the read is then
	// seen by Run (its watch has not passed the read's revision yet: a
	// linearizable read returns at least every revision this member had
	// applied when it was sent), and one applied before it by the read.
	w.mu.Lock()
	if w.subs[key] == nil {
		w.subs[key] = make(map[*sub]struct{})
	}
	w.subs[key][s] = struct{}{}
	known, gone := w.knownLocked(key, aliveAt)
	w.mu.Unlock()
	stop = func() {
		w.remove(s)
		s.once.Do(func() {}) // no report after stop
		s.asked.Do(func() {})
	}
	if known {
		if gone {
			w.remove(s)
			s.end()
		}
		return stop, nil
	}
	alive, marked, err := w.read(ctx, s)
	if err != nil {
		stop()
		return nil, err
	}
	switch {
	case !alive:
		w.remove(s)
		s.end()
	case marked:
		s.revoke()
	}
	return stop, nil
}

// read reads whether s's entry is alive, and (when s hears of them)
// whether a revocation mark of it exists.
func (w *Watcher) read(ctx context.Context, s *sub) (alive, marked bool, err error) {
	mark := ""
	if s.revoking != nil {
		mark = MarkKey(w.prefixes, s.key, s.createRev)
	}
	if mark == "" {
		resp, err := w.cli.Get(ctx, s.key)
		if err != nil {
			return false, false, err
		}
		return len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == s.createRev, false, nil
	}
	resp, err := w.cli.Txn(ctx).Then(clientv3.OpGet(s.key), clientv3.OpGet(mark, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return false, false, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	alive = len(kvs) > 0 && kvs[0].CreateRevision == s.createRev
	return alive, len(resp.Responses[1].GetResponseRange().Kvs) > 0, nil
}

// knownLocked says whether key, alive at aliveAt, was deleted
// since is known without reading etcd (known), and if so, whether it was
// (gone): every deletion after aliveAt is either still to be dispatched
// to the subscriber just registered, or remembered. w.mu must be held.
func (w *Watcher) knownLocked(key string, aliveAt int64) (known, gone bool) {
	if aliveAt <= 0 {
		return false, false
	}
	p := w.prefixOf(key)
	if p == "" {
		return false, false
	}
	if w.pos[p] <= aliveAt {
		return true, false // nothing after aliveAt dispatched yet
	}
	d := w.recent[p]
	if d.floor > aliveAt || d.marked[key] > aliveAt {
		// Deletions since aliveAt may be forgotten, or a revocation mark
		// was dispatched since: read both.
		return false, false
	}
	return true, d.byKey[key] > aliveAt
}

// prefixOf returns the watched prefix key is under ("" if none).
func (w *Watcher) prefixOf(key string) string {
	for _, p := range w.prefixes {
		if strings.HasPrefix(key, p) {
			return p
		}
	}
	return ""
}

func (w *Watcher) remove(s *sub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs[s.key], s)
	if len(w.subs[s.key]) == 0 {
		delete(w.subs, s.key)
	}
}

// Run watches etcd until ctx ends. A watch that fails (no leader, a
// compaction, a broken connection) is started again after a short pause;
// every watched entry is read again after each start.
func (w *Watcher) Run(ctx context.Context) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		events, err := w.start(wctx)
		if err == nil {
			// Feeds read afresh: changes while no watch ran are lost.
			w.restarted()
		}
		if err == nil {
			// Also on the first start: a Watch that read its entry before
			// any etcd watch existed relies on it.
			err = w.recheck(wctx)
		}
		if err == nil {
			w.dispatch(wctx, events)
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// response is one watch response and the prefix of the watch it came from.
type response struct {
	prefix string
	clientv3.WatchResponse
}

// start starts one watch per prefix, from the current revision, and waits
// until etcd has created them all (their positions are then the revisions
// they start after). Their responses are merged on the returned channel,
// which closes once any of them ends.
func (w *Watcher) start(ctx context.Context) (<-chan response, error) {
	out := make(chan response)
	var wg sync.WaitGroup
	created := make(chan error, len(w.prefixes))
	for _, p := range w.prefixes {
		ch := w.cli.Watch(ctx, p, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for resp := range ch {
				if first {
					first = false
					if resp.Created && resp.Err() == nil {
						w.mu.Lock()
						w.pos[p] = resp.Header.Revision
						// Deletions between the last watch and this one
						// were not seen: remember none before it.
						w.recent[p].reset(resp.Header.Revision)
						w.stream = ctx
						w.deliveredLocked(p, resp.Header.Revision)
						w.mu.Unlock()
						created <- nil
						continue
					}
					created <- resp.Err()
				}
				select {
				case out <- response{p, resp}:
				case <-ctx.Done():
					return
				}
				if resp.Err() != nil {
					return
				}
			}
			if first {
				created <- errors.New("grantwatch: watch ended before it was created")
			}
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	for range w.prefixes {
		select {
		case err := <-created:
			if err != nil {
				return out, err
			}
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

// dispatch reports changes until the watch fails or ctx ends.
func (w *Watcher) dispatch(ctx context.Context, responses <-chan response) {
	for {
		select {
		case <-ctx.Done():
			return
		case resp, ok := <-responses:
			if !ok || resp.Err() != nil {
				return
			}
			w.changed(resp)
		}
	}
}

// changed reports one response's changes: the deletions to the Watch
// subscribers of their keys (a watch of a later incarnation of the key is
// not ended by an older deletion), every change to the Feeds of the
// prefixes above it. The position moves in the same critical section that
// picks the Feeds, so a Feed subscribed meanwhile either gets these
// changes or a position at or above them.
func (w *Watcher) changed(resp response) {
	var ended, revoked []*sub
	var fed map[*Feed][]*clientv3.Event // made for the first change a Feed takes
	w.mu.Lock()
	for _, ev := range resp.Events {
		key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
		if ev.Type == mvccpb.PUT {
			if entry, token, ok := markOf(resp.prefix, key, ev.Kv.Value); ok {
				w.recent[resp.prefix].add(entry, rev, true)
				for s := range w.subs[entry] {
					if s.createRev == token {
						revoked = append(revoked, s)
					}
				}
			}
		}
		if ev.Type == mvccpb.DELETE {
			w.recent[resp.prefix].add(key, rev, false)
			for s := range w.subs[key] {
				if s.createRev < rev {
					ended = append(ended, s)
					delete(w.subs[key], s)
				}
			}
			if len(w.subs[key]) == 0 {
				delete(w.subs, key)
			}
		}
		// Feeds of any prefix of key that ends at a "/".
		for i := 0; i < len(key) && len(w.feeds) > 0; i++ {
			if key[i] != '/' {
				continue
			}
			for f := range w.feeds[key[:i+1]] {
				if f.puts || ev.Type == mvccpb.DELETE {
					if fed == nil {
						fed = make(map[*Feed][]*clientv3.Event)
					}
					fed[f] = append(fed[f], ev)
				}
			}
		}
	}
	w.pos[resp.prefix] = max(w.pos[resp.prefix], resp.Header.Revision)
	w.mu.Unlock()
	for _, s := range revoked {
		s.revoke()
	}
	for _, s := range ended {
		s.end()
	}
	for f, evs := range fed {
		f.push(evs)
	}
	w.mu.Lock()
	w.deliveredLocked(resp.prefix, resp.Header.Revision)
	w.mu.Unlock()
}

// deliveredLocked notes that every change under prefix up to rev has been
// handed over, and wakes Sync. Called with w.mu held.
func (w *Watcher) deliveredLocked(prefix string, rev int64) {
	if rev <= w.delivered[prefix] {
		return
	}
	w.delivered[prefix] = rev
	close(w.moved)
	w.moved = make(chan struct{})
}

// progressEvery is how often Sync asks etcd again for the watch's
// progress: etcd answers only once every watch of the stream is synced.
const progressEvery = 50 * time.Millisecond

// Sync waits until every change under key's prefix up to revision rev has
// been handed to the Feeds and Watch subscribers (a Feed's owner then
// finds them all in Take), or ctx ends. When no change comes, it asks etcd
// for a progress notification, which moves the watch's position to etcd's
// current revision. A caller that read rev from etcd (linearizably) and
// then Syncs, and applies what its Feed holds, has a view of its prefix as
// of rev: a linearizable read served from a watch (as the Kubernetes watch
// cache serves consistent reads).
func (w *Watcher) Sync(ctx context.Context, key string, rev int64) error {
	p := w.prefixOf(key)
	var asked time.Time
	for {
		w.mu.Lock()
		done, moved, stream := w.delivered[p] >= rev, w.moved, w.stream
		w.mu.Unlock()
		if done {
			return nil
		}
		if stream != nil && stream.Err() == nil && time.Since(asked) >= progressEvery {
			// On the running watch's own stream (the same context key):
			// another context would open a stream of its own.
			_ = w.cli.RequestProgress(stream)
			asked = time.Now()
		}
		t := time.NewTimer(progressEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-moved:
		case <-t.C:
		}
		t.Stop()
	}
}

// restarted tells every Feed that the etcd watch started again, and its
// position.
func (w *Watcher) restarted() {
	w.mu.Lock()
	type at struct {
		f   *Feed
		pos int64
	}
	var all []at
	for prefix, m := range w.feeds {
		pos := w.pos[w.cover(prefix)]
		for f := range m {
			all = append(all, at{f, pos})
		}
	}
	w.mu.Unlock()
	for _, a := range all {
		a.f.restart(a.pos)
	}
}

// recheck reads every watched key after a restarted watch was created and
// reports those gone: a deletion between the old watch's failure and the
// new watch's start is found here.
func (w *Watcher) recheck(ctx context.Context) error {
	w.mu.Lock()
	var all []*sub
	for _, m := range w.subs {
		for s := range m {
			all = append(all, s)
		}
	}
	w.mu.Unlock()
	for _, s := range all {
		alive, marked, err := w.read(ctx, s)
		if err != nil {
			return err
		}
		switch {
		case !alive:
			w.remove(s)
			s.end()
		case marked:
			s.revoke()
		}
	}
	return nil
}
