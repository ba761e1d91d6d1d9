package clientlib

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// DefaultDialTimeout is how long New waits for a first connection when
// Config.DialTimeout is zero.
const DefaultDialTimeout = 5 * time.Second

// Config configures a Client.
type Config struct {
	// Endpoints are coordd gRPC addresses (host:port). Required. The client
	// connects to one and fails over to the others when it becomes
	// unreachable. With more than one, it prefers the member whose etcd
	// member leads (see AnyMember).
	Endpoints []string
	// TLS, when set, connects over TLS. Nil means plaintext. For mutual
	// TLS, put the client certificate in TLS.Certificates.
	TLS *tls.Config
	// BearerToken, when set, is sent with every call ("authorization:
	// Bearer ...") to name the caller's principal. It is sent only over
	// TLS, or in plaintext to loopback endpoints; New refuses anything else.
	BearerToken string
	// DialTimeout bounds how long New waits for a first connection.
	// Optional, defaults to DefaultDialTimeout.
	DialTimeout time.Duration
	// NoWait makes New return at once, without waiting for a connection;
	// calls then wait for one. For apps that must start while coordd is
	// unreachable (Subscribe with a cache file).
	NoWait bool
	// Logger receives the SDK's warnings (keep-alive retries, lost
	// sessions). Optional, defaults to discarding them.
	Logger *slog.Logger
	// UnaryCalls sends every lock and election call as its own unary RPC.
	// By default they are pipelined on one stream per client
	// (SessionService.Calls), which costs both sides less per call; the
	// SDK falls back to unary RPCs by itself against a server without the
	// stream. For comparisons, and for proxies that pass no
	// bidirectional streams.
	UnaryCalls bool
	// AnyMember keeps the client on whichever member it connected to. By
	// default a client given several endpoints moves its calls and
	// keep-alives to the member whose embedded etcd member leads (it asks
	// each member's health service, coorddv1.LeaderHealthService): every
	// write goes through etcd's leader, so there they cost one hop less,
	// and a client is not slower than another for having drawn a follower.
	// It follows the leadership within a round trip of the member's report
	// (checked every 50ms) when it moves. Config watches and observations
	// already open stay where they are. Set AnyMember to spread clients
	// over the members instead (mostly readers, many of them), or against
	// an external etcd (where no member leads, it changes nothing).
	AnyMember bool
}

// Client is a connection to a coordd cluster. It is safe for concurrent
// use. Close it when done.
type Client struct {
	conn       *grpc.ClientConn
	resolver   *manual.Resolver
	endpoints  []string                    // in this client's own random order
	addrs      map[string]resolver.Address // by endpoint, as given to the resolver
	sessions   coorddv1.SessionServiceClient
	locks      coorddv1.LockServiceClient
	elections  coorddv1.ElectionServiceClient
	config     coorddv1.ConfigServiceClient
	cluster    coorddv1.ClusterServiceClient
	kv         coorddv1.KVServiceClient
	barriers   coorddv1.BarrierServiceClient
	history    coorddv1.HistoryServiceClient
	mux        *watchMux   // carries the config subscriptions
	keepAlives *keepAlives // carries the sessions' keep-alives
	calls      *calls      // carries the lock and election calls
	views      viewCache   // namespace views shared by the subscriptions
	dispatch   *dispatchPool
	// revealedViews are those of subscriptions that reveal secrets.
	revealedViews viewCache
	lg            *slog.Logger

	// probeDial connects a probe to one endpoint as conn connects.
	probeDial []grpc.DialOption
	// ctx lives until Close; probes run under it.
	ctx    context.Context
	cancel context.CancelFunc
	probes sync.WaitGroup
	// clusters is the cluster the endpoints answered for (clusterid.go).
	clusters clusters
	stats    stats // see Stats
	// revokes are closings of sessions given up on (see revoke); added
	// under mu while !closed, so Close can wait for them.
	revokes sync.WaitGroup
	// moved is cancelled (and replaced) whenever the client gives up on an
	// endpoint; calls in flight then retry elsewhere (see retry). Guarded
	// by mu.
	moved      context.Context
	movedEnded context.CancelFunc
	// silent holds the calls sent to the member in use (see callGroup):
	// it is ended (and replaced) whenever the client leaves an endpoint
	// that stopped answering altogether (see avoid); every unary call in
	// flight then ends with ErrUnavailable at once instead of waiting on a
	// member that may never answer. A move to the leading member (see
	// prefer) replaces it too, and the calls left behind are watched on
	// their own (see watchLeftBehind). Guarded by mu.
	silent *callGroup
	// rerouted is cancelled (and replaced) whenever the client moves to
	// the member that leads etcd (see prefer): the call stream and the
	// keep-alive stream move with it, unary calls in flight finish where
	// they are. Guarded by mu.
	rerouted      context.Context
	reroutedEnded context.CancelFunc

	mu        sync.Mutex
	live      map[*Session]struct{} // sessions whose keep-alive loop runs
	avoided   map[string]struct{}   // endpoints left out until a probe finds them serving
	preferred string                // the endpoint of the member leading etcd, when known
	closed    bool
}

// Stats counts what a client did since New: for logs and dashboards, and
// for tests that check the SDK did (or did not do) something. The counts
// only grow.
type Stats struct {
	// Moves is how many times the client moved to the member that leads
	// etcd (see Config.AnyMember).
	Moves int64
	// Probes is how many health checks it sent to endpoints it left out
	// because they stopped answering.
	Probes int64
	// HoldingsNamed is how many holdings (lock grants, terms) its sessions
	// named on keep-alive streams so that the member reports their end;
	// grants the member follows from the start are not named.
	HoldingsNamed int64
	// StreamsGivenUp is how many times one of its sessions gave the shared
	// keep-alive stream up because the member was slow (a keep-alive
	// answered too late, or a silent member), so that the next renewal
	// opened another.
	StreamsGivenUp int64
}

type stats struct{ moves, probes, named, givenUp atomic.Int64 }

// Stats returns what the client did since New.
func (c *Client) Stats() Stats {
	return Stats{Moves: c.stats.moves.Load(), Probes: c.stats.probes.Load(), HoldingsNamed: c.stats.named.Load(),
		StreamsGivenUp: c.stats.givenUp.Load()}
}

// Probing an avoided endpoint: the first probe after probeFirst, then
// backing off to probeEvery; each probe waits at most probeTimeout.
const (
	probeFirst   = 100 * time.Millisecond
	probeEvery   = time.Second
	probeTimeout = time.Second
)

// Flow-control windows, fixed: gRPC's estimate of the bandwidth-delay
// product sends a ping for about every round trip that carries data, and
// the SDK's traffic is round trips of small messages, where those pings
// (and their acks) cost about as many writes and reads as the calls
// themselves. The windows are what the estimate grows to for a large
// snapshot over a long link.
const (
	staticStreamWindow = 8 << 20
	staticConnWindow   = 16 << 20
)

var schemeSeq atomic.Int64

// New connects to coordd and waits, up to cfg.DialTimeout or until ctx ends,
// for a first endpoint to answer.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: Config.Endpoints is empty", ErrInvalidArgument)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	endpoints, addrs := endpointAddresses(cfg)
	// A manual resolver hands every endpoint to pick_first, which connects
	// to the first and moves to the next when it fails.
	r := manual.NewBuilderWithScheme(fmt.Sprintf("coordd-%d", schemeSeq.Add(1)))
	eps := make([]resolver.Endpoint, 0, len(endpoints))
	for _, a := range endpoints {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{addrs[a]}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	var lastDialErr atomic.Pointer[error]
	transport, perCall, err := dialOptions(cfg, &lastDialErr)
	if err != nil {
		return nil, err
	}
	c := &Client{
		resolver:  r,
		endpoints: endpoints,
		addrs:     addrs,
		lg:        cfg.Logger,
		probeDial: transport,
		live:      map[*Session]struct{}{},
		avoided:   map[string]struct{}{},
	}
	conn, err := grpc.NewClient(r.Scheme()+":///coordd", slices.Concat(transport, perCall, []grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"pick_first":{}}]}`),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithStaticStreamWindowSize(staticStreamWindow), grpc.WithStaticConnWindowSize(staticConnWindow),
		// Large namespaces make large snapshots.
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithChainUnaryInterceptor(retryReads, c.leaveSilent, c.checkCluster),
		grpc.WithChainStreamInterceptor(c.checkClusterStream),
	})...)
	if err != nil {
		return nil, fmt.Errorf("coordd: %w", err)
	}
	if err := waitConnected(ctx, conn, cfg, &lastDialErr); err != nil {
		_ = conn.Close() // never used; the dial's failure is the error to return
		return nil, err
	}
	c.start(ctx, conn, cfg)
	if len(c.endpoints) > 1 {
		if err := c.checkEndpoints(min(cfg.DialTimeout, endpointCheckWait)); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	return c, nil
}

// endpointCheckWait bounds how long New waits for the other endpoints to
// say which cluster they belong to.
const endpointCheckWait = 300 * time.Millisecond

// endpointAddresses returns the endpoints in this client's own random
// order (so that clients spread over the members) and the address the
// resolver is given for each.
func endpointAddresses(cfg Config) ([]string, map[string]resolver.Address) {
	endpoints := slices.Clone(cfg.Endpoints)
	rand.Shuffle(len(endpoints), func(i, j int) { endpoints[i], endpoints[j] = endpoints[j], endpoints[i] })
	addrs := make(map[string]resolver.Address, len(endpoints))
	for _, a := range endpoints {
		addr := resolver.Address{Addr: a}
		if cfg.TLS != nil && cfg.TLS.ServerName == "" {
			// Verify each endpoint's certificate against its own host,
			// not the channel's made-up authority.
			if host, _, err := net.SplitHostPort(a); err == nil {
				addr.ServerName = host
			}
		}
		addrs[a] = addr
	}
	return endpoints, addrs
}

// dialOptions returns how to reach an endpoint (the dialer and the
// transport credentials, which probes use too) and the per-call
// credentials (the bearer token, refused in plaintext off loopback). A
// failed dial is kept in lastErr, for the message when none succeeds.
func dialOptions(cfg Config, lastErr *atomic.Pointer[error]) (transport, perCall []grpc.DialOption, err error) {
	// Dial through endpointConn so a call's peer address names the endpoint
	// as configured, even when it is a host name.
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			lastErr.Store(&err)
			return nil, err
		}
		return &endpointConn{Conn: conn, ep: endpointAddr(addr), tls: cfg.TLS != nil, last: lastErr}, nil
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	transport = []grpc.DialOption{grpc.WithContextDialer(dial), grpc.WithTransportCredentials(creds)}
	if cfg.BearerToken == "" {
		return transport, nil, nil
	}
	if cfg.TLS == nil {
		for _, ep := range cfg.Endpoints {
			if !isLoopback(ep) {
				return nil, nil, fmt.Errorf("%w: a bearer token is sent only over TLS (Config.TLS) or to a loopback endpoint, not in plaintext to %s", ErrInvalidArgument, ep)
			}
		}
	}
	return transport, []grpc.DialOption{grpc.WithPerRPCCredentials(bearer(cfg.BearerToken))}, nil
}

// waitConnected waits until conn is connected to an endpoint, up to
// cfg.DialTimeout or until ctx ends (at once with cfg.NoWait). Its error
// names the last failed dial, if there was one.
func waitConnected(ctx context.Context, conn *grpc.ClientConn, cfg Config, lastDialErr *atomic.Pointer[error]) error {
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready && !cfg.NoWait; st = conn.GetState() {
		var wrong *wrongProtocolError
		if e := lastDialErr.Load(); st == connectivity.TransientFailure && e != nil && errors.As(*e, &wrong) && len(cfg.Endpoints) == 1 {
			// Retrying will not make it speak gRPC.
			return fmt.Errorf("%w: %w", ErrUnavailable, wrong)
		}
		if !conn.WaitForStateChange(dctx, st) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			last := ""
			if e := lastDialErr.Load(); e != nil {
				last = fmt.Sprintf(" (last attempt: %v)", *e)
			}
			return fmt.Errorf("%w: no endpoint of %v answered within %s%s%s", ErrUnavailable, cfg.Endpoints, cfg.DialTimeout, last, diagnoseTLS(cfg))
		}
	}
	return nil
}

// start sets the client up on its connection and starts what runs in its
// background: the search for the member that leads etcd.
func (c *Client) start(ctx context.Context, conn *grpc.ClientConn, cfg Config) {
	c.conn = conn
	c.sessions = coorddv1.NewSessionServiceClient(conn)
	c.calls = &calls{c: c, off: cfg.UnaryCalls}
	c.locks = lockCalls{coorddv1.NewLockServiceClient(conn), c.calls}
	c.elections = electionCalls{coorddv1.NewElectionServiceClient(conn), c.calls}
	c.config = coorddv1.NewConfigServiceClient(conn)
	c.cluster = coorddv1.NewClusterServiceClient(conn)
	c.kv = coorddv1.NewKVServiceClient(conn)
	c.barriers = barrierCalls{coorddv1.NewBarrierServiceClient(conn), c.calls}
	c.history = coorddv1.NewHistoryServiceClient(conn)
	// The client outlives New's ctx; Close ends what runs under c.ctx.
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.moved, c.movedEnded = context.WithCancel(c.ctx)
	c.silent = newCallGroup()
	c.rerouted, c.reroutedEnded = context.WithCancel(c.ctx)
	c.mux = newWatchMux(c)
	c.dispatch = newDispatchPool()
	c.keepAlives = &keepAlives{c: c}
	if len(c.endpoints) > 1 && !cfg.AnyMember {
		c.probes.Add(1)
		go c.followLeader()
	}
	if len(c.endpoints) > 1 {
		c.probes.Add(1)
		go c.followServing()
	}
}

// closeSessionsTimeout bounds how long Close tries to close the client's
// live sessions on the server.
const closeSessionsTimeout = 2 * time.Second

// Close closes the client's live sessions (they end with ErrSessionClosed,
// and the server releases what they hold at once; if that fails within
// 2s, they stay on the server until their TTL runs out), stops closing
// sessions given up on earlier, and closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	live := make([]*Session, 0, len(c.live))
	for s := range c.live {
		live = append(live, s)
	}
	c.closed = true
	c.mu.Unlock()
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), closeSessionsTimeout)
	for _, s := range live {
		wg.Go(func() { _ = s.Close(ctx) })
	}
	wg.Wait()
	cancel()
	c.cancel()
	c.keepAlives.shutdown()
	c.calls.shutdown()
	c.probes.Wait()
	c.revokes.Wait()
	c.mux.shutdown()
	c.dispatch.shutdown()
	err := c.conn.Close()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// callGroup is the calls in flight on one member: unary calls and call
// streams join it when they start and leave it when they end, and they
// end with errLeftSilent once the group is ended (the member stopped
// answering). A group's context has no parent: a group the client moved
// away from is simply dropped once its calls are done, and Close ends
// calls by closing the connection, not as a silent member.
type callGroup struct {
	ctx      context.Context // cancelled when the group is ended
	end      context.CancelFunc
	inFlight atomic.Int64
}

func newCallGroup() *callGroup {
	ctx, cancel := context.WithCancel(context.Background())
	return &callGroup{ctx: ctx, end: cancel}
}

// joinSilent adds a call to the group of the member in use; the caller
// calls leave when the call ends.
func (c *Client) joinSilent() (g *callGroup, leave func()) {
	c.mu.Lock()
	g = c.silent
	c.mu.Unlock()
	g.inFlight.Add(1)
	return g, func() { g.inFlight.Add(-1) }
}

// movedContext is cancelled when the client next gives up on an endpoint.
func (c *Client) movedContext() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.moved
}

// revoke closes session id on the server in the background, retrying while
// no member answers, until that succeeds, the server no longer has the
// session, or the client is closed. The SDK calls it for a session it gave
// up on (its local deadline passed without an acknowledged keep-alive), so
// that what the session holds or waits for is released as soon as any
// member is reachable, not when the server's lease runs out: after an etcd
// outage (no quorum, every member restarted) etcd gives every lease its
// whole TTL again.
func (c *Client) revoke(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.revokes.Add(1)
	go func() {
		defer c.revokes.Done()
		req := &coorddv1.CloseSessionRequest{SessionId: id, ByOwner: true} // everything under it ended here
		_, err := c.retry(c.ctx, releaseAttempt, func(ctx context.Context) error {
			_, err := c.sessions.CloseSession(ctx, req)
			return err
		})
		switch {
		case err == nil:
			c.lg.Info("coordd session given up on was closed on the server", "session", id)
		case errors.Is(err, ErrSessionNotFound), c.ctx.Err() != nil:
		default:
			c.lg.Warn("coordd: closing a session given up on", "session", id, "err", err)
		}
	}()
}

// avoid leaves the endpoint out of the connection's addresses, so
// pick_first moves to another endpoint, until a probe finds it serving
// again. It is how the SDK gets away from a member that stopped answering
// without closing its connections (a partition, a paused process), which
// gRPC's own keepalive would notice only after 15s. silent says the member
// did not answer at all (not even a health check, see Session.stream):
// unary calls in flight then end at once with ErrUnavailable (see
// leaveSilent) rather than wait for a member that may never answer.
//
// Which endpoint is used next: pick_first takes the endpoints that are not
// avoided, in a shuffled order, and moves to the next when one fails to
// connect. An avoided endpoint is probed (gRPC health check, at most 1s
// each) after 100ms, then with backoff to once a second, and used again as
// soon as it answers SERVING: a member answers so only while its etcd
// member can commit, so a member that was merely slow during an etcd
// leader election comes back within about one probe of the new leader. With
// every endpoint avoided, all of them are used while the probes go on.
//
// The other endpoints are then asked once (a health check each, on
// connections of their own) and those that answer NOT_SERVING are avoided
// too: when a member is cut off from its peers, the member a client leaves
// for lack of renewals is as often one of the majority (its renewals were
// forwarded to the cut-off leader until it learned of the new one) as the
// cut-off one, and moving onto the cut-off member would cost the client
// another move, and its sessions their time.
func (c *Client) avoid(endpoint string, silent bool) {
	c.avoidFor(endpoint, silent, "not answering")
}

// whyNotServing is why the client leaves a member that says NOT_SERVING.
const whyNotServing = "not serving (its member cannot commit)"

// avoidFor is avoid, logging why the endpoint is left.
func (c *Client) avoidFor(endpoint string, silent bool, why string) {
	if c.leave(endpoint, silent, why) {
		c.probes.Add(1)
		go c.avoidNotServing()
	}
}

// leave avoids endpoint (see avoid); it reports false when the endpoint was
// avoided already or cannot be (a single endpoint, a closed client).
func (c *Client) leave(endpoint string, silent bool, why string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.avoided[endpoint]; ok || c.closed || len(c.endpoints) < 2 || !slices.Contains(c.endpoints, endpoint) {
		return false
	}
	c.lg.Warn("coordd endpoint "+why+"; using the others until it serves again", "endpoint", endpoint, "silent", silent)
	c.avoided[endpoint] = struct{}{}
	c.updateAddressesLocked()
	c.movedEnded()
	c.moved, c.movedEnded = context.WithCancel(c.ctx)
	if silent {
		c.silent.end()
		c.silent = newCallGroup()
	}
	c.probes.Add(1)
	go func() {
		defer c.probes.Done()
		if c.probe(endpoint) {
			c.readmit(endpoint)
		}
	}()
	return true
}

// avoidNotServing asks every endpoint not avoided, at once, whether its
// member serves, and avoids those that answer NOT_SERVING (an endpoint
// that does not answer is left to pick_first and the keep-alive).
func (c *Client) avoidNotServing() {
	defer c.probes.Done()
	c.mu.Lock()
	var ask []string
	for _, ep := range c.endpoints {
		if _, avoided := c.avoided[ep]; !avoided {
			ask = append(ask, ep)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, ep := range ask {
		wg.Go(func() {
			if c.notServing(ep) {
				c.leave(ep, false, whyNotServing)
			}
		})
	}
	wg.Wait()
}

// notServing asks endpoint, on a connection of its own, and reports
// whether its member answered NOT_SERVING.
func (c *Client) notServing(endpoint string) bool {
	st, ok := c.askHealth(endpoint, "")
	return ok && st == healthpb.HealthCheckResponse_NOT_SERVING
}

// errLeftSilent ends a unary call in flight when the client leaves a
// member that stopped answering.
var errLeftSilent = errors.New("coordd: the member stopped answering and the client moved to another")

// leaveSilent is the connection's unary interceptor: a call in flight when
// the client leaves a silent member (see avoid) ends at once with
// codes.Unavailable; whether it took effect is unknown, as after any lost
// answer. Idempotent calls retry (see retry); others return ErrUnavailable.
func (c *Client) leaveSilent(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	silent, leave := c.joinSilent()
	defer leave()
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(silent.ctx, func() { cancel(errLeftSilent) })
	defer stop()
	err := invoker(cctx, method, req, reply, cc, opts...)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errLeftSilent) {
		return status.Error(codes.Unavailable, errLeftSilent.Error()+" during the call; its outcome is unknown")
	}
	return err
}

// elsewhere reports whether the client has a member other than addr to
// move to: another endpoint that it does not avoid.
func (c *Client) elsewhere(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range c.endpoints {
		if _, avoided := c.avoided[ep]; ep != addr && !avoided {
			return true
		}
	}
	return false
}

// silentMember reports whether the member at addr left a health check on
// the connection unanswered for livenessTimeout. It is false whenever that
// is not certain: the check went to another member (the connection moved),
// or failed otherwise.
func (c *Client) silentMember(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, livenessTimeout)
	defer cancel()
	var p peer.Peer
	_, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false), grpc.Peer(&p))
	return status.Code(err) == codes.DeadlineExceeded && ctx.Err() != nil && p.Addr != nil && p.Addr.String() == addr
}

// reportSilent sends sent on silent (without blocking) when the member at
// addr leaves a health check unanswered (see silentMember).
func (c *Client) reportSilent(ctx context.Context, addr string, sent time.Time, silent chan<- time.Time) {
	if c.silentMember(ctx, addr) {
		select {
		case silent <- sent:
		default:
		}
	}
}

// probe checks endpoint until it answers SERVING (true) or the client is
// closed (false).
func (c *Client) probe(endpoint string) bool {
	conn, err := grpc.NewClient("passthrough:///"+endpoint, c.probeDial...)
	if err != nil {
		return !c.sleep(probeEvery) // cannot happen with a valid target; readmit after a pause
	}
	defer func() { _ = conn.Close() }() // a probe connection; nothing to report
	health := healthpb.NewHealthClient(conn)
	for wait := probeFirst; ; wait = min(2*wait, probeEvery) {
		if c.sleep(wait) {
			return false
		}
		ctx, cancel := context.WithTimeout(c.ctx, probeTimeout)
		c.stats.probes.Add(1)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return true
		}
	}
}

// sleep waits for d; it reports true, at once, when the client closes.
func (c *Client) sleep(d time.Duration) (closed bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		return true
	case <-t.C:
		return false
	}
}

// readmit puts an avoided endpoint back among the connection's addresses.
func (c *Client) readmit(endpoint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	delete(c.avoided, endpoint)
	c.lg.Info("coordd endpoint serving again", "endpoint", endpoint)
	c.updateAddressesLocked()
}

// updateAddressesLocked hands the resolver every endpoint not avoided, or
// all of them when every one is; the preferred one (the member leading
// etcd) first, when it is not avoided.
func (c *Client) updateAddressesLocked() {
	var eps []resolver.Endpoint
	add := func(a string) { eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{c.addrs[a]}}) }
	_, avoided := c.avoided[c.preferred]
	if c.preferred != "" && !avoided {
		add(c.preferred)
	}
	for _, a := range c.endpoints {
		if _, ok := c.avoided[a]; !ok && a != c.preferred {
			add(a)
		}
	}
	if len(eps) == 0 {
		for _, a := range c.endpoints {
			add(a)
		}
	}
	c.resolver.UpdateState(resolver.State{Endpoints: eps})
}

// endpointAddr is a net.Addr that prints as the endpoint it was dialed by.
type endpointAddr string

func (a endpointAddr) Network() string { return "tcp" }
func (a endpointAddr) String() string  { return string(a) }

// endpointConn reports its endpoint as its remote address.
// It also looks at the first bytes the server sends: a server that
// answers in another protocol than gRPC's HTTP/2 (coordd's HTTP port, or
// a TLS server to a plaintext client) is named in last as a
// wrongProtocolError, which ends New's wait at once.
type endpointConn struct {
	net.Conn
	ep   endpointAddr
	tls  bool // the client speaks TLS on it
	last *atomic.Pointer[error]
	read bool // the first bytes were looked at (Read has one caller)
}

func (c *endpointConn) RemoteAddr() net.Addr { return c.ep }

func (c *endpointConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.read && n > 0 {
		c.read = true
		if werr := wrongProtocol(p[:n], string(c.ep), c.tls); werr != nil {
			c.last.Store(&werr)
			return 0, werr // nothing gRPC can use: the dial fails now
		}
	}
	return n, err
}

// wrongProtocolError: an endpoint answered in a protocol that is not
// gRPC's; retrying will not help.
type wrongProtocolError struct{ msg string }

func (e *wrongProtocolError) Error() string { return e.msg }

// wrongProtocol tells from the first bytes an endpoint sent whether it
// speaks another protocol than the client (nil: it may be gRPC).
func wrongProtocol(first []byte, ep string, clientTLS bool) error {
	// Under TLS the first bytes are the server's handshake, which can
	// look like an HTTP/2 SETTINGS frame by chance (a record of 1,024 to
	// 1,279 bytes, a certificate holding 0xc0dd): only a plaintext
	// client reads coordd's HTTP port's settings.
	if port, ok := httpPortSettings(first); ok && !clientTLS {
		return &wrongProtocolError{fmt.Sprintf("%s is coordd's HTTP port (REST and the console), it says; clients need its gRPC port, %d (coordd --grpc-addr)", ep, port)}
	}
	switch {
	case bytes.HasPrefix(first, []byte("HTTP/")):
		return &wrongProtocolError{fmt.Sprintf("%s answered in HTTP/1, not gRPC: it looks like coordd's HTTP port (REST and the console); clients need its gRPC port (coordd --grpc-addr, 7420 by default)", ep)}
	case !clientTLS && len(first) > 0 && (first[0] == 0x15 || first[0] == 0x16):
		return &wrongProtocolError{fmt.Sprintf("%s answered in TLS: the server takes TLS connections only; give the client TLS (coordctl --cacert, clientlib Config.TLS)", ep)}
	}
	return nil
}

// settingGRPCPort is the HTTP/2 setting by which coordd's HTTP port names
// its gRPC port to a plaintext HTTP/2 client (the daemon's
// SettingGRPCPort; HTTP/2 peers ignore settings they do not know).
const settingGRPCPort = 0xc0dd

// httpPortSettings reports whether first begins with an HTTP/2 SETTINGS
// frame that carries settingGRPCPort, and its value.
func httpPortSettings(first []byte) (uint32, bool) {
	const header = 9 // length (3), type (1), flags (1), stream (4)
	if len(first) < header || first[3] != 0x4 || first[4]&0x1 != 0 {
		return 0, false
	}
	n := int(first[0])<<16 | int(first[1])<<8 | int(first[2])
	payload := first[header:min(len(first), header+n)]
	for i := 0; i+6 <= len(payload); i += 6 {
		if id := int(payload[i])<<8 | int(payload[i+1]); id == settingGRPCPort {
			return uint32(payload[i+2])<<24 | uint32(payload[i+3])<<16 | uint32(payload[i+4])<<8 | uint32(payload[i+5]), true
		}
	}
	return 0, false
}

// bearer sends a bearer token with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that a token can go to a loopback
// endpoint in plaintext; New refuses plaintext to any other.
func (bearer) RequireTransportSecurity() bool { return false }

// isLoopback reports whether a host:port endpoint is on this host.
func isLoopback(endpoint string) bool {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		host = endpoint
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// diagnoseTLS says why a TLS connection to the first endpoint fails, for
// New's error when no endpoint answered: gRPC keeps the handshake's error
// to itself, and a refused client certificate (missing, untrusted,
// expired) only shows as an alert on the first read. Empty without TLS or
// when the handshake and a first read succeed.
func diagnoseTLS(cfg Config) string {
	if cfg.TLS == nil {
		return ""
	}
	tc := cfg.TLS.Clone()
	tc.NextProtos = []string{"h2"}
	if tc.ServerName == "" {
		if host, _, err := net.SplitHostPort(cfg.Endpoints[0]); err == nil {
			tc.ServerName = host
		}
	}
	d := &net.Dialer{Timeout: time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", cfg.Endpoints[0], tc)
	if err != nil {
		return fmt.Sprintf(" (TLS to %s: %v)", cfg.Endpoints[0], err)
	}
	defer func() { _ = conn.Close() }()
	// A server that refuses our certificate says so on the first read; one
	// that accepts it sends its HTTP/2 settings.
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Sprintf(" (TLS to %s: the server refused the connection: %v; check the client certificate: it must be signed by the server's --client-ca-file and valid now)", cfg.Endpoints[0], err)
	}
	return ""
}
