package clientlib_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

// A session with a 10 s TTL. Everything done on its behalf stops when Done
// closes; Close releases what hangs off it at once.
func ExampleClient_NewSession() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{
		Endpoints: []string{"127.0.0.1:7420", "127.0.0.1:7430", "127.0.0.1:7440"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("billing-worker"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())

	select {
	case <-s.Done():
		if errors.Is(s.Err(), clientlib.ErrSessionExpired) {
			log.Print("no keep-alive acknowledged before the local deadline; stop acting as a holder")
		}
	case <-time.After(time.Minute):
		log.Printf("session %s alive until at least %s", s.ID(), s.Deadline().Format(time.RFC3339Nano))
	}
}

// Server errors match sentinels chosen by the error's reason.
func ExampleAdmin_GetSession() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	info, err := c.Admin().GetSession(ctx, "694d7a1b2c3d4e5f")
	switch {
	case errors.Is(err, clientlib.ErrSessionNotFound):
		log.Print("session gone: closed or expired")
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("owner %s, %s left", info.Owner, info.Remaining)
	}
}

// A fenced lock: work only while the lock's context lives, and hand the
// token to the protected resource with every write.
func ExampleSession_Lock() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second) // how long to wait for the lock
	defer cancel()
	l, err := s.Lock(wctx, "billing/invoice-run", clientlib.WithMetadata("host-7 nightly"))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())

	// A write in coordd's KV that only lands while the token holds the lock.
	if _, err := c.Admin().FencedPut(l.Context(), clientlib.Fence{Lock: "billing/invoice-run", Token: l.Token()}, "billing/last-run", []byte("2026-11-29")); errors.Is(err, clientlib.ErrStaleToken) {
		log.Print("lost the lock before the write; nothing was written")
	}
}

// WithLock for the common case: the lock is released when fn returns.
func ExampleWithLock() {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())

	var guard fencing.Guard // normally inside the service that owns the resource
	err = clientlib.WithLock(ctx, s, "inventory/rebalance", func(ctx context.Context, l *clientlib.Lock) error {
		token := l.Token()
		return guard.Do("inventory", token, func() error {
			// ... write to the resource; stop when ctx is done ...
			return ctx.Err()
		})
	})
	if err != nil {
		log.Print(err)
	}
}
