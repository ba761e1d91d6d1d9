package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// soakWindow is what one window of the soak measured.
type soakWindow struct {
	lockCycles  float64 // lock acquire+release cycles per second
	elections   float64 // election terms per second
	dbSize      float64 // bytes of etcd's database file at the window's end
	dbInUse     float64 // bytes in use in it
	errs        int64   // failed operations (any workload)
	compactions float64 // etcd compactions so far (etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count)
}

// benchSoak runs mixed traffic on one daemon for -soak-duration, once with
// coordd's defaults and, with -soak-compare, once more with compaction
// off, and prints each window side by side, then the first three windows
// against the last three.
func benchSoak(bin, tmp string) error {
	runs := []struct {
		name string
		args []string
	}{{"defaults", strings.Fields(*soakFlags)}}
	if *soakFlags != "" {
		runs[0].name = *soakFlags
	}
	if *soakCompare {
		runs = append(runs, struct {
			name string
			args []string
		}{"compaction off", []string{"--compaction-mode", "off"}})
	}
	fmt.Printf("soak: %s per run in %s windows; 4 SDK clients cycling 4 locks, 2 candidates handing an election over, a session opened and closed every 100ms, a config release every 250ms to 2 subscribers\n",
		*soakD, *soakWindowD)
	results := make([][]soakWindow, len(runs))
	for i, r := range runs {
		d, err := startDaemon(bin, filepath.Join(tmp, "soak-"+strconv.Itoa(i)), r.args...)
		if err != nil {
			return err
		}
		results[i], err = soak(d)
		d.stop()
		if err != nil {
			return fmt.Errorf("soak (%s): %w", r.name, err)
		}
	}
	fmt.Printf("\n%-8s", "minute")
	for _, r := range runs {
		fmt.Printf(" | %-62s", r.name)
	}
	fmt.Printf("\n%-8s", "")
	for range runs {
		fmt.Printf(" | %10s %10s %9s %9s %7s %6s", "locks/s", "terms/s", "db MiB", "in use", "errors", "comp.")
	}
	fmt.Println()
	for w := range results[0] {
		fmt.Printf("%-8s", fmt.Sprintf("%.1f", (time.Duration(w+1)**soakWindowD).Minutes()))
		for _, res := range results {
			if w >= len(res) {
				continue
			}
			x := res[w]
			fmt.Printf(" | %10.0f %10.1f %9.1f %9.1f %7d %6.0f", x.lockCycles, x.elections, x.dbSize/(1<<20), x.dbInUse/(1<<20), x.errs, x.compactions)
		}
		fmt.Println()
	}
	for i, res := range results {
		if len(res) < 6 {
			continue
		}
		first, last := meanCycles(res[:3]), meanCycles(res[len(res)-3:])
		fmt.Printf("%s: lock cycles/s first 3 windows %.0f, last 3 %.0f: last/first %.2f\n", runs[i].name, first, last, last/first)
	}
	return nil
}

func meanCycles(ws []soakWindow) float64 {
	sum := 0.0
	for _, w := range ws {
		sum += w.lockCycles
	}
	return sum / float64(len(ws))
}

// soak runs the mixed workload against d and reads its figures every
// window.
func soak(d *daemon) ([]soakWindow, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cycles, terms, errs atomic.Int64
	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			errs.Add(1)
		}
	}
	newClient := func() (*clientlib.Client, *clientlib.Session, error) {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
		if err != nil {
			return nil, nil, err
		}
		s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return c, s, nil
	}
	var clients []*clientlib.Client
	defer func() {
		cancel()
		wg.Wait()
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for i := range 4 {
		c, s, err := newClient()
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
		name := fmt.Sprintf("soak/lock-%d", i%4)
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := s.Lock(ctx, name)
				if err != nil {
					fail(err)
					continue
				}
				if err := l.Release(ctx); err != nil {
					fail(err)
					continue
				}
				cycles.Add(1)
			}
		})
	}
	for range 2 {
		c, s, err := newClient()
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := s.Campaign(ctx, "soak/election", "v")
				if err != nil {
					fail(err)
					continue
				}
				terms.Add(1)
				fail(l.Proclaim(ctx, "w"))
				fail(l.Resign(ctx))
			}
		})
	}
	c, _, err := newClient()
	if err != nil {
		return nil, err
	}
	clients = append(clients, c)
	wg.Go(func() { // session churn
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for ctx.Err() == nil {
			s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
			if err == nil {
				err = s.Close(ctx)
			}
			fail(err)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	})
	for range 2 {
		sc, _, err := newClient()
		if err != nil {
			return nil, err
		}
		clients = append(clients, sc)
		sub, err := sc.ConfigCenter().Subscribe(ctx, []string{"soak/config"})
		if err != nil {
			return nil, err
		}
		wg.Go(func() { <-ctx.Done(); sub.Close() })
	}
	wg.Go(func() { // config releases
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for n := 0; ctx.Err() == nil; n++ {
			_, err := c.ConfigCenter().Publish(ctx, "soak/config", []clientlib.ConfigMutation{{Key: "n", Value: strconv.Itoa(n)}}, clientlib.PublishOptions{})
			fail(err)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	})

	var out []soakWindow
	start := time.Now()
	for at := *soakWindowD; at <= *soakD; at += *soakWindowD {
		time.Sleep(time.Until(start.Add(at)))
		w := soakWindow{
			lockCycles: float64(cycles.Swap(0)) / soakWindowD.Seconds(),
			elections:  float64(terms.Swap(0)) / soakWindowD.Seconds(),
			errs:       errs.Swap(0),
		}
		var errs []error
		var err error
		w.dbSize, err = metric(d.httpAddr, "etcd_mvcc_db_total_size_in_bytes")
		errs = append(errs, err)
		w.dbInUse, err = metric(d.httpAddr, "etcd_mvcc_db_total_size_in_use_in_bytes")
		errs = append(errs, err)
		w.compactions, _ = metric(d.httpAddr, "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count")
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}
