package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/clientlib"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// fanout is one peer of the config benchmark: K subscribers of one
// namespace (coordd watch streams, or raw etcd watches of one prefix), and
// a publish that each of them must see.
type fanout interface {
	// subscribe opens k subscribers whose deliveries go to seen (the
	// published value).
	subscribe(ctx context.Context, k int, seen func(value string)) error
	publish(ctx context.Context, value string) error
	// close ends the subscribers after a workload. Its errors are not
	// the workload's, and are dropped.
	close()
}

// Each subscriber has its own connection, as K app instances would.

type coorddFanout struct {
	conns []*grpc.ClientConn
	ns    string
}

func newCoorddFanout(addr, ns string, conns int) (*coorddFanout, error) {
	f := &coorddFanout{ns: ns}
	for range conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		f.conns = append(f.conns, conn)
	}
	return f, nil
}

func (f *coorddFanout) subscribe(ctx context.Context, k int, seen func(string)) error {
	ready := make(chan error, k)
	for i := range k {
		c := coorddv1.NewConfigServiceClient(f.conns[i%len(f.conns)])
		go func() {
			stream, err := c.Watch(ctx, &coorddv1.WatchRequest{Namespaces: []string{f.ns}})
			if err == nil {
				_, err = stream.Recv() // the snapshot
			}
			ready <- err
			if err != nil {
				return
			}
			for {
				msg, err := stream.Recv()
				if err != nil {
					return
				}
				if msg.GetType() == coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE {
					seen(msg.GetRelease().GetChanges()[0].GetNewValue())
				}
			}
		}()
	}
	for range k {
		if err := <-ready; err != nil {
			return err
		}
	}
	return nil
}

func (f *coorddFanout) publish(ctx context.Context, value string) error {
	_, err := coorddv1.NewConfigServiceClient(f.conns[0]).Put(ctx, &coorddv1.PutRequest{Namespace: f.ns, Key: "k", Value: value})
	return err
}

func (f *coorddFanout) close() {
	for _, c := range f.conns {
		_ = c.Close()
	}
}

// sdkFanout is K subscriptions through the SDK on a few clients: each
// client carries its subscriptions on one WatchMany stream.
type sdkFanout struct {
	clis []*clientlib.Client
	subs []*clientlib.Subscription
	ns   string
}

func newSDKFanout(addr, ns string, clients int) (*sdkFanout, error) {
	f := &sdkFanout{ns: ns}
	for range clients {
		c, err := clientlib.New(context.Background(), clientlib.Config{Endpoints: []string{addr}})
		if err != nil {
			return nil, err
		}
		f.clis = append(f.clis, c)
	}
	return f, nil
}

func (f *sdkFanout) subscribe(ctx context.Context, k int, seen func(string)) error {
	for i := range k {
		sub, err := f.clis[i%len(f.clis)].ConfigCenter().Subscribe(ctx, []string{f.ns}, clientlib.WithoutStatusReports())
		if err != nil {
			return err
		}
		sub.OnKey(f.ns, "k", func(ch clientlib.ConfigUpdate) {
			v, _ := ch.Snapshot.Get(f.ns, "k")
			seen(v)
		})
		f.subs = append(f.subs, sub)
	}
	return nil
}

// subscribeAll opens k subscriptions at once and returns when every one
// has its first snapshot. With seen set, subscription i reports each value
// of key k to seen(i, value).
func (f *sdkFanout) subscribeAll(ctx context.Context, k int, seen func(i int, value string)) error {
	subs := make([]*clientlib.Subscription, k)
	err := all(k, func(i int) error {
		sub, err := f.clis[i%len(f.clis)].ConfigCenter().Subscribe(ctx, []string{f.ns}, clientlib.WithoutStatusReports())
		if err != nil {
			return err
		}
		subs[i] = sub
		if seen != nil {
			sub.OnKey(f.ns, "k", func(ch clientlib.ConfigUpdate) {
				v, _ := ch.Snapshot.Get(f.ns, "k")
				seen(i, v)
			})
		}
		return nil
	})
	for _, s := range subs {
		if s != nil {
			f.subs = append(f.subs, s)
		}
	}
	return err
}

func (f *sdkFanout) publish(ctx context.Context, value string) error {
	_, err := f.clis[0].ConfigCenter().Put(ctx, f.ns, "k", value, clientlib.PublishOptions{})
	return err
}

func (f *sdkFanout) close() {
	for _, s := range f.subs {
		s.Close()
	}
	for _, c := range f.clis {
		_ = c.Close()
	}
}

type etcdFanout struct {
	clis   []*clientv3.Client
	prefix string
}

func newEtcdFanout(url, prefix string, conns int) (*etcdFanout, error) {
	f := &etcdFanout{prefix: prefix}
	for range conns {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		f.clis = append(f.clis, cli)
	}
	return f, nil
}

func (f *etcdFanout) subscribe(ctx context.Context, k int, seen func(string)) error {
	for i := range k {
		wch := f.clis[i%len(f.clis)].Watch(ctx, f.prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if wr := <-wch; wr.Err() != nil {
			return wr.Err()
		}
		go func() {
			for wr := range wch {
				for _, ev := range wr.Events {
					seen(string(ev.Kv.Value))
				}
			}
		}()
	}
	return nil
}

// subscribeAll opens k watches at once and returns when etcd has
// confirmed every one. With seen set, watch i reports each value put to
// seen(i, value).
func (f *etcdFanout) subscribeAll(ctx context.Context, k int, seen func(i int, value string)) error {
	return all(k, func(i int) error {
		wch := f.clis[i%len(f.clis)].Watch(ctx, f.prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		wr := <-wch
		go func() {
			for wr := range wch { // until ctx ends
				for _, ev := range wr.Events {
					if seen != nil {
						seen(i, string(ev.Kv.Value))
					}
				}
			}
		}()
		return wr.Err()
	})
}

// all runs fn(0..n-1) concurrently and returns the first error.
func all(n int, fn func(i int) error) error {
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- fn(i) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (f *etcdFanout) publish(ctx context.Context, value string) error {
	_, err := f.clis[0].Put(ctx, f.prefix+"k", value)
	return err
}

func (f *etcdFanout) close() {
	for _, c := range f.clis {
		_ = c.Close()
	}
}

// metric reads one unlabelled value from the daemon's /metrics.
func metric(httpAddr, name string) (float64, error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

// serverMemory is the daemon's Go heap and stacks in use, in bytes, after
// a garbage collection (which the heap profile endpoint runs with gc=1).
func serverMemory(d *daemon) (float64, error) {
	resp, err := http.Get("http://" + d.httpAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	heap, err := metric(d.httpAddr, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return 0, err
	}
	stack, err := metric(d.httpAddr, "go_memstats_stack_inuse_bytes")
	return heap + stack, err
}

type fanoutResult struct {
	latUs      []float64
	memPerSub  float64       // bytes of server heap+stack per idle subscriber
	watchesNew float64       // etcd watchers opened for the subscribers
	setup      time.Duration // opening the k subscribers, each until it is established
}

// runFanout opens k subscribers on p, then publishes n values one after
// another; each latency is from the publish call to one subscriber's
// delivery.
func runFanout(d *daemon, p fanout, k, n int) (fanoutResult, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r fanoutResult
	watchers0, err := metric(d.httpAddr, "etcd_debugging_mvcc_watcher_total")
	if err != nil {
		return r, err
	}
	mem0, err := serverMemory(d)
	if err != nil {
		return r, err
	}
	var mu sync.Mutex
	var cur string
	var t0 time.Time
	var got int
	done := make(chan struct{}, 1)
	seen := func(v string) {
		at := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if v != cur {
			return
		}
		r.latUs = append(r.latUs, float64(at.Sub(t0).Microseconds()))
		if got++; got == k {
			done <- struct{}{}
		}
	}
	t1 := time.Now()
	if err := p.subscribe(ctx, k, seen); err != nil {
		return r, err
	}
	r.setup = time.Since(t1)
	time.Sleep(time.Second) // settle before measuring idle memory
	mem1, err := serverMemory(d)
	if err != nil {
		return r, err
	}
	watchers1, err := metric(d.httpAddr, "etcd_debugging_mvcc_watcher_total")
	if err != nil {
		return r, err
	}
	r.memPerSub, r.watchesNew = (mem1-mem0)/float64(k), watchers1-watchers0
	for i := range n {
		mu.Lock()
		cur, t0, got = fmt.Sprintf("v%d-%d", k, i), time.Now(), 0
		v := cur
		mu.Unlock()
		if err := p.publish(ctx, v); err != nil {
			return r, err
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			return r, fmt.Errorf("publish %d: %d of %d subscribers saw it within 30s", i, got, k)
		}
	}
	return r, nil
}

// benchConfig measures publish-to-delivery latency for K subscribers of
// one namespace through coordd's watch cache and through K raw etcd
// watches on the same etcd, server memory per idle subscriber, and the
// etcd watchers opened.
func benchConfig(bin, tmp string) error {
	var ks []int
	for _, s := range strings.Split(*configK, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-config-subscribers: %w", err)
		}
		ks = append(ks, k)
	}
	fmt.Printf("\nconfig fan-out, one connection per subscriber (%d publishes per K and peer)\n", publishes(false))
	fmt.Printf("%-26s %6s %10s %10s %14s %14s\n", "peer", "K", "p50", "p99", "mem/conn+sub", "etcd watches")
	type key struct {
		peer string
		k    int
	}
	res := map[key]fanoutResult{}
	d, err := startDaemon(bin, filepath.Join(tmp, "config"))
	if err != nil {
		return err
	}
	defer d.stop()
	for _, k := range ks {
		for i, name := range []string{"coordd watch", "raw etcd watch"} {
			var p fanout
			var err error
			if i == 0 {
				p, err = newCoorddFanout(d.grpcAddr, fmt.Sprintf("bench/k%d", k), k)
			} else {
				p, err = newEtcdFanout(d.etcdURL, fmt.Sprintf("/bench-config/k%d/", k), k)
			}
			if err != nil {
				return err
			}
			r, err := runFanout(d, p, k, publishes(false))
			p.close()
			if err != nil {
				return fmt.Errorf("%s, K=%d: %w", name, k, err)
			}
			res[key{name, k}] = r
			mem := fmt.Sprintf("%.1fKiB", r.memPerSub/1024)
			fmt.Printf("%-26s %6d %8.2fms %8.2fms %14s %14.0f\n", name, k, percentile(r.latUs, 50)/1000, percentile(r.latUs, 99)/1000, mem, r.watchesNew)
			time.Sleep(time.Second) // let the closed subscribers go away
		}
	}
	// Subscribers sharing 8 connections (the subscriptions of a few
	// processes): coordd through the SDK, whose client carries all its
	// subscriptions on one WatchMany stream, against raw etcd watches on
	// 8 clients. Latency and idle server memory per subscriber.
	fmt.Printf("\nsubscribers sharing 8 connections (coordd: SDK subscriptions on WatchMany; memory is server heap+stacks after GC, each peer on a fresh daemon):\n")
	fmt.Printf("%-26s %6s %10s %10s %14s %10s\n", "peer", "K", "p50", "p99", "mem/sub", "set-up")
	shared := map[key]fanoutResult{}
	for _, k := range ks {
		for i, name := range []string{"coordd SDK (WatchMany)", "raw etcd watch"} {
			d, err := startDaemon(bin, filepath.Join(tmp, fmt.Sprintf("config-shared-%d-%d", k, i)))
			if err != nil {
				return err
			}
			var p fanout
			if i == 0 {
				p, err = newSDKFanout(d.grpcAddr, "bench/shared", 8)
			} else {
				p, err = newEtcdFanout(d.etcdURL, "/bench-config/shared/", 8)
			}
			if err != nil {
				d.stop()
				return err
			}
			r, err := runFanout(d, p, k, publishes(false))
			p.close()
			d.stop()
			if err != nil {
				return fmt.Errorf("%s, shared, K=%d: %w", name, k, err)
			}
			shared[key{name, k}] = r
			fmt.Printf("%-26s %6d %8.2fms %8.2fms %12.1fKiB %8.0fms\n", name, k, percentile(r.latUs, 50)/1000, percentile(r.latUs, 99)/1000, r.memPerSub/1024, float64(r.setup.Microseconds())/1000)
		}
	}
	// The same subscribers opened all at once, each peer on a fresh
	// daemon: the SDK's concurrent Subscribe calls on one client share a
	// round trip (and one revision read on the server).
	setupAll := map[string]time.Duration{}
	kmax := ks[len(ks)-1]
	for i, name := range []string{"coordd SDK (WatchMany)", "raw etcd watch"} {
		d, err := startDaemon(bin, filepath.Join(tmp, fmt.Sprintf("config-setup-%d", i)))
		if err != nil {
			return err
		}
		var p interface {
			subscribeAll(ctx context.Context, k int, seen func(int, string)) error
			close()
		}
		if i == 0 {
			p, err = newSDKFanout(d.grpcAddr, "bench/shared", 8)
		} else {
			p, err = newEtcdFanout(d.etcdURL, "/bench-config/shared/", 8)
		}
		if err != nil {
			d.stop()
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		t0 := time.Now()
		err = p.subscribeAll(ctx, kmax, nil)
		setupAll[name] = time.Since(t0)
		cancel()
		p.close()
		d.stop()
		if err != nil {
			return fmt.Errorf("%s, K=%d at once: %w", name, kmax, err)
		}
		fmt.Printf("%-26s %6d opened all at once: set-up %.0fms\n", name, kmax, float64(setupAll[name].Microseconds())/1000)
	}
	fmt.Printf("\nper-stream watches sharing 8 connections (the plain Watch call, one stream per subscriber):\n")
	{
		// A fresh daemon: freed goroutine stacks stay in the runtime's
		// pools and would hide the run's.
		d, err := startDaemon(bin, filepath.Join(tmp, "config-mem-watch"))
		if err != nil {
			return err
		}
		k := ks[len(ks)-1]
		p, err := newCoorddFanout(d.grpcAddr, "bench/shared", 8)
		if err != nil {
			d.stop()
			return err
		}
		r, err := runFanout(d, p, k, 5)
		p.close()
		d.stop()
		if err != nil {
			return fmt.Errorf("coordd watch, shared: %w", err)
		}
		fmt.Printf("  coordd watch             K=%d  %.1f KiB per subscriber\n", k, r.memPerSub/1024)
	}
	sc, se := shared[key{"coordd SDK (WatchMany)", kmax}], shared[key{"raw etcd watch", kmax}]
	fmt.Printf("\ntargets:\n")
	fmt.Printf("  shared connections, K=%d: raw etcd p99 / coordd p99: %.2f (target >= 2); idle memory per subscriber %.1f KiB (target < 4; raw etcd %.1f)\n",
		kmax, percentile(se.latUs, 99)/percentile(sc.latUs, 99), sc.memPerSub/1024, se.memPerSub/1024)
	fmt.Printf("  shared connections, K=%d: set-up coordd / raw etcd: %.2f (target <= 1); coordd p99 / raw etcd p99: %.2f (target <= 0.5)\n",
		kmax, sc.setup.Seconds()/se.setup.Seconds(), percentile(sc.latUs, 99)/percentile(se.latUs, 99))
	fmt.Printf("  shared connections, K=%d opened all at once: set-up coordd / raw etcd: %.2f (target <= 1)\n",
		kmax, setupAll["coordd SDK (WatchMany)"].Seconds()/setupAll["raw etcd watch"].Seconds())
	for _, k := range ks {
		c, e := res[key{"coordd watch", k}], res[key{"raw etcd watch", k}]
		fmt.Printf("  one connection each, K=%d: raw etcd p99 / coordd p99: %.2f; etcd watches coordd opened for them: %.0f (target 0: the cache's one serves all)\n",
			k, percentile(e.latUs, 99)/percentile(c.latUs, 99), c.watchesNew)
	}
	return nil
}
