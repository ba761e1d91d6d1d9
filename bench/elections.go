package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
)

// An elector is one candidate of the election benchmarks: coordd through
// the SDK, or etcd's concurrency.Election.
type elector interface {
	campaign(ctx context.Context, value string) error
	proclaim(ctx context.Context, value string) error
	resign(ctx context.Context) error
	// close ends the client after a workload. Its errors are not the
	// workload's, and are dropped: what is left expires with its session.
	close()
}

type electionPeer struct {
	name string
	// candidate returns a candidate with its own session (ttl seconds).
	candidate func(ttl int) (elector, error)
	// observe follows the election and calls seen with every value it
	// delivers, until ctx ends.
	observe func(ctx context.Context, seen func(value string)) error
	// queued reports how many candidates (leader included) are in line.
	queued func(ctx context.Context) (int, error)
	// child is the -campaign-child spec that makes a process lead.
	child string
}

type coorddElector struct {
	c    *clientlib.Client
	s    *clientlib.Session
	name string
	l    *clientlib.Leadership
}

func (e *coorddElector) campaign(ctx context.Context, value string) (err error) {
	e.l, err = e.s.Campaign(ctx, e.name, value)
	return err
}
func (e *coorddElector) proclaim(ctx context.Context, v string) error { return e.l.Proclaim(ctx, v) }
func (e *coorddElector) resign(ctx context.Context) error             { return e.l.Resign(ctx) }
func (e *coorddElector) close()                                       { _ = e.c.Close() }

type etcdElector struct {
	cli *clientv3.Client
	s   *concurrency.Session
	e   *concurrency.Election
}

func (e *etcdElector) campaign(ctx context.Context, v string) error { return e.e.Campaign(ctx, v) }
func (e *etcdElector) proclaim(ctx context.Context, v string) error { return e.e.Proclaim(ctx, v) }
func (e *etcdElector) resign(ctx context.Context) error             { return e.e.Resign(ctx) }
func (e *etcdElector) close()                                       { _ = e.s.Close(); _ = e.cli.Close() }

func electionPeers(grpcAddr, etcdURL, name string) []electionPeer {
	rawClient := func() (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	}
	etcdPrefix := "/bench-election/" + name
	peers := []electionPeer{
		{
			name: "coordd SDK",
			candidate: func(ttl int) (elector, error) {
				c, err := clientlib.New(context.Background(), clientlib.Config{Endpoints: []string{grpcAddr}})
				if err != nil {
					return nil, err
				}
				s, err := c.NewSession(context.Background(), clientlib.WithTTL(time.Duration(ttl)*time.Second))
				if err != nil {
					_ = c.Close()
					return nil, err
				}
				return &coorddElector{c: c, s: s, name: name}, nil
			},
			observe: func(ctx context.Context, seen func(string)) error {
				c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{grpcAddr}})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				obs := c.Observe(ctx, name)
				for ev := range obs.Events() {
					if ev.Type == clientlib.ElectionElected || ev.Type == clientlib.ElectionProclaimed {
						seen(ev.Leader.Value)
					}
				}
				return nil
			},
			queued: func(ctx context.Context) (int, error) {
				c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{grpcAddr}})
				if err != nil {
					return 0, err
				}
				defer func() { _ = c.Close() }()
				cands, err := c.Candidates(ctx, name)
				if err != nil {
					return 0, err
				}
				if _, err := c.Leader(ctx, name); err == nil {
					return len(cands) + 1, nil
				}
				return len(cands), nil
			},
			child: "coordd," + grpcAddr + "," + name,
		},
		{
			name: "etcd concurrency.Election",
			candidate: func(ttl int) (elector, error) {
				cli, err := rawClient()
				if err != nil {
					return nil, err
				}
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
				if err != nil {
					_ = cli.Close()
					return nil, err
				}
				return &etcdElector{cli: cli, s: s, e: concurrency.NewElection(s, etcdPrefix)}, nil
			},
			observe: func(ctx context.Context, seen func(string)) error {
				cli, err := rawClient()
				if err != nil {
					return err
				}
				defer func() { _ = cli.Close() }()
				s, err := concurrency.NewSession(cli)
				if err != nil {
					return err
				}
				defer func() { _ = s.Close() }()
				for resp := range concurrency.NewElection(s, etcdPrefix).Observe(ctx) {
					if len(resp.Kvs) > 0 {
						seen(string(resp.Kvs[0].Value))
					}
				}
				return nil
			},
			queued: func(ctx context.Context) (int, error) {
				cli, err := rawClient()
				if err != nil {
					return 0, err
				}
				defer func() { _ = cli.Close() }()
				resp, err := cli.Get(ctx, etcdPrefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					return 0, err
				}
				return int(resp.Count), nil
			},
			child: "etcd," + etcdURL + "," + name,
		},
	}
	if outsiders.zk != nil {
		peers = append(peers, zkElectionPeer(outsiders.zk, name))
	}
	return peers
}

// waitQueued polls until n candidates are in line. It polls back to back,
// without sleeping: a pause before the call timed next (the resign) would
// time it on a machine gone idle, which costs a raw put too 1.5-2.5 times
// its back-to-back p50 (a 2 ms pause did), while the ratios divide by
// back-to-back puts.
func waitQueued(ctx context.Context, p electionPeer, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := p.queued(ctx)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d candidates in line after 10s, want %d", got, n)
		}
	}
}

// handovers measures n graceful hand-overs between two candidates: the
// leader resigns while the other waits in Campaign; the time from the
// Resign call to the waiter's Campaign returning, and how long the Resign
// call itself took.
func handovers(p electionPeer, n int) (lat, resigns []float64, err error) {
	ctx := context.Background()
	a, err := p.candidate(30)
	if err != nil {
		return nil, nil, err
	}
	defer a.close()
	b, err := p.candidate(30)
	if err != nil {
		return nil, nil, err
	}
	defer b.close()
	if err := a.campaign(ctx, "a"); err != nil {
		return nil, nil, err
	}
	leader, waiter := a, b
	for i := range n {
		done := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			if err := waiter.campaign(ctx, strconv.Itoa(i)); err != nil {
				errc <- err
				return
			}
			done <- time.Now()
		}()
		if err := waitQueued(ctx, p, 2); err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		if err := leader.resign(ctx); err != nil {
			return nil, nil, err
		}
		resigns = append(resigns, float64(time.Since(t0).Microseconds()))
		select {
		case t1 := <-done:
			lat = append(lat, float64(t1.Sub(t0).Microseconds()))
		case err := <-errc:
			return nil, nil, err
		case <-time.After(10 * time.Second):
			return nil, nil, errors.New("no hand-over within 10s")
		}
		leader, waiter = waiter, leader
	}
	return lat, resigns, leader.resign(ctx)
}

// proclaims measures n proclamations: the time from the Proclaim call to
// an observer (another client) delivering the value.
func proclaims(p electionPeer, n int) ([]float64, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := p.candidate(30)
	if err != nil {
		return nil, err
	}
	defer a.close()
	if err := a.campaign(ctx, "start"); err != nil {
		return nil, err
	}
	seen := make(chan string, 16)
	observed := make(chan error, 1) // the observer's end: an error, or nil once ctx ends
	go func() { observed <- p.observe(ctx, func(v string) { seen <- v }) }()
	waitFor := func(v string) error {
		for {
			select {
			case got := <-seen:
				if got == v {
					return nil
				}
			case err := <-observed:
				if err == nil {
					err = errors.New("its stream ended")
				}
				return fmt.Errorf("observer stopped before delivering %q: %w", v, err)
			case <-time.After(10 * time.Second):
				return fmt.Errorf("observer did not deliver %q within 10s", v)
			}
		}
	}
	if err := waitFor("start"); err != nil {
		return nil, err
	}
	var lat []float64
	for i := range n {
		v := "v" + strconv.Itoa(i)
		t0 := time.Now()
		if err := a.proclaim(ctx, v); err != nil {
			return nil, err
		}
		if err := waitFor(v); err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds()))
	}
	return lat, a.resign(ctx)
}

// failover starts a child process that leads, queues a candidate here,
// kills the child (SIGKILL) and returns the time from the kill to this
// candidate's Campaign returning.
func failover(p electionPeer, self string, ttl int) (time.Duration, error) {
	ctx := context.Background()
	child := exec.Command(self, "-campaign-child", p.child+","+strconv.Itoa(ttl))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := child.Start(); err != nil {
		return 0, err
	}
	// Killed on every path (a second Kill fails: it is gone already), then
	// reaped; Wait reports the kill, which is the expected end.
	defer func() { _ = child.Wait() }()
	defer func() { _ = child.Process.Kill() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("campaign child: %q, %w", line, err)
	}
	if strings.TrimSpace(line) != "elected" {
		return 0, fmt.Errorf("campaign child: %q", line)
	}
	b, err := p.candidate(ttl)
	if err != nil {
		return 0, err
	}
	defer b.close()
	done := make(chan error, 1)
	go func() { done <- b.campaign(ctx, "next") }()
	if err := waitQueued(ctx, p, 2); err != nil {
		return 0, err
	}
	// Kill at a random point of the child's keep-alive cycle (TTL/3).
	time.Sleep(time.Second + rand.N(time.Duration(ttl)*time.Second/3))
	t0 := time.Now()
	if err := child.Process.Kill(); err != nil {
		return 0, err
	}
	if err := <-done; err != nil {
		return 0, err
	}
	took := time.Since(t0)
	return took, b.resign(ctx)
}

// runCampaignChild leads an election until killed: -campaign-child
// kind,endpoint,name,ttl.
func runCampaignChild(spec string) {
	parts := strings.Split(spec, ",")
	ttl, _ := strconv.Atoi(parts[3])
	peers := electionPeers(parts[1], parts[1], parts[2])
	p := peers[0]
	switch parts[0] {
	case "etcd":
		p = peers[1]
	case "zk":
		p = zkElectionPeer(&outsider{addr: parts[1]}, parts[2])
	}
	e, err := p.candidate(ttl)
	if err == nil {
		err = e.campaign(context.Background(), "child")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "campaign child:", err)
		os.Exit(1)
	}
	fmt.Println("elected")
	select {}
}

// benchElections runs the election workloads for coordd and etcd's
// concurrency.Election on the same etcd and prints them with the ratios the
// targets use.
func benchElections(grpcAddr, etcdURL string) error {
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer func() { _ = raw.Close() }()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx := context.Background()
	putLat, err := rawPuts(ctx, raw, 500)
	if err != nil {
		return err
	}
	put50 := percentile(putLat, 50)
	var beside []float64 // raw puts timed before each peer's hand-overs, for the ratios
	fmt.Printf("\nelections (%d rounds of %d hand-overs and %d proclamations per peer; %d crash fail-overs per peer with TTL %ds; raw etcd put p50 %.0fus)\n",
		*electionRounds, *electionOps, *electionOps, *failovers, *failoverTTL, put50)
	fmt.Printf("%-28s %-34s %10s %10s %6s\n", "peer", "workload", "p50", "p99", "n")
	handover := map[string][]float64{}
	resign := map[string][]float64{}
	proclaim := map[string][]float64{}
	fail := map[string][]float64{}
	for round := range *electionRounds {
		peers := electionPeers(grpcAddr, etcdURL, fmt.Sprintf("e%d", round))
		for i := range peers {
			p := peers[(i+round)%len(peers)]
			puts, err := rawPuts(ctx, raw, *electionOps)
			if err != nil {
				return err
			}
			beside = append(beside, puts...)
			h, r, err := handovers(p, *electionOps)
			if err != nil {
				return fmt.Errorf("%s hand-over: %w", p.name, err)
			}
			handover[p.name] = append(handover[p.name], h...)
			resign[p.name] = append(resign[p.name], r...)
			pr, err := proclaims(p, *electionOps)
			if err != nil {
				return fmt.Errorf("%s proclaim: %w", p.name, err)
			}
			proclaim[p.name] = append(proclaim[p.name], pr...)
		}
	}
	for k := range *failovers {
		peers := electionPeers(grpcAddr, etcdURL, fmt.Sprintf("f%d", k))
		for i := range peers {
			p := peers[(i+k)%len(peers)]
			d, err := failover(p, self, *failoverTTL)
			if err != nil {
				return fmt.Errorf("%s fail-over: %w", p.name, err)
			}
			fail[p.name] = append(fail[p.name], float64(d.Microseconds()))
		}
	}
	ms := func(us float64) string { return fmt.Sprintf("%.1fms", us/1000) }
	for _, p := range electionPeers("", "", "") {
		for _, w := range []struct {
			name string
			lat  []float64
		}{
			{"graceful hand-over", handover[p.name]},
			{"resign call", resign[p.name]},
			{"proclaim -> observer", proclaim[p.name]},
			{"crash fail-over (SIGKILL)", fail[p.name]},
		} {
			fmt.Printf("%-28s %-34s %10s %10s %6d\n", p.name, w.name, ms(percentile(w.lat, 50)), ms(percentile(w.lat, 99)), len(w.lat))
		}
	}
	co, et := "coordd SDK", "etcd concurrency.Election"
	ttl := float64(*failoverTTL) * 1e6
	// The ratios' raw put: timed before each peer's hand-overs in every
	// round, so that the machine's drift over the run weighs on both sides
	// alike.
	put50 = percentile(beside, 50)
	fmt.Printf("\ntargets (raw put p50 %.0fus, timed before each peer's hand-overs, %d puts):\n", put50, len(beside))
	fmt.Printf("  hand-over p50 / raw put:                  %.2f (target <= 1.3); etcd's recipe: %.2f\n", percentile(handover[co], 50)/put50, percentile(handover[et], 50)/put50)
	fmt.Printf("  hand-over p50 coordd / etcd recipe:       %.2f\n", percentile(handover[co], 50)/percentile(handover[et], 50))
	fmt.Printf("  resign call p50 / raw put:                %.2f (target <= 1.3); etcd's recipe: %.2f\n", percentile(resign[co], 50)/put50, percentile(resign[et], 50)/put50)
	fmt.Printf("  resign call p50 coordd / etcd recipe:     %.2f (the recipe's resign is one delete, measured beside coordd's)\n", percentile(resign[co], 50)/percentile(resign[et], 50))
	fmt.Printf("  proclaim->observer p50 coordd / etcd:     %.2f\n", percentile(proclaim[co], 50)/percentile(proclaim[et], 50))
	fmt.Printf("  crash fail-over max - TTL:                %+.0fms (target <= +200ms); etcd's recipe: %+.0fms\n", (maxOf(fail[co])-ttl)/1000, (maxOf(fail[et])-ttl)/1000)
	if zl := zkLatch; len(handover[zl]) > 0 {
		fmt.Printf("  hand-over p50 coordd / ZooKeeper latch:   %.2f (target <= 1); resign call: %.2f; proclaim->observer: %.2f; crash fail-over max - TTL (session timeout): %+.0fms\n",
			percentile(handover[co], 50)/percentile(handover[zl], 50), percentile(resign[co], 50)/percentile(resign[zl], 50),
			percentile(proclaim[co], 50)/percentile(proclaim[zl], 50), (maxOf(fail[zl])-ttl)/1000)
	}
	return nil
}

func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
