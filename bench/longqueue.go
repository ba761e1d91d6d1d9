package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
)

var (
	queueWaiters     = flag.Int("queue-waiters", 10000, "waiters on one lock in -only long-queue")
	queueProfile     = flag.String("queue-profile", "", "write a CPU profile of coordd during the first 5 s of -only long-queue's drain to this file (go tool pprof)")
	queueEtcdWaiters = flag.Int("queue-etcd-waiters", 200, "waiters on one etcd Mutex in -only long-queue (etcd hands over in about 100 ms each)")
)

// benchLongQueue puts many waiters on one lock and measures what each
// costs the daemon in memory, and how fast the queue drains when every
// waiter releases as soon as it is granted; beside it etcd's Mutex recipe
// drains a shorter queue on the same embedded etcd.
func benchLongQueue(bin, tmp string) error {
	n := *queueWaiters
	fmt.Printf("long queue: %d waiters on one lock (10 clients, 100 sessions); each releases once granted\n", n)
	d, err := startDaemon(bin, filepath.Join(tmp, "long-queue"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cs := make([]*clientlib.Client, 10)
	for i := range cs {
		if cs[i], err = clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}}); err != nil {
			return err
		}
		defer func() { _ = cs[i].Close() }()
	}
	sessions := make([]*clientlib.Session, 101) // the first holds the lock at the start, the others wait
	for i := range sessions {
		if sessions[i], err = cs[i%len(cs)].NewSession(ctx, clientlib.WithTTL(60*time.Second)); err != nil {
			return err
		}
		defer func() { _ = sessions[i].Close(context.Background()) }()
	}
	admin := cs[0].Admin()
	const name = "bench/long-queue"
	holder, err := admin.Acquire(ctx, sessions[0].ID(), name)
	if err != nil {
		return err
	}
	before, heap0, stack0 := d.rssKiB(), memstat(d.httpAddr, "go_memstats_heap_inuse_bytes"), memstat(d.httpAddr, "go_memstats_stack_inuse_bytes")

	var granted atomic.Int64
	// The first error of any waiter (read while others may still fail).
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	firstErr := func() error {
		if e := failed.Load(); e != nil {
			return *e
		}
		return nil
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := sessions[1+i%(len(sessions)-1)].Lock(ctx, name, clientlib.WithRequestID(fmt.Sprintf("w%d", i)))
			if err == nil {
				granted.Add(1)
				err = l.Release(ctx)
			}
			if err != nil {
				fail(err)
			}
		}()
	}
	for {
		desc, err := admin.DescribeLock(ctx, name)
		if err != nil {
			return err
		}
		if len(desc.Waiters) >= n {
			break
		}
		if err := firstErr(); err != nil {
			fmt.Printf("  coordd: a waiter failed after %d of %d were enqueued: %v\n", len(desc.Waiters), n, err)
			return err
		}
		time.Sleep(200 * time.Millisecond) // polling a bench's progress, not a test
	}
	enqueued := time.Since(start)
	time.Sleep(2 * time.Second) // let the heap settle before reading RSS
	after, heap1, stack1 := d.rssKiB(), memstat(d.httpAddr, "go_memstats_heap_inuse_bytes"), memstat(d.httpAddr, "go_memstats_stack_inuse_bytes")
	if *queueProfile != "" {
		if err := heapProfile(d.httpAddr, *queueProfile+".heap"); err != nil {
			return err
		}
	}
	cpu0 := d.cpuSeconds()
	drain := time.Now()
	profiled := make(chan error, 1)
	if *queueProfile != "" {
		go func() { profiled <- cpuProfile(d.httpAddr, 5*time.Second, *queueProfile) }()
	}
	// Unrelated writes (config puts) while the queue drains.
	var putLat []time.Duration
	putsDone := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(putsDone)
		for i := 0; ; i++ {
			select {
			case <-drained:
				return
			default:
			}
			t0 := time.Now()
			if _, err := cs[1].ConfigCenter().Put(ctx, "bench/unrelated", "k", strconv.Itoa(i), clientlib.PublishOptions{}); err != nil {
				return
			}
			putLat = append(putLat, time.Since(t0))
		}
	}()
	if err := admin.Release(ctx, name, holder.Token); err != nil {
		return err
	}
	wg.Wait()
	took := time.Since(drain)
	close(drained)
	<-putsDone
	cpu := d.cpuSeconds() - cpu0
	if err := firstErr(); err != nil {
		return err
	}
	if *queueProfile != "" {
		if err := <-profiled; err != nil {
			return err
		}
	}
	rate := float64(n) / took.Seconds()
	fmt.Printf("  coordd: enqueued in %.1f s; RSS %d -> %d MiB, %.1f KiB per waiter (Go heap in use %.1f KiB, goroutine stacks %.1f KiB); drained in %.1f s: %.0f grants/s, %.0f µs of daemon CPU per grant\n",
		enqueued.Seconds(), before/1024, after/1024, float64(after-before)/float64(n), (heap1-heap0)/1024/float64(n), (stack1-stack0)/1024/float64(n),
		took.Seconds(), rate, cpu/float64(n)*1e6)

	if len(putLat) > 0 {
		slices.Sort(putLat)
		fmt.Printf("  unrelated config puts while it drained: %d, p50 %.2f ms, max %.2f ms\n", len(putLat),
			float64(putLat[len(putLat)/2].Microseconds())/1000, float64(putLat[len(putLat)-1].Microseconds())/1000)
	}

	// etcd's Mutex recipe, on the same member's etcd.
	m := *queueEtcdWaiters
	raw, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(d.etcdURL, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	es := make([]*concurrency.Session, m+1)
	for i := range es {
		if es[i], err = concurrency.NewSession(raw, concurrency.WithTTL(60)); err != nil {
			return err
		}
		defer func() { _ = es[i].Close() }()
	}
	first := concurrency.NewMutex(es[0], "/bench/long-queue")
	if err := first.Lock(ctx); err != nil {
		return err
	}
	var waiting atomic.Int64
	var ewg sync.WaitGroup
	for i := 1; i <= m; i++ {
		ewg.Add(1)
		go func() {
			defer ewg.Done()
			mu := concurrency.NewMutex(es[i], "/bench/long-queue")
			waiting.Add(1)
			if err := mu.Lock(ctx); err != nil {
				fail(err)
				return
			}
			_ = mu.Unlock(ctx)
		}()
	}
	for waiting.Load() < int64(m) {
		time.Sleep(50 * time.Millisecond)
	}
	for {
		resp, err := raw.Get(ctx, "/bench/long-queue", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= int64(m+1) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	drain = time.Now()
	if err := first.Unlock(ctx); err != nil {
		return err
	}
	ewg.Wait()
	if err := firstErr(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	etcdRate := float64(m) / time.Since(drain).Seconds()
	fmt.Printf("  etcd Mutex recipe, %d waiters: drained at %.0f grants/s; coordd/etcd %.1fx\n", m, etcdRate, rate/etcdRate)
	return nil
}

// heapProfile writes coordd's heap profile to file.
func heapProfile(httpAddr, file string) error {
	return saveURL(fmt.Sprintf("http://%s/debug/pprof/heap", httpAddr), file)
}

// memstat reads one of coordd's Go memory gauges (0 if it cannot).
func memstat(httpAddr, name string) float64 {
	v, _ := gauge(httpAddr, name)
	return v
}
