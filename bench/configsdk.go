package main

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// benchConfigSDK measures the config SDK: publish-to-callback latency for N
// subscriptions (each its own client, as N app instances), the reconnect
// storm after a coordd restart (time until all are live, relists), and the
// client memory per subscription.
func benchConfigSDK(bin, tmp string) error {
	d, err := startDaemon(bin, filepath.Join(tmp, "config-sdk"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	n := *sdkSubs
	writer, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = writer.Close() }()
	if _, err := writer.ConfigCenter().Put(ctx, "bench/sdk", "k", "start", clientlib.PublishOptions{}); err != nil {
		return err
	}

	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	var (
		mu   sync.Mutex
		want string
		t0   time.Time
		lat  []float64
		got  atomic.Int32
		all  = make(chan struct{}, 1)
		subs []*clientlib.Subscription
		clis []*clientlib.Client
	)
	for range n {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
		if err != nil {
			return err
		}
		clis = append(clis, c)
		sub, err := c.ConfigCenter().Subscribe(ctx, []string{"bench/sdk"}, clientlib.WithStallTimeout(20*time.Second))
		if err != nil {
			return err
		}
		sub.OnKey("bench/sdk", "k", func(ch clientlib.ConfigUpdate) {
			v, _ := ch.Snapshot.Get("bench/sdk", "k")
			at := time.Now()
			mu.Lock()
			ok := v == want
			if ok {
				lat = append(lat, float64(at.Sub(t0).Microseconds()))
			}
			mu.Unlock()
			if ok && got.Add(1) == int32(n) {
				all <- struct{}{}
			}
		})
		subs = append(subs, sub)
	}
	defer func() {
		for i := range subs {
			subs[i].Close()
			_ = clis[i].Close()
		}
	}()
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	perSub := float64(m1.HeapInuse+m1.StackInuse-m0.HeapInuse-m0.StackInuse) / float64(n)

	for i := range publishes(false) {
		v := fmt.Sprintf("v%d", i)
		mu.Lock()
		want, t0 = v, time.Now()
		mu.Unlock()
		got.Store(0)
		if _, err := writer.ConfigCenter().Put(ctx, "bench/sdk", "k", v, clientlib.PublishOptions{}); err != nil {
			return err
		}
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("publish %d: %d of %d callbacks within 30s", i, got.Load(), n)
		}
	}

	// Reconnect storm: restart coordd under the subscriptions.
	relists0 := 0
	for _, s := range subs {
		relists0 += s.Status().Relists
	}
	if err := d.restart(); err != nil {
		return err
	}
	ready := time.Now()
	for {
		live := 0
		for _, s := range subs {
			if st := s.Status(); st.State == clientlib.StateLive && st.Reconnects > 0 {
				live++
			}
		}
		if live == n {
			break
		}
		if time.Since(ready) > 2*time.Minute {
			return fmt.Errorf("reconnect storm: %d of %d live after 2m", live, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	storm := time.Since(ready)
	relists := -relists0
	for _, s := range subs {
		relists += s.Status().Relists
	}

	// Memory of subscriptions sharing one client (one process following
	// many namespace sets).
	shared, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = shared.Close() }()
	runtime.GC()
	var s0 runtime.MemStats
	runtime.ReadMemStats(&s0)
	var more []*clientlib.Subscription
	for range n {
		sub, err := shared.ConfigCenter().Subscribe(ctx, []string{"bench/sdk"})
		if err != nil {
			return err
		}
		more = append(more, sub)
	}
	runtime.GC()
	var s1 runtime.MemStats
	runtime.ReadMemStats(&s1)
	// Signed: other memory freed meanwhile can make the difference
	// negative, which says the figure is below this measure's noise.
	perShared := float64(int64(s1.HeapInuse+s1.StackInuse)-int64(s0.HeapInuse+s0.StackInuse)) / float64(n)
	runtime.KeepAlive(more)
	for _, sub := range more {
		sub.Close()
	}

	fmt.Printf("\nconfig SDK (%d subscriptions, each its own client; %d publishes)\n", n, publishes(false))
	fmt.Printf("  publish -> callback       p50 %.2fms  p99 %.2fms  (n=%d)\n", percentile(lat, 50)/1000, percentile(lat, 99)/1000, len(lat))
	fmt.Printf("  reconnect storm           all %d live %.2fs after coordd was ready again; relists %d (target 0: the outage is shorter than the history)\n", n, storm.Seconds(), relists)
	fmt.Printf("  client memory             %.1f KiB per subscription with its own client and connection; %.1f KiB per subscription sharing one client (heap+stacks after GC)\n", perSub/1024, perShared/1024)
	return nil
}
