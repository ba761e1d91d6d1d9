package clientlib

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// keepAlives is a client's one KeepAliveStream, shared by all of its
// sessions: however many sessions a client keeps, the member serves one
// stream (no goroutine or buffers per session there). Each session still
// runs its own renewal schedule and local deadline (Session.stream); the
// shared stream only carries the messages. When it breaks, every session
// on it sees that and rejoins a new one.
type keepAlives struct {
	c *Client

	mu      sync.Mutex
	cur     *kaStream     // the open stream, or nil
	opening chan struct{} // closed when the open under way ends; nil if none

	receivers sync.WaitGroup // every stream's receiver
}

// kaStream is one shared stream.
type kaStream struct {
	k      *keepAlives
	st     coorddv1.SessionService_KeepAliveStreamClient
	cancel context.CancelFunc
	addr   string // the member it talks to ("" if unknown)

	sendMu sync.Mutex // Send is not safe for concurrent use

	// Renewals are sent in batches of at most maxBatch (0: one by one)
	// once the server says it takes them, and how many fit in a message.
	maxBatch atomic.Int64
	// serverID is the stream's id on its member (its header says it; 0 from
	// a server that follows no grants): grants made there may be followed
	// on this stream from the start (keepalive_stream).
	serverID atomic.Uint64

	rmu    sync.Mutex
	recent recentEnds // the latest holdings reported ended; guarded by rmu
	bmu    sync.Mutex
	queued []string      // session ids whose renewals wait for the next batch
	kick   chan struct{} // signalled when queued grows

	mu      sync.Mutex
	members map[string]*kaMember // by session id
	err     error                // why it broke; set before done closes
	done    chan struct{}        // closed once it is broken
}

// kaMember is one session on a shared stream.
type kaMember struct {
	s    *Session
	acks chan *coorddv1.KeepAliveStreamResponse // its renewals' answers
}

// keepAliveBatchesHeader is the header with which a server says it takes
// batches of renewals (api.KeepAliveBatchesHeader).
const keepAliveBatchesHeader = "coordd-keepalive-batches"

// keepAliveStreamHeader is the header with which a server names the
// stream, for grants to follow on it (api.KeepAliveStreamHeader).
const keepAliveStreamHeader = "coordd-keepalive-stream"

// recentEnds remembers the last maxRecentEnds holdings a stream reported
// ended, and how many older ones it forgot.
type recentEnds struct {
	set     map[holdingID]struct{}
	order   []holdingID
	evicted int64
}

// maxRecentEnds bounds recentEnds. A grant's answer and the report of its
// end cross within a round trip; should more reports than this arrive
// meanwhile, the grant is named on the stream as if it were not followed
// (see Session.watch), so the bound costs a message, never a report.
const maxRecentEnds = 1024

func (r *recentEnds) add(id holdingID) {
	if r.set == nil {
		r.set = make(map[holdingID]struct{})
	}
	if _, ok := r.set[id]; ok {
		return
	}
	if len(r.order) == maxRecentEnds {
		delete(r.set, r.order[0])
		r.order = r.order[1:]
		r.evicted++
	}
	r.set[id] = struct{}{}
	r.order = append(r.order, id)
}

// evictions is how many reports the stream has forgotten so far.
func (ks *kaStream) evictions() int64 {
	ks.rmu.Lock()
	defer ks.rmu.Unlock()
	return ks.recent.evicted
}

// endedRecently reports whether the stream reported id ended lately.
func (ks *kaStream) endedRecently(id holdingID) bool {
	ks.rmu.Lock()
	defer ks.rmu.Unlock()
	_, ok := ks.recent.set[id]
	return ok
}

// sessions returns the sessions on the stream now, to hand reports to
// outside ks.mu.
func (ks *kaStream) sessions() []*kaMember {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ms := make([]*kaMember, 0, len(ks.members))
	for _, m := range ks.members {
		ms = append(ms, m)
	}
	return ms
}

// errStreamIdle ends a shared stream that no session uses any more.
var errStreamIdle = errors.New("coordd: keep-alive stream has no sessions left")

// join puts s on the client's shared stream, opening one if there is none
// (or it broke): one session opens it while the others wait, without
// holding anything a leaving session needs; waiting and opening give up
// when ctx (the session's loop) ends. Leave it with leave.
func (k *keepAlives) join(ctx context.Context, s *Session) (*kaStream, *kaMember, error) {
	m := &kaMember{s: s, acks: make(chan *coorddv1.KeepAliveStreamResponse, 1)}
	for {
		k.mu.Lock()
		if k.cur != nil && !k.cur.broken() {
			ks := k.cur
			ks.mu.Lock()
			ks.members[s.id] = m
			ks.mu.Unlock()
			k.mu.Unlock()
			return ks, m, nil
		}
		if wait := k.opening; wait != nil {
			k.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		k.opening = done
		k.mu.Unlock()
		ks, err := k.open(ctx)
		k.mu.Lock()
		k.opening = nil
		close(done)
		if err == nil {
			k.cur = ks
		}
		k.mu.Unlock()
		if err != nil {
			return nil, nil, err
		}
	}
}

// open starts a stream and its receiver; the stream lives until it fails
// or the client closes, but opening it gives up when ctx ends.
func (k *keepAlives) open(ctx context.Context) (*kaStream, error) {
	sctx, cancel := context.WithCancel(k.c.ctx)
	stop := context.AfterFunc(ctx, cancel)
	var p peer.Peer
	st, err := k.c.sessions.KeepAliveStream(sctx, grpc.Peer(&p))
	if !stop() {
		err = ctx.Err() // the stream is cancelled with it
	}
	if err != nil {
		cancel()
		return nil, err
	}
	ks := &kaStream{k: k, st: st, cancel: cancel, members: map[string]*kaMember{}, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	if pr, ok := peer.FromContext(st.Context()); ok && pr.Addr != nil {
		ks.addr = pr.Addr.String()
	}
	k.receivers.Go(ks.receive)
	k.receivers.Go(ks.sendBatches)
	return ks, nil
}

// batchWindow is how long a batch of renewals stays open after its first
// one: long enough for the renewals a client's sessions have aligned on
// one tick (see aligned) to join, short beside any session's interval. A
// renewal's local deadline counts from before it was queued, so the wait
// costs no safety.
const batchWindow = 2 * time.Millisecond

// maxBatch bounds the sessions one message renews (about 70 KiB of ids),
// whatever the server says fits.
const maxBatch = 4096

// renew sends a renewal of session id: in the next batch if the server
// takes batches, else on its own. A failure to send breaks the stream for
// every session on it.
func (ks *kaStream) renew(id string) error {
	if ks.maxBatch.Load() <= 1 {
		return ks.send(&coorddv1.KeepAliveStreamRequest{SessionId: id})
	}
	ks.bmu.Lock()
	ks.queued = append(ks.queued, id)
	ks.bmu.Unlock()
	select {
	case ks.kick <- struct{}{}:
	default:
	}
	return nil
}

// sendBatches owns the batches: it sends the renewals queued within
// batchWindow of the first as one request, until the stream breaks.
func (ks *kaStream) sendBatches() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ks.done:
			return
		case <-ks.kick:
		}
		t.Reset(batchWindow)
		select {
		case <-ks.done:
			return
		case <-t.C:
		}
		ks.bmu.Lock()
		ids := ks.queued
		ks.queued = nil
		ks.bmu.Unlock()
		for len(ids) > 0 {
			n := min(len(ids), int(ks.maxBatch.Load()))
			if err := ks.send(&coorddv1.KeepAliveStreamRequest{SessionIds: ids[:n]}); err != nil {
				return // send broke the stream; every session sees it
			}
			ids = ids[n:]
		}
	}
}

// receive owns Recv: it routes answers to their sessions and reports of
// ended holdings to every session (each keeps only its own), until the
// stream fails.
func (ks *kaStream) receive() {
	// A server that takes batches says so in its header, with how many
	// sessions fit in one; it sends the header at once (an older one
	// sends it with its first answer).
	if md, err := ks.st.Header(); err == nil {
		if v := md.Get(keepAliveBatchesHeader); len(v) > 0 {
			if n, err := strconv.Atoi(v[0]); err == nil && n > 1 {
				ks.maxBatch.Store(int64(min(n, maxBatch)))
			}
		}
		if v := md.Get(keepAliveStreamHeader); len(v) > 0 {
			if n, err := strconv.ParseUint(v[0], 10, 64); err == nil {
				ks.serverID.Store(n)
			}
		}
	}
	for {
		resp, err := ks.st.Recv()
		if err != nil {
			ks.fail(err)
			return
		}
		if asked := resp.GetRevoking(); len(asked) > 0 {
			for _, m := range ks.sessions() {
				m.s.holdingsRevoking(asked)
			}
		}
		if ended := resp.GetEnded(); len(ended) > 0 {
			// Remembered before they are handed out: a grant followed from
			// the start may be added to its session only after its end was
			// reported (Session.watch looks here).
			ks.rmu.Lock()
			for _, h := range ended {
				ks.recent.add(holdingID{kind: h.GetKind(), name: h.GetName(), token: h.GetToken()})
			}
			ks.rmu.Unlock()
			for _, m := range ks.sessions() {
				m.s.holdingsEnded(ended)
			}
		}
		if rs := resp.GetRenewals(); len(rs) > 0 {
			ks.mu.Lock()
			for _, r := range rs {
				if m := ks.members[r.GetSessionId()]; m != nil {
					select {
					case m.acks <- &coorddv1.KeepAliveStreamResponse{SessionId: r.GetSessionId(), Ttl: r.GetTtl(), Gone: r.GetGone()}:
					default: // an answer nobody waits for
					}
				}
			}
			ks.mu.Unlock()
			continue
		}
		if resp.GetTtl() == nil && !resp.GetGone() {
			continue
		}
		ks.mu.Lock()
		m := ks.members[resp.GetSessionId()]
		ks.mu.Unlock()
		if m == nil {
			continue // its session left the stream
		}
		select {
		case m.acks <- resp:
		default: // an answer nobody waits for
		}
	}
}

// send sends req on the stream. It fails with why the stream broke.
func (ks *kaStream) send(req *coorddv1.KeepAliveStreamRequest) error {
	req.Shared = true
	ks.sendMu.Lock()
	err := ks.st.Send(req)
	ks.sendMu.Unlock()
	if errors.Is(err, io.EOF) {
		// On a broken stream Send says only io.EOF; the receiver gets the
		// status from Recv.
		<-ks.done
		return ks.cause()
	}
	if err != nil {
		ks.fail(err)
	}
	return err
}

// fail breaks the stream for every session on it (the first reason
// wins); a session that found its member silent or slow gives it up for
// all of them. A stream that broke for a reason other than going idle
// makes the client avoid its member for a while (Client.avoid).
func (ks *kaStream) fail(err error) {
	ks.mu.Lock()
	first := ks.err == nil
	if first {
		ks.err = err
		close(ks.done)
	}
	ks.mu.Unlock()
	if !first {
		return
	}
	ks.cancel()
	if !errors.Is(err, errStreamIdle) && !errors.Is(err, errRerouted) && ks.k.c.ctx.Err() == nil && ks.addr != "" {
		ks.k.c.avoid(ks.addr, errors.Is(err, errSilent))
	}
}

// broken reports whether the stream failed.
func (ks *kaStream) broken() bool {
	select {
	case <-ks.done:
		return true
	default:
		return false
	}
}

// cause is why the stream broke (after done is closed).
func (ks *kaStream) cause() error {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.err
}

// leave takes m off the stream; the last session to leave closes it.
func (ks *kaStream) leave(m *kaMember) {
	k := ks.k
	k.mu.Lock()
	defer k.mu.Unlock()
	ks.mu.Lock()
	if ks.members[m.s.id] == m {
		delete(ks.members, m.s.id)
	}
	idle := len(ks.members) == 0
	ks.mu.Unlock()
	if idle {
		ks.fail(errStreamIdle)
		if k.cur == ks {
			k.cur = nil
		}
	}
}

// reroute breaks the current stream when the client moves to the member
// that leads etcd: its sessions rejoin a new one there at once.
func (k *keepAlives) reroute() { k.breakCurrent(errRerouted) }

// shutdown breaks the current stream and waits for every stream's
// receiver (Client.Close, once no session uses them).
func (k *keepAlives) shutdown() {
	k.breakCurrent(errStreamIdle)
	k.receivers.Wait()
}

// breakCurrent takes the current stream, if any, out of use and breaks it
// with err.
func (k *keepAlives) breakCurrent(err error) {
	k.mu.Lock()
	ks := k.cur
	k.cur = nil
	k.mu.Unlock()
	if ks != nil {
		ks.fail(err)
	}
}
