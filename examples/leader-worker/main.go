// Command leader-worker runs a batch job on exactly one of several
// processes at a time: each campaigns with clientlib.RunAsLeader, the
// leader works, the others stand by, and when the leader dies (or loses
// its session) another takes over within its session TTL.
//
// With coordd running (see the README), build it first, so that $! is
// the worker itself and not a "go run" that would survive a signal meant
// for the worker, then start two workers in the background:
//
//	go build -o bin/leader-worker ./examples/leader-worker
//	bin/leader-worker -id a & A=$!
//	bin/leader-worker -id b & B=$!
//
// Each prints its PID first ("worker a: pid 4712"); one of them then
// prints "leading (term N)" and its batch steps. Kill the leader without
// letting it resign, and the other takes over once the leader's session
// expires, about its TTL (3s, -ttl) later:
//
//	kill -9 $A      # if a leads; otherwise kill -9 $B
//
// Stop the one left with kill (SIGTERM: a leader resigns at once, and
// RunAsLeader returns).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

func main() {
	endpoints := flag.String("endpoints", envOr("COORDD_ENDPOINTS", "127.0.0.1:7420"), "coordd gRPC endpoints, comma-separated")
	id := flag.String("id", strconv.Itoa(os.Getpid()), "this worker's name")
	ttl := flag.Duration("ttl", 3*time.Second, "session TTL: how long a dead leader keeps the others waiting")
	step := flag.Duration("step", 500*time.Millisecond, "time per batch step")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, strings.Split(*endpoints, ","), *id, *ttl, *step); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "leader-worker:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, out io.Writer, endpoints []string, id string, ttl, step time.Duration) error {
	logf(out, "worker %s: pid %d\n", id, os.Getpid())
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // done with it; nothing to report
	logf(out, "worker %s: standing by\n", id)
	return c.RunAsLeader(ctx, "examples/batch", id, func(leaderCtx context.Context, lead *clientlib.Leadership) error {
		term := lead.Term()
		// The job: one step at a time, only while leading. Pass term to
		// anything the job writes, so a deposed leader's late writes are
		// refused (see examples/fenced-lock).
		for n := 1; ; n++ {
			select {
			case <-leaderCtx.Done():
				return nil
			case <-time.After(step):
				logf(out, "worker %s: batch step %d (term %s)\n", id, n, term)
			}
		}
	},
		clientlib.WithElectionSession(clientlib.WithTTL(ttl), clientlib.WithOwner("leader-worker "+id)),
		clientlib.OnElected(func(term fencing.Token) { logf(out, "worker %s: leading (term %s)\n", id, term) }),
		clientlib.OnDemoted(func(term fencing.Token, why error) {
			if why == nil {
				logf(out, "worker %s: done, resigned (term %s)\n", id, term)
				return
			}
			logf(out, "worker %s: no longer leading (term %s): %v\n", id, term, why)
		}))
}

// logf prints a line of the example's progress. The output is a log for
// whoever watches: a failed write is no reason to stop (and on a closed
// stdout pipe the write raises SIGPIPE anyway).
func logf(out io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(out, format, args...)
}
