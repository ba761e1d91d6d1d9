package clientlib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// DefaultSessionTTL is the TTL of a session created without WithTTL: a
// crashed holder blocks others for at most this long.
const DefaultSessionTTL = 10 * time.Second

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl      time.Duration
	owner    string
	hostname string
	labels   map[string]string
}

// WithTTL sets the session's TTL (2s to 1h, rounded up to a whole second).
// A shorter TTL frees a crashed holder's locks sooner; a longer one rides
// out longer pauses. Defaults to DefaultSessionTTL.
func WithTTL(ttl time.Duration) SessionOption { return func(o *sessionOptions) { o.ttl = ttl } }

// WithOwner names the session's owner, shown wherever the session is
// described. Defaults to the program's name.
func WithOwner(owner string) SessionOption { return func(o *sessionOptions) { o.owner = owner } }

// WithLabels attaches free-form labels to the session.
func WithLabels(labels map[string]string) SessionOption {
	return func(o *sessionOptions) { o.labels = labels }
}

// Session is a coordd session kept alive in the background. Everything done
// on its behalf must stop when Done is closed. It is safe for concurrent
// use.
type Session struct {
	c      *Client
	id     string
	ttl    time.Duration
	margin time.Duration
	lg     *slog.Logger

	mu       sync.Mutex
	deadline time.Time   // local deadline; guarded by mu
	err      error       // why the session ended; nil while alive
	watchdog *time.Timer // fires at the local deadline

	done     chan struct{}   // closed when the session ends
	ctx      context.Context // cancelled, with the reason, when the session ends
	cancel   context.CancelCauseFunc
	stop     context.CancelFunc
	loopDone chan struct{} // closed when the keep-alive loop has exited

	// Holdings (locks, leaderships) whose end the keep-alive stream asks
	// the server to report.
	hmu      sync.Mutex
	holdings map[holdingID]*watchedHolding // guarded by hmu
	pending  []*coorddv1.Holding           // not yet named on the current stream; guarded by hmu
	announce chan struct{}                 // signalled when pending grows
	// named is the stream on which the holdings were named (its first
	// renewal named them all) while the session is on it; nil otherwise.
	// A grant that the server follows on it from the start (followed) need
	// not be named there; guarded by hmu.
	named *kaStream

	ids         requestIDs // request ids of released locks, to use again
	campaignIDs requestIDs // those of resigned campaigns
}

// holdingID identifies a holding in server reports.
type holdingID struct {
	kind  coorddv1.Holding_Kind
	name  string
	token int64
}

type watchedHolding struct {
	proto    *coorddv1.Holding
	ended    func()
	revoking func() // the server asks that the holding be given up; nil: ignore
}

// NewSession creates a session and starts keeping it alive. The keep-alive
// loop runs until Close, until the server reports the session gone, or
// until the local deadline passes without an acknowledged keep-alive.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: DefaultSessionTTL, owner: filepath.Base(os.Args[0])}
	o.hostname, _ = os.Hostname()
	for _, opt := range opts {
		opt(&o)
	}
	sent := time.Now()
	resp, err := c.sessions.CreateSession(ctx, &coorddv1.CreateSessionRequest{
		Ttl:      durationpb.New(o.ttl),
		Owner:    o.owner,
		Hostname: o.hostname,
		Labels:   o.labels,
	})
	if err != nil {
		return nil, convert(ctx, err)
	}
	ttl := resp.GetSession().GetTtl().AsDuration()
	s := &Session{
		c:        c,
		id:       resp.GetSession().GetId(),
		ttl:      ttl,
		margin:   safetyMargin(ttl),
		done:     make(chan struct{}),
		loopDone: make(chan struct{}),
		holdings: make(map[holdingID]*watchedHolding),
		announce: make(chan struct{}, 1),
	}
	s.lg = c.lg.With("session", s.id)
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.deadline = sent.Add(ttl - s.margin)
	loopCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if time.Until(s.deadline) <= 0 {
		// The answer came too late: the server may expire the session
		// before any keep-alive could reach it. Do not hand it out.
		stop()
		s.cancel(ErrSessionExpired)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = c.sessions.CloseSession(cctx, &coorddv1.CloseSessionRequest{SessionId: s.id, ByOwner: true})
		return nil, fmt.Errorf("%w: creating it took longer than its TTL minus the margin (%s)", ErrSessionExpired, ttl-s.margin)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stop()
		s.cancel(ErrSessionClosed)
		return nil, fmt.Errorf("%w: the client is closed", ErrSessionClosed)
	}
	c.live[s] = struct{}{}
	c.mu.Unlock()
	// From here Client.Close may end the session at any time; the loop must
	// run so that it can observe that and close loopDone.
	s.mu.Lock()
	if s.err == nil {
		s.watchdog = time.AfterFunc(time.Until(s.deadline), s.checkDeadline)
	}
	s.mu.Unlock()
	go s.keepAlive(loopCtx)
	return s, nil
}

// ID is the session's id (16 hexadecimal digits).
func (s *Session) ID() string { return s.id }

// TTL is the granted TTL.
func (s *Session) TTL() time.Duration { return s.ttl }

// Deadline is the local deadline: the send time of the last acknowledged
// keep-alive plus TTL minus the safety margin. The server cannot expire the
// session before it.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Done is closed when the session ends: closed, reported gone by the
// server, or past its local deadline.
func (s *Session) Done() <-chan struct{} { return s.done }

// Context returns a context that is cancelled when the session ends, no
// later than its local deadline; context.Cause tells why.
func (s *Session) Context() context.Context { return s.ctx }

// Err is nil while the session is alive, and afterwards says why it ended:
// ErrSessionClosed (Close, or its Client's Close), ErrSessionNotFound or
// ErrSessionExpired.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops the keep-alives and closes the session on the server,
// releasing everything attached to it. Closing a session that has already
// ended still asks the server to drop it, and succeeds if it is gone.
func (s *Session) Close(ctx context.Context) error {
	s.end(ErrSessionClosed)
	<-s.loopDone
	// By its owner: every holding's context ended with the session's.
	_, err := s.c.sessions.CloseSession(ctx, &coorddv1.CloseSessionRequest{SessionId: s.id, ByOwner: true})
	err = convert(ctx, err)
	if errors.Is(err, ErrSessionNotFound) {
		return nil
	}
	return err
}

// end records why the session ended (first reason wins), closes Done and
// stops the loop.
func (s *Session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.err = err
	if s.watchdog != nil {
		s.watchdog.Stop()
	}
	close(s.done)
	s.cancel(err)
	s.stop()
	s.c.mu.Lock()
	delete(s.c.live, s)
	s.c.mu.Unlock()
	if !errors.Is(err, ErrSessionClosed) {
		s.lg.Warn("coordd session lost", "err", err)
	}
	if errors.Is(err, ErrSessionExpired) {
		// The server may still have it, and hand its locks to nobody
		// until its lease runs out.
		s.c.revoke(s.id)
	}
}

// checkDeadline runs when the watchdog fires. A keep-alive acknowledged in
// the meantime moves the deadline and re-arms the watchdog instead.
func (s *Session) checkDeadline() {
	s.mu.Lock()
	left := time.Until(s.deadline)
	if left > 0 && s.err == nil {
		s.watchdog.Reset(left)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.end(ErrSessionExpired)
}

// extend moves the local deadline after an acknowledged keep-alive that was
// sent at sent and granted ttl.
func (s *Session) extend(sent time.Time, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return // ended: Deadline stays where the session was given up
	}
	if d := sent.Add(ttl - s.margin); d.After(s.deadline) {
		s.deadline = d
	}
}

func (s *Session) untilDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Until(s.deadline)
}

// safetyMargin is how long before send time + TTL the local deadline
// falls: max(250ms, TTL/10). It only has to cover the difference of the
// client's and the server's clock rates over one TTL (the server renews a
// lease when it processes a keep-alive, after the client sent it, and
// expires leases late, never early), so a tenth of the TTL is ample; a
// short margin leaves room to ride out an etcd leader election.
func safetyMargin(ttl time.Duration) time.Duration { return max(250*time.Millisecond, ttl/10) }

// interval is the pause between keep-alives: TTL/3, or TTL/6 for TTLs under
// 6s, with ±10% jitter so that sessions created together do not renew in
// lockstep. A session survives an outage of etcd's leader (an election)
// that ends within TTL - margin - interval of the last acknowledged
// keep-alive: 2.2s for a 3s TTL, enough for an election with etcd's default
// 1s election timeout (followers notice after 1-2s), 5.4s for 10s.
func (s *Session) interval() time.Duration {
	base := s.baseInterval()
	return base - base/10 + rand.N(base/5+1)
}

// baseInterval is the pause between keep-alives before jitter.
func (s *Session) baseInterval() time.Duration {
	if s.ttl < 6*time.Second {
		return s.ttl / 6
	}
	return s.ttl / 3
}

// alignTick is the wall-clock grid that renewals paused by about base are
// aligned on: the longest of 250ms, 125ms, 62.5ms, ... that is at most a
// sixteenth of base (0 below a millisecond). It depends on base alone, not
// on a session's jittered interval, so a client's sessions of one TTL
// renew on the same instants, and those of other TTLs on a grid that
// nests in or around theirs.
func alignTick(base time.Duration) time.Duration {
	tick := 250 * time.Millisecond
	for tick > base/16 && tick >= 2*time.Millisecond {
		tick /= 2
	}
	if tick > base/16 {
		return 0
	}
	return tick
}

// aligned is how long until the next renewal, due at due after a pause
// of interval: moved earlier (never later) onto a tick of the wall clock
// (see alignTick), so that the renewals of a client's many sessions go
// out together, in a few batches on their shared stream, instead of one
// message each.
func aligned(now, due time.Time, interval, tick time.Duration) time.Duration {
	if tick > 0 {
		if t := due.Truncate(tick); t.Sub(now) > interval/2 {
			due = t
		}
	}
	return due.Sub(now)
}

// minReplyWait is the least a keep-alive waits for its answer before the
// stream is given up for another endpoint (unless the local deadline comes
// first): short renewal intervals must not turn a slow disk into reconnects.
const minReplyWait = time.Second

// watch asks the server, on the keep-alive stream (this one and every
// later one), to report the end of h; ended runs once it does (on the
// stream's receiving goroutine; it must not block). on is the stream that
// already follows h since its grant (the grant said followed), or zero:
// on that stream, while the session's holdings are named on it and it has
// forgotten none of its reports since the grant was asked for, h is not
// named again (a new stream names every holding). unwatch forgets h: call
// it once h is given up or lost. gone says that the stream reported h
// ended before it was added here: ended does not run then.
func (s *Session) watch(h *coorddv1.Holding, report watchedHolding, on following) (unwatch func(), gone bool) {
	id := holdingID{kind: h.GetKind(), name: h.GetName(), token: h.GetToken()}
	w := &report
	w.proto = h
	s.hmu.Lock()
	s.holdings[id] = w
	followed := on.stream != 0 && s.named != nil && s.named.serverID.Load() == on.stream && s.named.evictions() == on.evicted
	if !followed {
		s.pending = append(s.pending, h)
	}
	// The server may have reported h's end on that stream before h was
	// added here: the stream remembers its latest reports.
	gone = followed && s.named.endedRecently(id)
	if gone {
		delete(s.holdings, id)
	}
	s.hmu.Unlock()
	if !followed {
		select {
		case s.announce <- struct{}{}:
		default:
		}
	}
	return func() {
		s.hmu.Lock()
		defer s.hmu.Unlock()
		if s.holdings[id] == w {
			delete(s.holdings, id)
		}
	}, gone
}

// following names the stream on which a grant is to be followed from the
// start: the server's id of it (0: none) and how many of its reports it
// had forgotten when the grant was asked for.
type following struct {
	stream  uint64
	evicted int64
}

// followStream is the stream on which the session's holdings are named,
// for a grant to be followed on from the start (and a release to stop
// that): zero if there is none or the server gives it no id.
func (s *Session) followStream() following {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.named == nil {
		return following{}
	}
	return following{stream: s.named.serverID.Load(), evicted: s.named.evictions()}
}

// holdingsRevoking handles the server's request that holdings be given up
// (a release or resignation from outside).
func (s *Session) holdingsRevoking(asked []*coorddv1.Holding) {
	var run []func()
	s.hmu.Lock()
	for _, h := range asked {
		id := holdingID{kind: h.GetKind(), name: h.GetName(), token: h.GetToken()}
		if w, ok := s.holdings[id]; ok && w.revoking != nil {
			run = append(run, w.revoking)
			s.lg.Info("coordd asks to give up a holding (released or resigned from outside)", "kind", h.GetKind(), "name", h.GetName(), "token", h.GetToken())
		}
	}
	s.hmu.Unlock()
	for _, f := range run {
		f()
	}
}

// holdingsEnded handles the server's report that holdings ended.
func (s *Session) holdingsEnded(ended []*coorddv1.Holding) {
	var run []func()
	s.hmu.Lock()
	for _, h := range ended {
		id := holdingID{kind: h.GetKind(), name: h.GetName(), token: h.GetToken()}
		if w, ok := s.holdings[id]; ok {
			delete(s.holdings, id)
			run = append(run, w.ended)
			s.lg.Info("coordd reports a holding ended from outside", "kind", h.GetKind(), "name", h.GetName(), "token", h.GetToken())
		}
	}
	s.hmu.Unlock()
	for _, f := range run {
		f()
	}
}

// toName returns the holdings added since the last call, to name on the
// stream they are named on.
func (s *Session) toName() []*coorddv1.Holding {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	p := s.pending
	s.pending = nil
	return p
}

// nameAllOn returns every holding, to name on a new stream, on, which is
// then the stream they are named on.
func (s *Session) nameAllOn(on *kaStream) []*coorddv1.Holding {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.pending = nil
	s.named = on
	out := make([]*coorddv1.Holding, 0, len(s.holdings))
	for _, w := range s.holdings {
		out = append(out, w.proto)
	}
	return out
}

// keepAlive is the session's background loop. It exits when ctx is
// cancelled, which end does.
func (s *Session) keepAlive(ctx context.Context) {
	defer close(s.loopDone)
	retry := 50 * time.Millisecond
	for {
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrSessionNotFound) {
			s.end(fmt.Errorf("%w (the server no longer has it)", ErrSessionNotFound))
			return
		}
		if errors.Is(err, errRerouted) {
			continue // at once, on the member the client moved to
		}
		s.lg.Warn("coordd keep-alive failed; retrying", "err", err, "deadline-in", s.untilDeadline().Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(retry, max(s.untilDeadline(), 0))):
		}
		// Keep-alives are cheap and the deadline is near: back off to a
		// quarter second at most, so the first one after an etcd election
		// goes out within 250ms of the new leader.
		retry = min(2*retry, 250*time.Millisecond)
	}
}

// errNoReply ends a stream whose keep-alive went unanswered; errSilent
// one whose member did not answer a health check either.
var (
	errNoReply = errors.New("no answer to a keep-alive in time")
	errSilent  = errors.New("no answer to a keep-alive nor to a health check")
)

// A keep-alive unanswered for suspectAfter has the member asked, on the
// same connection, whether it is there at all: a health check, which a
// member answers from memory, without etcd, even during an etcd leader
// election. No answer within livenessTimeout means the member is paused,
// cut off or gone, and the stream is given up at once (with the calls in
// flight on it, see Client.avoid), well before the keep-alive's own wait
// (minReplyWait) runs out.
//
// That is only worth it with another member to move to: a member that is
// merely slow (a starved CPU, a long link) answers health checks late too,
// and a client that gave up its only member's stream each time a renewal
// took longer than suspectAfter + livenessTimeout lost its session to a
// member that answered every renewal. A client with nowhere else to go
// (Client.elsewhere) waits for the answer as long as the keep-alive's own
// wait allows.
const (
	suspectAfter    = 200 * time.Millisecond
	livenessTimeout = 300 * time.Millisecond
)

// stream keeps the session alive over the client's shared KeepAliveStream
// until that stream fails, this session finds it wanting (no answer in
// time, a silent member: then it gives the stream up for every session on
// it), or ctx ends, and names the session's holdings on it so that the
// server reports their end. Each keep-alive waits for its answer at most
// until the next one is due or the local deadline, whichever comes first.
func (s *Session) stream(ctx context.Context) (err error) {
	ks, m, err := s.c.keepAlives.join(ctx, s)
	if err != nil {
		return convert(ctx, err)
	}
	defer ks.leave(m)
	defer s.forgetStream(ks)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() {
		if ctx.Err() == nil && err != nil && !errors.Is(err, ErrSessionNotFound) {
			if errors.Is(err, errNoReply) || errors.Is(err, errSilent) {
				s.c.stats.givenUp.Add(1)
			}
			ks.fail(err)
		}
	}()
	streamErr := func(err error) error { return s.streamErr(sctx, err) }
	addr := ks.addr // the member the stream talks to
	// Liveness checks run under sctx and are waited for before returning.
	var checks sync.WaitGroup
	defer checks.Wait()
	silent := make(chan time.Time, 1) // the keep-alive (its sent time) whose member stayed silent
	suspect := time.NewTimer(time.Hour)
	suspect.Stop()
	defer suspect.Stop()

	// Renew soon on a new stream, but not all of a client's sessions at
	// the same instant: they rejoin together after a break.
	timer := time.NewTimer(rand.N(max(min(s.interval()/4, s.untilDeadline()/4, 250*time.Millisecond), 0) + 1))
	defer timer.Stop()
	var next time.Duration
	var sent time.Time
	first, waiting := true, false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ks.done:
			return streamErr(ks.cause())
		case <-suspect.C:
			if !waiting || addr == "" || !s.c.elsewhere(addr) {
				continue // alone, a slow answer is still the one to wait for
			}
			checked := sent
			checks.Go(func() { s.c.reportSilent(sctx, addr, checked, silent) })
		case at := <-silent:
			if waiting && at.Equal(sent) {
				return errSilent
			}
		case <-s.announce:
			if err := s.announced(ks, first, timer); err != nil {
				return streamErr(err)
			}
		case resp := <-m.acks:
			if resp.GetGone() {
				return ErrSessionNotFound
			}
			if !waiting {
				continue
			}
			waiting = false
			suspect.Stop()
			s.extend(sent, resp.GetTtl().AsDuration())
			timer.Reset(aligned(time.Now(), sent.Add(next), next, alignTick(s.baseInterval())))
		case <-timer.C:
			if waiting {
				return errNoReply
			}
			next = s.interval()
			sent = time.Now()
			if err := s.renewOn(ks, first); err != nil {
				return streamErr(err)
			}
			first = false
			// An answer that does not come before the next renewal is due
			// (at least minReplyWait), or before the deadline, abandons this
			// stream for a new one.
			waiting = true
			suspect.Reset(suspectAfter)
			timer.Reset(min(max(next, minReplyWait), max(s.untilDeadline(), 0)))
		}
	}
}

// announced names new holdings on ks. Before the first keep-alive (which
// names them all) it sends that now rather than after its spread-out wait
// (timer), so that a holding taken right after the session began is
// followed at once.
func (s *Session) announced(ks *kaStream, first bool, timer *time.Timer) error {
	if !first {
		return s.nameNewOn(ks)
	}
	timer.Reset(0)
	return nil
}

// forgetStream drops ks as the stream the session's holdings are named
// on, when it is.
func (s *Session) forgetStream(ks *kaStream) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.named == ks {
		s.named = nil
	}
}

// streamErr is why the shared stream broke, for this session. A server
// that predates shared streams ends one with NotFound for any gone
// session: only the session it names is gone.
func (s *Session) streamErr(ctx context.Context, err error) error {
	err = convert(ctx, err)
	if errors.Is(err, ErrSessionNotFound) && !strings.Contains(err.Error(), s.id) {
		return fmt.Errorf("%w: the keep-alive stream ended for another session", ErrUnavailable)
	}
	return err
}

// renewOn sends the session's renewal on ks; the first on a stream also
// names every holding the member is to watch there.
func (s *Session) renewOn(ks *kaStream, first bool) error {
	if !first {
		return ks.renew(s.id)
	}
	all := s.nameAllOn(ks)
	err := ks.send(&coorddv1.KeepAliveStreamRequest{SessionId: s.id, Watch: all})
	s.c.stats.named.Add(int64(len(all)))
	return err
}

// nameNewOn names on ks the holdings gained since the stream's first
// renewal (a watch-only request; nothing if there are none).
func (s *Session) nameNewOn(ks *kaStream) error {
	w := s.toName()
	if len(w) == 0 {
		return nil
	}
	if err := ks.send(&coorddv1.KeepAliveStreamRequest{SessionId: s.id, Watch: w, WatchOnly: true}); err != nil {
		return err
	}
	s.c.stats.named.Add(int64(len(w)))
	return nil
}
