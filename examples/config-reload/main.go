// Command config-reload hot-reloads a typed configuration from coordd and
// prints every change: the config center's SDK in a few lines.
//
// With coordd running (see the README), build it and run it in the
// foreground; it prints its PID first ("config-reload: pid 4712"), then
// the configuration it started with:
//
//	go build -o bin/config-reload ./examples/config-reload
//	bin/config-reload -endpoints 127.0.0.1:7420 -namespace demo/app
//
// then, in another shell, publish a change, and one it refuses (workers
// must be 1 to 64):
//
//	curl -s -X POST localhost:7421/v1/config:put \
//	  --json '{"namespace":"demo/app","key":"greeting","value":"\"hello again\""}'
//	curl -s -X POST localhost:7421/v1/config:put \
//	  --json '{"namespace":"demo/app","key":"workers","value":"0"}'
//
// Ctrl-C, or kill with its PID from another shell, stops it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// AppConfig is the app's configuration: one key per field, values in JSON.
type AppConfig struct {
	Greeting string          `json:"greeting"`
	Workers  int             `json:"workers"`
	Features map[string]bool `json:"features"`
}

func (c AppConfig) validate() error {
	if c.Workers < 1 || c.Workers > 64 {
		return fmt.Errorf("workers must be 1 to 64, not %d", c.Workers)
	}
	return nil
}

func main() {
	endpoints := flag.String("endpoints", envOr("COORDD_ENDPOINTS", "127.0.0.1:7420"), "coordd gRPC endpoints, comma-separated")
	namespace := flag.String("namespace", "demo/app", "config namespace to follow")
	cacheFile := flag.String("cache-file", "", "keep the last configuration here, to start while coordd is down")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, strings.Split(*endpoints, ","), *namespace, *cacheFile); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "config-reload:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run follows namespace until ctx ends, printing the configuration at
// start and after every accepted change, and every rejected release.
func run(ctx context.Context, out io.Writer, endpoints []string, namespace, cacheFile string) error {
	logf(out, "config-reload: pid %d\n", os.Getpid())
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints, NoWait: cacheFile != ""})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // done with it; nothing to report
	opts := []clientlib.SubscribeOption{clientlib.WithInstance("config-reload-"+fmt.Sprint(os.Getpid()), map[string]string{"example": "config-reload"})}
	if cacheFile != "" {
		opts = append(opts, clientlib.WithCacheFile(cacheFile))
	}
	sub, err := c.ConfigCenter().Subscribe(ctx, []string{namespace}, opts...)
	if err != nil {
		return err
	}
	defer sub.Close()
	sub.OnError(func(err error) { logf(out, "rejected: %v\n", err) })

	cfg, err := clientlib.Bind(sub, namespace, clientlib.JSON,
		clientlib.BindDefaults(AppConfig{Greeting: "hello", Workers: 4}),
		clientlib.BindValidate(AppConfig.validate),
		clientlib.BindOnChange(func(_, cur AppConfig) {
			logf(out, "changed: %s\n", describe(cur))
		}))
	if err != nil {
		return err
	}
	logf(out, "started (%s, release %d): %s\n", sub.Status().State, cfg.Release(), describe(cfg.Load()))

	// The app's own work reads cfg.Load() whenever it needs the
	// configuration: lock-free, always a complete, validated release.
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			st := sub.Status()
			logf(out, "status: %s, revision %d, staleness %s\n", st.State, st.Revision, st.Staleness.Round(time.Second))
		}
	}
}

// logf prints a line of the example's progress. The output is a log for
// whoever watches: a failed write is no reason to stop (and on a closed
// stdout pipe the write raises SIGPIPE anyway).
func logf(out io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(out, format, args...)
}

func describe(c AppConfig) string {
	return fmt.Sprintf("greeting=%q workers=%d features=%v", c.Greeting, c.Workers, c.Features)
}
