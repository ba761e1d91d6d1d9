package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// benchGray measures how fast a gray (canary) release reaches the SDK
// subscriptions it selects, beside a normal publish to all of them in the
// same run: 100 subscriptions on 10 clients, half labelled lane=canary.
// Each round creates a gray for the canary lane (create -> every canary
// callback), then abandons it (abandon -> every canary callback back on
// the normal value), then publishes a normal release (publish -> every
// callback). It also counts gray values that reached a stable instance
// (must be 0).
func benchGray(bin, tmp string) error {
	d, err := startDaemon(bin, filepath.Join(tmp, "gray"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	const ns, clients, perClient, rounds = "bench/gray", 10, 10, 20
	writer, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = writer.Close() }()
	if _, err := writer.ConfigCenter().Put(ctx, ns, "k", "normal-0", clientlib.PublishOptions{}); err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		want    string
		t0      time.Time
		lat     []float64
		pending int
		done    = make(chan struct{}, 1)
		leaks   int
	)
	// expect arms the next measurement: value, reaching the canary lane
	// only (canary) or everyone.
	type sub struct {
		canary bool
		s      *clientlib.Subscription
	}
	var subs []sub
	var clis []*clientlib.Client
	defer func() {
		for _, s := range subs {
			s.s.Close()
		}
		for _, c := range clis {
			_ = c.Close()
		}
	}()
	for i := range clients {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
		if err != nil {
			return err
		}
		clis = append(clis, c)
		for j := range perClient {
			canary := (i*perClient+j)%2 == 0
			lane := map[bool]string{true: "canary", false: "stable"}[canary]
			s, err := c.ConfigCenter().Subscribe(ctx, []string{ns}, clientlib.WithInstance(fmt.Sprintf("%s-%d-%d", lane, i, j), map[string]string{"lane": lane}),
				clientlib.WithoutStatusReports())
			if err != nil {
				return err
			}
			s.OnKey(ns, "k", func(ch clientlib.ConfigUpdate) {
				v, _ := ch.Snapshot.Get(ns, "k")
				at := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if !canary && len(v) > 5 && v[:5] == "gray-" {
					leaks++
				}
				if v == want && pending > 0 {
					lat = append(lat, float64(at.Sub(t0).Microseconds()))
					if pending--; pending == 0 {
						done <- struct{}{}
					}
				}
			})
			subs = append(subs, sub{canary, s})
		}
	}
	measure := func(value string, reach int, act func() error) ([]float64, error) {
		mu.Lock()
		want, pending, lat, t0 = value, reach, nil, time.Now()
		mu.Unlock()
		if err := act(); err != nil {
			return nil, err
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			return nil, fmt.Errorf("%q reached %d of %d subscriptions in 30s", value, reach-pending, reach)
		}
		mu.Lock()
		defer mu.Unlock()
		return lat, nil
	}
	lane := clientlib.GraySelector{Labels: map[string]string{"lane": "canary"}}
	var create, abandon, publish []float64
	for r := 1; r <= rounds; r++ {
		normal := fmt.Sprintf("normal-%d", r-1)
		l, err := measure(fmt.Sprintf("gray-%d", r), len(subs)/2, func() error {
			_, err := writer.ConfigCenter().CreateGray(ctx, ns, lane, []clientlib.ConfigMutation{{Key: "k", Value: fmt.Sprintf("gray-%d", r)}}, clientlib.GrayOptions{})
			return err
		})
		if err != nil {
			return err
		}
		create = append(create, l...)
		if l, err = measure(normal, len(subs)/2, func() error {
			_, err := writer.ConfigCenter().AbandonGray(ctx, ns, clientlib.GrayOptions{})
			return err
		}); err != nil {
			return err
		}
		abandon = append(abandon, l...)
		if l, err = measure(fmt.Sprintf("normal-%d", r), len(subs), func() error {
			_, err := writer.ConfigCenter().Put(ctx, ns, "k", fmt.Sprintf("normal-%d", r), clientlib.PublishOptions{})
			return err
		}); err != nil {
			return err
		}
		publish = append(publish, l...)
	}
	fmt.Printf("\ngray releases (%d SDK subscriptions on %d clients, half selected by label; %d rounds)\n", len(subs), clients, rounds)
	fmt.Printf("%-44s %10s %10s\n", "to the callbacks", "p50", "p99")
	for _, row := range []struct {
		name string
		lat  []float64
	}{{"gray create -> each selected subscription", create}, {"gray abandon -> each selected subscription", abandon}, {"normal publish -> every subscription", publish}} {
		fmt.Printf("%-44s %8.2fms %8.2fms\n", row.name, percentile(row.lat, 50)/1000, percentile(row.lat, 99)/1000)
	}
	fmt.Printf("  gray create p50 / normal publish p50: %.2f\n", percentile(create, 50)/percentile(publish, 50))
	mu.Lock()
	fmt.Printf("  gray values given to unselected subscriptions: %d (must be 0)\n", leaks)
	mu.Unlock()
	return nil
}
