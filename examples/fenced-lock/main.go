// Command fenced-lock shows why a lock needs a fencing token: several
// worker processes increment a counter kept by a small HTTP store, each
// under a coordd lock, and the store refuses any write whose
// Coordd-Fence-Token is older than one it has seen. A worker paused
// while holding the lock (here: SIGSTOP, as a long GC pause would) loses
// the lock when its session expires; when it wakes, its late write is
// refused instead of overwriting a newer one.
//
// With coordd running (see the README), build the example first, then
// start the store and two workers in the background. Build first: with
// "go run ... &", $! is the go command rather than the program (signals
// would miss it), and each process starts only once it has compiled.
//
//	go build -o bin/fenced-lock ./examples/fenced-lock
//	bin/fenced-lock -mode store -listen 127.0.0.1:8090 & STORE=$!
//	bin/fenced-lock -mode worker -store http://127.0.0.1:8090 -id a -work 2s & A=$!
//	bin/fenced-lock -mode worker -store http://127.0.0.1:8090 -id b & B=$!
//
// Each process prints its PID first ("store: pid 4711, listening on ...",
// "worker a: pid 4712"). A worker waits up to 10s (-wait) for coordd and
// the store to answer, so the order in which they start does not matter.
// Worker a takes 2s per increment, so it holds the lock most of the time.
// Pause it for longer than its session TTL (5s), then resume it:
//
//	kill -STOP $A; sleep 8; kill -CONT $A
//
// and watch worker a print "write refused: stale fencing token" (if it was
// paused while waiting for the lock instead, it just starts a new session:
// pause it again). Stop all three with:
//
//	kill $A $B $STORE
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

func main() {
	mode := flag.String("mode", "worker", "store or worker")
	listen := flag.String("listen", "127.0.0.1:8090", "store: listen address")
	storeURL := flag.String("store", "http://127.0.0.1:8090", "worker: the store's URL")
	endpoints := flag.String("endpoints", envOr("COORDD_ENDPOINTS", "127.0.0.1:7420"), "worker: coordd gRPC endpoints, comma-separated")
	id := flag.String("id", strconv.Itoa(os.Getpid()), "worker: name in the output")
	rounds := flag.Int("rounds", 0, "worker: increments to make; 0 runs until interrupted")
	work := flag.Duration("work", 200*time.Millisecond, "worker: time between reading and writing the counter")
	ttl := flag.Duration("ttl", 5*time.Second, "worker: session TTL")
	wait := flag.Duration("wait", 10*time.Second, "worker: how long to wait at start for coordd and the store to answer")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch *mode {
	case "store":
		err = serveStore(ctx, *listen, os.Stdout)
	case "worker":
		err = runWorker(ctx, os.Stdout, workerConfig{endpoints: strings.Split(*endpoints, ","), store: *storeURL, id: *id, rounds: *rounds, work: *work, ttl: *ttl, wait: *wait})
	default:
		err = fmt.Errorf("-mode must be store or worker")
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "fenced-lock:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// store is the protected resource: a counter that only accepts writes
// whose fencing token is at least the highest it has accepted.
type store struct {
	mu      sync.Mutex
	value   int
	token   fencing.Token
	refused int
}

func (s *store) handler() http.Handler {
	var guard fencing.Guard
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		// A failed write of an answer means the client is gone; here and below.
		_ = json.NewEncoder(w).Encode(map[string]any{"value": s.value, "token": s.token, "refused": s.refused, "highest": guard.Highest("counter")})
	})
	// Reads and writes of the counter pass through fencing.Middleware: 409
	// for a stale token, 400 for a missing one. Fencing the read too makes
	// read-modify-write safe: once the next holder has read, every write
	// of an older holder is refused, whenever it arrives.
	fenced := func(next http.HandlerFunc) http.Handler {
		return fencing.Middleware(&guard, func(*http.Request) string { return "counter" }, next)
	}
	mux.Handle("GET /counter", fenced(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"value": s.value})
	}))
	put := fenced(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Value int }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		t, _ := fencing.FromRequest(r)
		s.mu.Lock()
		s.value, s.token = body.Value, t
		s.mu.Unlock()
	}))
	mux.Handle("PUT /counter", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: 200}
		put.ServeHTTP(rec, r)
		if rec.code == http.StatusConflict {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
		}
	}))
	return mux
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) { r.code = code; r.ResponseWriter.WriteHeader(code) }

func serveStore(ctx context.Context, addr string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: (&store{}).handler(), ReadHeaderTimeout: 5 * time.Second}
	logf(out, "store: pid %d, listening on http://%s\n", os.Getpid(), ln.Addr())
	go func() { <-ctx.Done(); _ = srv.Close() }() // Serve then returns ErrServerClosed
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return ctx.Err()
}

type workerConfig struct {
	endpoints []string
	store, id string
	rounds    int
	work, ttl time.Duration
	wait      time.Duration // at start, for coordd and the store
}

// runWorker increments the store's counter under the lock, rounds times.
func runWorker(ctx context.Context, out io.Writer, cfg workerConfig) error {
	logf(out, "worker %s: pid %d\n", cfg.id, os.Getpid())
	// coordd and the store may still be starting: wait for both, within
	// one bound, instead of failing on the first refused connection.
	deadline := time.Now().Add(cfg.wait)
	var c *clientlib.Client
	err := retryUntil(ctx, deadline, func(ctx context.Context) (err error) {
		c, err = clientlib.New(ctx, clientlib.Config{Endpoints: cfg.endpoints, DialTimeout: time.Second})
		return err
	}, func(err error) bool { return errors.Is(err, clientlib.ErrUnavailable) },
		func(err error) { logf(out, "worker %s: waiting for coordd: %v\n", cfg.id, err) })
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // done with it; nothing to report
	err = retryUntil(ctx, deadline, func(ctx context.Context) error { return pingStore(ctx, cfg.store) },
		func(err error) bool { return !errors.Is(err, errStoreAnswer) },
		func(err error) { logf(out, "worker %s: waiting for the store: %v\n", cfg.id, err) })
	if err != nil {
		return err
	}
	for i := 0; cfg.rounds == 0 || i < cfg.rounds; i++ {
		// A fresh session per round: a worker that lost its session (it
		// was paused) gets a new one.
		sess, err := c.NewSession(ctx, clientlib.WithTTL(cfg.ttl), clientlib.WithOwner("fenced-lock worker "+cfg.id))
		if err != nil {
			return err
		}
		err = clientlib.RunLocked(ctx, sess, "examples/counter", func(lctx context.Context, l *clientlib.Lock) error {
			token := l.Token()
			v, err := readCounter(lctx, cfg.store, token)
			if errors.Is(err, errStale) {
				logf(out, "worker %s: read refused: stale fencing token %s\n", cfg.id, token)
				return nil
			}
			if err != nil && lctx.Err() != nil {
				// Paused during the read: the lock was lost meanwhile.
				logf(out, "worker %s: lock lost during the read (token %s)\n", cfg.id, token)
				return nil
			}
			if err != nil {
				return err
			}
			logf(out, "worker %s: read counter %d with token %s; working for %s\n", cfg.id, v, token, cfg.work)
			time.Sleep(cfg.work) // the work; a pause here is what fencing is for
			// Deliberately not checking lctx here: the store's check is
			// the one that matters, and this shows it working.
			switch err := writeCounter(cfg.store, token, v+1); {
			case errors.Is(err, errStale):
				logf(out, "worker %s: write refused: stale fencing token %s\n", cfg.id, token)
			case err != nil:
				return err
			default:
				logf(out, "worker %s: counter %d -> %d with token %s\n", cfg.id, v, v+1, token)
			}
			return nil
		})
		// A session that does not close expires after its TTL.
		_ = sess.Close(context.WithoutCancel(ctx))
		// A session that ended (the worker was paused past its TTL) is
		// replaced in the next round; anything else is a failure.
		if err != nil && ctx.Err() == nil && !errors.Is(err, clientlib.ErrSessionExpired) && !errors.Is(err, clientlib.ErrSessionNotFound) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// retryUntil calls try until it succeeds, fails with an error retryable
// does not accept, ctx ends, or the next attempt would start after
// deadline. Attempts are 100ms apart at first, doubling up to 1s. waiting
// is told about the first failure, so a wait is never silent.
func retryUntil(ctx context.Context, deadline time.Time, try func(context.Context) error, retryable func(error) bool, waiting func(error)) error {
	began, delay := time.Now(), 100*time.Millisecond
	for attempt := 0; ; attempt++ {
		err := try(ctx)
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return err
		}
		if time.Now().Add(delay).After(deadline) {
			return fmt.Errorf("gave up waiting after %s: %w", time.Since(began).Round(100*time.Millisecond), err)
		}
		if attempt == 0 {
			waiting(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

var (
	errStale       = errors.New("stale fencing token")
	errStoreAnswer = errors.New("unexpected answer from the store")
)

// pingStore checks that the store answers; a transport error (connection
// refused while it starts) is worth retrying, a wrong answer is not.
func pingStore(ctx context.Context, store string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", store+"/status", nil)
	if err != nil {
		return fmt.Errorf("%w: %s", errStoreAnswer, err.Error())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	// Drained so that the connection can be reused; only the status counts.
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: GET %s/status: %s", errStoreAnswer, store, resp.Status)
	}
	return nil
}

// logf prints a line of the example's progress. The output is a log for
// whoever watches: a failed write is no reason to stop (and on a closed
// stdout pipe the write raises SIGPIPE anyway).
func logf(out io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(out, format, args...)
}

func readCounter(ctx context.Context, store string, token fencing.Token) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", store+"/counter", nil)
	fencing.SetHeader(req, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }() // only read
	if resp.StatusCode == http.StatusConflict {
		return 0, errStale
	}
	var body struct{ Value int }
	return body.Value, json.NewDecoder(resp.Body).Decode(&body)
}

// writeCounter writes without the lock's context: a late write must reach
// the store, so the store can refuse it.
func writeCounter(store string, token fencing.Token, v int) error {
	req, _ := http.NewRequest("PUT", store+"/counter", strings.NewReader(fmt.Sprintf(`{"value":%d}`, v)))
	fencing.SetHeader(req, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // only read
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusConflict:
		return errStale
	}
	msg, _ := io.ReadAll(resp.Body)
	return fmt.Errorf("store: %s: %s", resp.Status, msg)
}
