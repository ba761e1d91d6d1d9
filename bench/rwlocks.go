package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
)

// rwLocker is one client of a read/write lock implementation.
type rwLocker interface {
	// acquire takes a read or a write grant and returns its release.
	acquire(ctx context.Context, read bool) (func() error, error)
	close()
}

type rwPeer struct {
	name      string
	newClient func(ctx context.Context, lockName string) (rwLocker, error)
}

type coorddRW struct {
	c    *clientlib.Client
	s    *clientlib.Session
	name string
}

func (l *coorddRW) acquire(ctx context.Context, read bool) (func() error, error) {
	lock := l.s.Lock
	if read {
		lock = l.s.RLock
	}
	lk, err := lock(ctx, l.name)
	if err != nil {
		return nil, err
	}
	return func() error { return lk.Release(context.Background()) }, nil
}

func (l *coorddRW) close() {
	_ = l.s.Close(context.Background())
	_ = l.c.Close()
}

type recipeRW struct {
	cli *clientv3.Client
	s   *concurrency.Session
	m   *recipe.RWMutex
}

func (l *recipeRW) acquire(_ context.Context, read bool) (func() error, error) {
	if read {
		if err := l.m.RLock(); err != nil {
			return nil, err
		}
		return l.m.RUnlock, nil
	}
	if err := l.m.Lock(); err != nil {
		return nil, err
	}
	return l.m.Unlock, nil
}

func (l *recipeRW) close() {
	_ = l.s.Close()
	_ = l.cli.Close()
}

// benchRWLocks compares coordd's read/write locks with etcd's recipe
// (client/v3/experimental/recipes.RWMutex) on one daemon: 8 clients on one
// lock, readers only, writers only and 90% readers, zero hold and think
// time. coordd's write grant is its mutex (Lock), so the writers-only row
// is the mutex. Hand-off is from a holder starting its release to a waiter
// (one that asked before that release) getting its grant.
func benchRWLocks(bin, tmp string) error {
	d, err := startDaemon(bin, filepath.Join(tmp, "rwlocks"), strings.Fields(*coorddFlags)...)
	if err != nil {
		return err
	}
	defer d.stop()
	peers := []rwPeer{
		{"coordd SDK", func(ctx context.Context, name string) (rwLocker, error) {
			c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
			if err != nil {
				return nil, err
			}
			s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
			if err != nil {
				_ = c.Close()
				return nil, err
			}
			return &coorddRW{c: c, s: s, name: name}, nil
		}},
		{"etcd recipes.RWMutex", func(_ context.Context, name string) (rwLocker, error) {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{d.etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				return nil, err
			}
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				_ = cli.Close()
				return nil, err
			}
			return &recipeRW{cli: cli, s: s, m: recipe.NewRWMutex(s, "/bench/rw/"+name)}, nil
		}},
	}
	fmt.Printf("\nread/write locks (8 clients on one lock, %s per peer and workload, zero hold and think time)\n", *lockD)
	fmt.Printf("%-22s %-16s %10s %10s %10s %13s %13s %9s\n", "peer", "workload", "acq/s", "p50", "p99", "hand-off p50", "hand-off p99", "overlap")
	mixes := []struct {
		name  string
		reads float64
	}{{"readers only", 1}, {"writers only", 0}, {"90% readers", 0.9}}
	for i, m := range mixes {
		for _, p := range peers {
			r, err := runRW(p, 8, m.reads, *lockD, fmt.Sprintf("rw%d", i))
			if err != nil {
				return fmt.Errorf("%s, %s: %w", p.name, m.name, err)
			}
			h50, h99 := "-", "-" // nobody waited: readers share
			if len(r.handoffUs) > 0 {
				h50, h99 = fmt.Sprintf("%.2fms", percentile(r.handoffUs, 50)/1000), fmt.Sprintf("%.2fms", percentile(r.handoffUs, 99)/1000)
			}
			fmt.Printf("%-22s %-16s %10.0f %8.2fms %8.2fms %13s %13s %9d\n", p.name, m.name, r.perSec, percentile(r.latUs, 50)/1000, percentile(r.latUs, 99)/1000, h50, h99, r.overlaps)
		}
	}
	return nil
}

type rwRun struct {
	perSec float64
	latUs  []float64 // acquire call latency
	// handoffUs: a release's start -> the grant of a waiter that asked
	// before it.
	handoffUs []float64
	overlaps  int64 // a writer holding with anyone, as the clients saw it
}

// runRW has n clients loop on one lock for d, each acquisition a read with
// probability reads.
func runRW(p rwPeer, n int, reads float64, d time.Duration, tag string) (rwRun, error) {
	ctx := context.Background()
	cs := make([]rwLocker, n)
	for i := range cs {
		c, err := p.newClient(ctx, "bench-"+tag)
		if err != nil {
			return rwRun{}, err
		}
		defer c.close()
		cs[i] = c
	}
	var (
		mu            sync.Mutex
		lat, handoffs []float64
		// unix nanos of the latest write and read release's start: a
		// write release may unblock anyone, a read release only writers
		lastWrite, lastRead atomic.Int64
		count               atomic.Int64
		overlaps            atomic.Int64
		readers, writers    atomic.Int64
		firstErr            error
		wg                  sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine, myHandoffs []float64
			for time.Now().Before(deadline) {
				read := rand.Float64() < reads
				t0 := time.Now()
				release, err := c.acquire(ctx, read)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				t1 := time.Now()
				mine = append(mine, float64(t1.Sub(t0).Microseconds()))
				rel := lastWrite.Load()
				if !read {
					rel = max(rel, lastRead.Load())
				}
				if rel > t0.UnixNano() {
					myHandoffs = append(myHandoffs, float64(t1.UnixNano()-rel)/1000)
				}
				if read {
					if readers.Add(1) > 0 && writers.Load() > 0 {
						overlaps.Add(1)
					}
					readers.Add(-1)
				} else {
					if writers.Add(1) > 1 || readers.Load() > 0 {
						overlaps.Add(1)
					}
					writers.Add(-1)
				}
				count.Add(1)
				if read {
					lastRead.Store(time.Now().UnixNano())
				} else {
					lastWrite.Store(time.Now().UnixNano())
				}
				if err := release(); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			lat, handoffs = append(lat, mine...), append(handoffs, myHandoffs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return rwRun{}, firstErr
	}
	return rwRun{perSec: float64(count.Load()) / d.Seconds(), latUs: lat, handoffUs: handoffs, overlaps: overlaps.Load()}, nil
}
