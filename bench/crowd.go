package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/coordd/coordd/clientlib"
)

var (
	crowdWaiters = flag.String("crowd-waiters", "1000,10000", "waiter counts of -only crowd (each waiter its own session; 10 clients)")
	crowdZK      = flag.String("crowd-zk-waiters", "1000,10000", "waiter counts of ZooKeeper's lock recipe beside it in -only crowd (10 sessions)")
	crowdREST    = flag.Int("crowd-rest-waiters", 2000, "REST clients of -only crowd that wait (unary acquire, each its own session) and release by their token and session (0: none)")
	crowdMaxSess = flag.Int("crowd-max-sessions", 10000, "most sessions of -only crowd: past it, waiters share sessions (each its own request id); one bench process keeps 10,000 alive, not 100,000")
	crowdCPU     = flag.String("crowd-cpu-profile", "", "write a CPU profile of coordd while the largest crowd of -only crowd joins (its first 3 s) to this file")
	crowdProfile = flag.String("crowd-profile", "", "save coordd's heap and goroutine profiles while each crowd waits, to this prefix + .N.heap and .N.goroutines (N the waiters), and with its sessions only, before it joins, to prefix + .N.base.heap and .N.base.goroutines (go tool pprof -base)")
)

// crowdFigures are one crowd's figures, coordd's or ZooKeeper's.
type crowdFigures struct {
	n              int
	join           time.Duration // from the first join to all n queued
	joinCPU        float64       // server CPU while the crowd joins, % of one core (coordd)
	memPerWaiter   float64       // KiB of server RSS per waiter (sessions excluded for coordd)
	goPerWaiter    float64       // KiB of Go heap and stacks in use per waiter, after a collection (coordd)
	memPerSession  float64       // KiB of server RSS per idle session (coordd)
	describe       time.Duration // p50 of the crowd's first page (REST) / getChildren
	handoff        float64       // grants per second through the queue, each waiter releasing once granted
	idleCPUPercent float64       // server CPU while the crowd waits, % of one core
}

// benchCrowd puts crowds of clients on one lock, each waiter with its own
// session over 10 shared connections (as fleets run), and measures what a
// waiter costs the member, how fast the crowd joins and hands the lock
// through, and how long describing its first page takes; ZooKeeper's lock
// recipe beside it (an ephemeral sequential znode and a watch on the one
// before, per waiter) at the counts of -crowd-zk-waiters.
func benchCrowd(bin, tmp string) error {
	fmt.Printf("crowd: waiters on one lock, each with its own session (up to %d sessions, then shared), over 10 connections; each releases once granted\n", *crowdMaxSess)
	var zkOut *outsider
	if ns := counts(*crowdZK); len(ns) > 0 {
		stop := startOutsiders(filepath.Join(tmp, "outsiders"))
		defer stop()
		zkOut = outsiders.zk
	}
	if n := *crowdREST; n > 0 {
		joined, rate, err := crowdOverREST(bin, filepath.Join(tmp, "crowd-rest"), n)
		if err != nil {
			return err
		}
		fmt.Printf("  coordd over REST  %6d waiters: joined in %.2f s; hand-off %.0f grants/s (each released by its token and session)\n", n, joined.Seconds(), rate)
	}
	for _, n := range counts(*crowdWaiters) {
		c, err := crowdCoordd(bin, filepath.Join(tmp, fmt.Sprintf("crowd-%d", n)), n)
		if err != nil {
			return err
		}
		printCrowd("coordd", c)
		if zkOut == nil || !slices.Contains(counts(*crowdZK), n) {
			continue
		}
		z, err := crowdZooKeeper(zkOut, n)
		if err != nil {
			return err
		}
		printCrowd("ZooKeeper recipe", z)
		fmt.Printf("    coordd / ZooKeeper: join time %.2fx, describe %.2fx, hand-off rate %.2fx, memory per waiter %.2fx\n",
			c.join.Seconds()/z.join.Seconds(), c.describe.Seconds()/z.describe.Seconds(), c.handoff/z.handoff, c.memPerWaiter/z.memPerWaiter)
	}
	return nil
}

func counts(list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

func printCrowd(who string, f crowdFigures) {
	fmt.Printf("  %-17s %6d waiters: joined in %.2f s (%.0f/s", who, f.n, f.join.Seconds(), float64(f.n)/f.join.Seconds())
	if f.joinCPU > 0 {
		fmt.Printf(", the server at %.0f%% of a core", f.joinCPU)
	}
	fmt.Printf("); %.1f KiB per waiter", f.memPerWaiter)
	if f.goPerWaiter > 0 {
		fmt.Printf(" (Go heap and stacks in use: %.1f KiB)", f.goPerWaiter)
	}
	if f.memPerSession > 0 {
		fmt.Printf(" + %.1f KiB per session", f.memPerSession)
	}
	fmt.Printf("; first page %.2f ms; hand-off %.0f grants/s; CPU while it waits %.1f%% of a core\n",
		float64(f.describe.Microseconds())/1000, f.handoff, f.idleCPUPercent)
}

// firstError keeps the first error of many goroutines.
type firstError struct{ p atomic.Pointer[error] }

func (f *firstError) set(err error) { f.p.CompareAndSwap(nil, &err) }
func (f *firstError) get() error {
	if e := f.p.Load(); e != nil {
		return *e
	}
	return nil
}

// crowdLargest is the largest of -crowd-waiters.
func crowdLargest() int {
	ns := counts(*crowdWaiters)
	if len(ns) == 0 {
		return 0
	}
	return slices.Max(ns)
}

func crowdCoordd(bin, dir string, n int) (crowdFigures, error) {
	f := crowdFigures{n: n}
	d, err := startDaemon(bin, dir, "--max-sessions-per-principal", "-1", "--max-waiters-per-principal", "-1")
	if err != nil {
		return f, err
	}
	defer d.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cs := make([]*clientlib.Client, 10)
	for i := range cs {
		if cs[i], err = clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}}); err != nil {
			return f, err
		}
		defer func() { _ = cs[i].Close() }()
	}
	rss0 := d.rssKiB()
	sessions, err := crowdSessions(ctx, cs, min(n, *crowdMaxSess)+1)
	if err != nil {
		return f, err
	}
	defer func() {
		for _, s := range sessions {
			_ = s.Close(context.WithoutCancel(ctx))
		}
	}()
	time.Sleep(2 * time.Second) // let the heap settle before reading RSS
	rss1 := d.rssKiB()
	go1, err := serverMemory(d)
	if err != nil {
		return f, err
	}
	if *crowdProfile != "" { // the sessions alone: go tool pprof -base
		if err := saveProfiles(ctx, d.httpAddr, fmt.Sprintf("%s.%d.base", *crowdProfile, n)); err != nil {
			return f, err
		}
	}
	f.memPerSession = float64(rss1-rss0) / float64(len(sessions))
	const name = "bench/crowd"
	holder, err := sessions[0].Lock(ctx, name)
	if err != nil {
		return f, err
	}
	var failed firstError
	var wg sync.WaitGroup
	profiled := make(chan error, 1)
	if *crowdCPU != "" && n == crowdLargest() {
		go func() { profiled <- cpuProfile(d.httpAddr, 3*time.Second, *crowdCPU) }()
	} else {
		profiled <- nil
	}
	cpuJoin := d.cpuSeconds()
	start := time.Now()
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			l, err := sessions[1+(i-1)%(len(sessions)-1)].Lock(ctx, name, clientlib.WithRequestID(fmt.Sprintf("w%d", i)))
			if err == nil {
				err = l.Release(ctx)
			}
			if err != nil && ctx.Err() == nil {
				failed.set(err)
			}
		})
	}
	admin := cs[0].Admin()
	for {
		st, err := admin.DescribeLockPage(ctx, name, clientlib.LockPage{Size: 1})
		if err != nil {
			return f, err
		}
		if st.WaiterCount >= n {
			break
		}
		if err := failed.get(); err != nil {
			return f, fmt.Errorf("coordd: a waiter failed after %d of %d joined: %w", st.WaiterCount, n, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a bench's progress, not a test
	}
	f.join = time.Since(start)
	f.joinCPU = (d.cpuSeconds() - cpuJoin) / f.join.Seconds() * 100
	if err := <-profiled; err != nil {
		fmt.Printf("(profile: %v)\n", err)
	}
	time.Sleep(2 * time.Second)
	f.memPerWaiter = float64(d.rssKiB()-rss1) / float64(n)
	go2, err := serverMemory(d)
	if err != nil {
		return f, err
	}
	f.goPerWaiter = (go2 - go1) / 1024 / float64(n)
	if *crowdProfile != "" {
		if err := saveProfiles(ctx, d.httpAddr, fmt.Sprintf("%s.%d", *crowdProfile, n)); err != nil {
			return f, err
		}
	}
	cpu0, t0 := d.cpuSeconds(), time.Now()
	time.Sleep(5 * time.Second)
	f.idleCPUPercent = (d.cpuSeconds() - cpu0) / time.Since(t0).Seconds() * 100
	if f.describe, err = restDescribeP50(ctx, "http://"+d.httpAddr+"/v1/locks/"+name+"?pageSize=100"); err != nil {
		return f, err
	}
	drain := time.Now()
	if err := holder.Release(ctx); err != nil {
		return f, err
	}
	wg.Wait()
	f.handoff = float64(n) / time.Since(drain).Seconds()
	return f, failed.get()
}

// saveProfiles saves the daemon's heap profile (after a collection) to
// prefix.heap and its goroutines, grouped by stack, to prefix.goroutines.
func saveProfiles(ctx context.Context, httpAddr, prefix string) error {
	for path, file := range map[string]string{"heap?gc=1": prefix + ".heap", "goroutine?debug=1": prefix + ".goroutines"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/debug/pprof/"+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		if err := os.WriteFile(file, body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// crowdSessions opens n sessions spread over cs, 64 at a time.
func crowdSessions(ctx context.Context, cs []*clientlib.Client, n int) ([]*clientlib.Session, error) {
	sessions := make([]*clientlib.Session, n)
	var failed firstError
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range sessions {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := cs[i%len(cs)].NewSession(ctx, clientlib.WithTTL(60*time.Second))
			if err != nil {
				failed.set(err)
				return
			}
			sessions[i] = s
		})
	}
	wg.Wait()
	return sessions, failed.get()
}

// restDescribeP50 is the median of 21 GETs of url.
func restDescribeP50(ctx context.Context, url string) (time.Duration, error) {
	var lat []time.Duration
	for range 21 {
		t0 := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], nil
}

// crowdZooKeeper runs go-zookeeper's lock recipe with n waiters over 10
// sessions on ZooKeeper o.
func crowdZooKeeper(o *outsider, n int) (crowdFigures, error) {
	f := crowdFigures{n: n}
	conns := make([]*zk.Conn, 10)
	for i := range conns {
		c, err := zkConnect(o.addr, 60*time.Second)
		if err != nil {
			return f, err
		}
		defer c.Close()
		conns[i] = c
	}
	path := fmt.Sprintf("/bench/crowd-%d", n)
	if err := zkMkdirs(conns[0], path); err != nil {
		return f, err
	}
	rss0 := procRSSKiB(o.cmd.Process.Pid)
	holder := zk.NewLock(conns[0], path, zk.WorldACL(zk.PermAll))
	if err := holder.Lock(); err != nil {
		return f, err
	}
	var failed firstError
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			l := zk.NewLock(conns[i%len(conns)], path, zk.WorldACL(zk.PermAll))
			err := l.Lock()
			if err == nil {
				err = l.Unlock()
			}
			if err != nil {
				failed.set(err)
			}
		})
	}
	for {
		kids, _, err := conns[0].Children(path)
		if err != nil {
			return f, err
		}
		if len(kids) >= n+1 {
			break
		}
		if err := failed.get(); err != nil {
			return f, fmt.Errorf("zookeeper: a waiter failed after %d of %d joined: %w", len(kids)-1, n, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a bench's progress, not a test
	}
	f.join = time.Since(start)
	time.Sleep(2 * time.Second)
	f.memPerWaiter = float64(procRSSKiB(o.cmd.Process.Pid)-rss0) / float64(n)
	cpu0, t0 := o.cpuSeconds(), time.Now()
	time.Sleep(5 * time.Second)
	f.idleCPUPercent = (o.cpuSeconds() - cpu0) / time.Since(t0).Seconds() * 100
	var lat []time.Duration
	for range 21 {
		t0 := time.Now()
		if _, _, err := conns[1].Children(path); err != nil {
			return f, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	f.describe = lat[len(lat)/2]
	drain := time.Now()
	if err := holder.Unlock(); err != nil {
		return f, err
	}
	wg.Wait()
	f.handoff = float64(n) / time.Since(drain).Seconds()
	if err := failed.get(); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return f, err
	}
	return f, nil
}

// crowdOverREST is the hand-off through a crowd of REST clients: each waits
// with POST /v1/locks:acquire (its own session) and, once granted,
// releases by its token (POST /v1/locks:release with the name, the token
// and its own session: a holder's own release, which the member resolves
// through its view of the queue; without the session it would be a release
// from outside, which asks the holder first, see docs/guarantees.md). It
// returns grants per second.
func crowdOverREST(bin, dir string, n int) (joined time.Duration, rate float64, err error) {
	d, err := startDaemon(bin, dir, "--max-sessions-per-principal", "-1", "--max-waiters-per-principal", "-1")
	if err != nil {
		return 0, 0, err
	}
	defer d.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base := "http://" + d.httpAddr
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n + 10, MaxConnsPerHost: n + 10}}
	post := func(path, body string) (map[string]any, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("POST %s: %s %v", path, resp.Status, out)
		}
		return out, nil
	}
	const name = "bench/crowd-rest"
	// acquire returns the body of a release of the grant it waited for.
	acquire := func(i int) (string, error) {
		s, err := post("/v1/sessions", `{"ttl":"120s"}`)
		if err != nil {
			return "", err
		}
		id := s["session"].(map[string]any)["id"].(string)
		g, err := post("/v1/locks:acquire", fmt.Sprintf(`{"name":%q,"sessionId":%q,"requestId":"r%d"}`, name, id, i))
		if err != nil {
			return "", err
		}
		return fmt.Sprintf(`{"name":%q,"token":%q,"sessionId":%q}`, name, g["grant"].(map[string]any)["token"].(string), id), nil
	}
	holder, err := acquire(0)
	if err != nil {
		return 0, 0, err
	}
	var failed firstError
	var wg sync.WaitGroup
	start := time.Now()
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			release, err := acquire(i)
			if err == nil {
				_, err = post("/v1/locks:release", release)
			}
			if err != nil && ctx.Err() == nil {
				failed.set(err)
			}
		})
	}
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = c.Close() }()
	for {
		st, err := c.Admin().DescribeLockPage(ctx, name, clientlib.LockPage{Size: 1})
		if err != nil {
			return 0, 0, err
		}
		if st.WaiterCount >= n {
			break
		}
		if err := failed.get(); err != nil {
			return 0, 0, err
		}
		time.Sleep(20 * time.Millisecond) // polling a bench's progress, not a test
	}
	joined = time.Since(start)
	drain := time.Now()
	if _, err := post("/v1/locks:release", holder); err != nil {
		return 0, 0, err
	}
	wg.Wait()
	return joined, float64(n) / time.Since(drain).Seconds(), failed.get()
}
