package clientlib_test

// The Examples run against a real in-process daemon (see main_test.go);
// endpoints holds its address. In a program it would be the addresses of
// the coordd members, e.g. []string{"10.0.0.1:7420", "10.0.0.2:7420"}.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

// A session with a 10 s TTL. Everything done on its behalf must stop when
// Done closes; Close releases what hangs off it at once.
func ExampleClient_NewSession() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("billing-worker"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alive:", s.Err() == nil, "until at least:", time.Until(s.Deadline()) > 5*time.Second)

	if err := s.Close(ctx); err != nil {
		log.Fatal(err)
	}
	<-s.Done()
	fmt.Println("closed:", errors.Is(s.Err(), clientlib.ErrSessionClosed))
	// Output:
	// alive: true until at least: true
	// closed: true
}

// A fenced lock: work only while the lock's context lives, and write only
// what the token still guards.
func ExampleSession_Lock() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // how long to wait for the lock
	defer cancel()
	l, err := s.Lock(wctx, "billing/invoice-run", clientlib.WithMetadata("host-7 nightly"))
	if err != nil {
		log.Fatal(err)
	}
	// A write in coordd's KV that lands only while this grant holds the lock.
	if _, err := l.Put(l.Context(), "billing/last-run", []byte("2026-11-30")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote billing/last-run under token > 0:", l.Token() > 0)

	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = l.Put(ctx, "billing/last-run", []byte("late"))
	fmt.Println("after release:", errors.Is(err, clientlib.ErrStaleToken))
	// Output:
	// wrote billing/last-run under token > 0: true
	// after release: true
}

// RunLocked for the common case: the lock is released when fn returns. The
// resource checks the token with a fencing.Guard.
func ExampleRunLocked() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()

	var guard fencing.Guard // normally inside the service that owns the resource
	err = clientlib.RunLocked(ctx, s, "inventory/rebalance", func(ctx context.Context, l *clientlib.Lock) error {
		return guard.Do("inventory", l.Token(), func() error {
			fmt.Println("rebalancing") // ... write to the resource; stop when ctx is done ...
			return ctx.Err()
		})
	})
	fmt.Println("done:", err)
	// Output:
	// rebalancing
	// done: <nil>
}

// A batch job that runs only on the leader. RunAsLeader campaigns, runs
// the callback while leading and resigns when it returns.
func ExampleClient_RunAsLeader() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	err = c.RunAsLeader(ctx, "reports/nightly", "host-1:8080",
		func(ctx context.Context, lead *clientlib.Leadership) error {
			// Fence every write by the term; stop when ctx ends.
			_, err := lead.Put(ctx, "reports/nightly/last", []byte("2026-11-30"))
			fmt.Println("led term > 0:", lead.Term() > 0, "wrote:", err == nil)
			return err // nil: the work is done, RunAsLeader returns
		},
		clientlib.WithElectionSession(clientlib.WithTTL(10*time.Second)))
	fmt.Println("RunAsLeader:", err)
	// Output:
	// led term > 0: true wrote: true
	// RunAsLeader: <nil>
}

// Server errors match sentinels chosen by the error's reason.
func ExampleAdmin_GetSession() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	_, err = c.Admin().GetSession(ctx, "694d7a1b2c3d4e5f")
	switch {
	case errors.Is(err, clientlib.ErrSessionNotFound):
		fmt.Println("session gone: closed or expired")
	case err != nil:
		log.Fatal(err)
	}
	// Output:
	// session gone: closed or expired
}

// Publish a release, then follow the namespace: Bind decodes it into a Go
// value that is always a complete, validated release.
func ExampleConfigCenter_Subscribe() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	rel, err := c.ConfigCenter().Publish(ctx, "payments/prod", []clientlib.ConfigMutation{
		{Key: "timeout", Value: `"2s"`},
		{Key: "retries", Value: "5"},
	}, clientlib.PublishOptions{Author: "alice", Message: "faster retries"})
	if err != nil {
		log.Fatal(err)
	}

	sub, err := c.ConfigCenter().Subscribe(ctx, []string{"payments/prod"}, clientlib.WithoutStatusReports())
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	type Payments struct {
		Timeout string `json:"timeout"`
		Retries int    `json:"retries"`
	}
	cfg, err := clientlib.Bind(sub, "payments/prod", clientlib.JSON,
		clientlib.BindDefaults(Payments{Timeout: "5s", Retries: 3}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v, the release just published: %v\n", cfg.Load(), cfg.Release() == rel.Number)
	// Output:
	// {Timeout:2s Retries:5}, the release just published: true
}
