package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/clientlib"
)

// The config fan-out on a cluster (-only config -config-members 3): K
// subscribers of one key on a few clients, each client on one member, and
// updates published through the first member, one after another at a
// fixed pace. Each delivery is timed from the publish call and counted
// against the member its subscriber is on, so a tail that comes from one
// member (the leader, or a follower whose watch lags) shows.

// clusterFanout is one peer: subscribers spread over members.
type clusterFanout interface {
	// subscribeAll opens k subscribers at once, the i-th on the member
	// memberOf(i) names, whose deliveries go to seen(i, value); it returns
	// once every one is established.
	subscribeAll(ctx context.Context, k int, seen func(i int, value string)) error
	// memberOf is the index of the member subscriber i is on.
	memberOf(i int) int
	publish(ctx context.Context, value string) error
	close()
}

// sdkClusterFanout: SDK subscriptions on clients, client c on member
// c % members (one endpoint each), subscription i on client i % clients.
// With everywhere set, every client is given every member and goes where
// the SDK takes it (the member that leads etcd).
type sdkClusterFanout struct {
	*sdkFanout
	members    int
	everywhere bool
}

func newSDKClusterFanout(ctx context.Context, addrs []string, ns string, clients int, everywhere bool) (*sdkClusterFanout, error) {
	f := &sdkClusterFanout{sdkFanout: &sdkFanout{ns: ns}, members: len(addrs), everywhere: everywhere}
	for c := range clients {
		eps := []string{addrs[c%len(addrs)]}
		if everywhere {
			eps = addrs
		}
		cli, err := clientlib.New(ctx, clientlib.Config{Endpoints: eps})
		if err != nil {
			f.close()
			return nil, err
		}
		f.clis = append(f.clis, cli)
	}
	return f, nil
}

func (f *sdkClusterFanout) memberOf(i int) int {
	if f.everywhere {
		return 0 // wherever the SDK went: reported as one group
	}
	return (i % len(f.clis)) % f.members
}

// etcdClusterFanout: raw clientv3 watches of one prefix, client c on
// member c % members, watch i on client i % clients; puts through the
// first client (on the first member).
type etcdClusterFanout struct {
	*etcdFanout
	members int
}

func newEtcdClusterFanout(urls []string, prefix string, clients int) (*etcdClusterFanout, error) {
	f := &etcdClusterFanout{etcdFanout: &etcdFanout{prefix: prefix}, members: len(urls)}
	for c := range clients {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{urls[c%len(urls)]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			f.close()
			return nil, err
		}
		f.clis = append(f.clis, cli)
	}
	return f, nil
}

func (f *etcdClusterFanout) memberOf(i int) int { return (i % len(f.clis)) % f.members }

// clusterFanoutRun is one round of one peer: delivery latencies by the
// subscriber's member, and the set-up time.
type clusterFanoutRun struct {
	byMember map[int][]float64 // microseconds
	first    []float64         // the first publish's deliveries, microseconds
	setup    time.Duration
	missed   int       // deliveries not seen within the wait (should be 0)
	last     []float64 // per publish: its last delivery, microseconds
	calls    []float64 // per publish: the publish call itself (its commit), microseconds
	// afterCommit are the deliveries timed from the end of their publish
	// call instead of its start: the fan-out alone, without the commit
	// (which stalls now and then on this machine's disk, for every peer).
	afterCommit []float64
	current     []float64 // the current publish's deliveries
}

// slowest names the publish whose last delivery came latest.
func (r clusterFanoutRun) slowest() string {
	if len(r.last) == 0 {
		return "-"
	}
	i := 0
	for j, l := range r.last {
		if l > r.last[i] {
			i = j
		}
	}
	return fmt.Sprintf("#%d %.1fms (its publish call %.1fms; slowest call %.1fms)", i, r.last[i]/1000, r.calls[i]/1000, slices.Max(r.calls)/1000)
}

func (r clusterFanoutRun) all() []float64 {
	var out []float64
	for _, l := range r.byMember {
		out = append(out, l...)
	}
	return out
}

// runClusterFanout opens k subscribers on p, then publishes n values, each
// at least every apart and once the previous one reached everyone.
func runClusterFanout(p clusterFanout, k, n int, every time.Duration) (clusterFanoutRun, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := clusterFanoutRun{byMember: map[int][]float64{}}
	var mu sync.Mutex
	var cur string
	var t0 time.Time
	got := 0
	done := make(chan struct{}, 1)
	seen := func(i int, v string) {
		at := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if v != cur {
			return
		}
		m, us := p.memberOf(i), float64(at.Sub(t0).Microseconds())
		r.byMember[m] = append(r.byMember[m], us)
		if len(r.last) == 0 {
			r.first = append(r.first, us)
		}
		r.current = append(r.current, us)
		if got++; got == k {
			done <- struct{}{}
		}
	}
	t1 := time.Now()
	if err := p.subscribeAll(ctx, k, seen); err != nil {
		return r, err
	}
	r.setup = time.Since(t1)
	for i := range n {
		mu.Lock()
		cur, t0, got, r.current = fmt.Sprintf("v%d-%d-%d", k, i, time.Now().UnixNano()), time.Now(), 0, r.current[:0]
		v, start := cur, t0
		mu.Unlock()
		if err := p.publish(ctx, v); err != nil {
			return r, err
		}
		called := float64(time.Since(start).Microseconds())
		select {
		case <-done:
			mu.Lock()
			r.last = append(r.last, float64(time.Since(start).Microseconds()))
			r.calls = append(r.calls, called)
			for _, us := range r.current {
				r.afterCommit = append(r.afterCommit, max(us-called, 0))
			}
			mu.Unlock()
		case <-time.After(30 * time.Second):
			mu.Lock()
			r.missed += k - got
			mu.Unlock()
			return r, fmt.Errorf("publish %d: %d of %d subscribers saw it within 30s", i, got, k)
		}
		if rest := every - time.Since(start); rest > 0 {
			time.Sleep(rest) // the pace of the updates, not a wait for a condition
		}
	}
	return r, nil
}

// benchConfigCluster runs the fan-out on a cluster of members: coordd's
// SDK with subscribers spread over the members, the SDK as its clients
// place themselves (every endpoint given), and raw etcd watches spread the
// same way, for each subscriber count, in rounds.
func benchConfigCluster(bin, tmp string, members int) error {
	var ks []int
	for _, s := range strings.Split(*configClusterK, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-config-cluster-subscribers: %w", err)
		}
		ks = append(ks, k)
	}
	ds, err := startCluster(bin, filepath.Join(tmp, "config-cluster"), members)
	if err != nil {
		return err
	}
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	var grpcs, etcds []string
	for _, d := range ds {
		grpcs, etcds = append(grpcs, d.grpcAddr), append(etcds, d.etcdURL)
	}
	leader := "none"
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // the members report within a tick of the election
		if i := leaderIndex(grpcs); i >= 0 {
			leader = fmt.Sprintf("m%d", i)
			break
		}
	}
	const clients, every = 10, 50 * time.Millisecond
	fmt.Printf("\nconfig fan-out on %d members (each its own coordd process): K subscribers of one key on %d clients, client c on member c%%%d; "+
		"subscribers opened all at once; %d updates %s apart published through m0; etcd's leader: %s\n", members, clients, members, *configPubs, every, leader)
	fmt.Printf("%-34s %6s %5s %9s %9s %12s   %-40s %9s  %-20s %s\n", "peer", "K", "round", "p50", "p99", "p99 commit+", "p99 by subscriber's member", "set-up", "first publish p99", "slowest publish (its last delivery)")
	const (
		sdkSpread = "coordd SDK, spread over members"
		sdkLeader = "coordd SDK, every endpoint given"
		rawSpread = "raw etcd watch, spread"
	)
	type key struct {
		peer string
		k    int
	}
	runs := map[key][]clusterFanoutRun{}
	for _, k := range ks {
		for round := range *configClusterRounds {
			for _, name := range []string{sdkSpread, sdkLeader, rawSpread} {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				var p clusterFanout
				var err error
				prefix := fmt.Sprintf("k%d-r%d", k, round)
				switch name {
				case sdkSpread:
					p, err = newSDKClusterFanout(ctx, grpcs, "bench/spread-"+prefix, clients, false)
				case sdkLeader:
					p, err = newSDKClusterFanout(ctx, grpcs, "bench/leader-"+prefix, clients, true)
				default:
					p, err = newEtcdClusterFanout(etcds, "/bench-config-cluster/"+prefix+"/", clients)
				}
				cancel()
				if err != nil {
					return err
				}
				stopProfiles := func() error { return nil }
				if *configProfile != "" && round == 0 && k == ks[len(ks)-1] && name == sdkSpread {
					if stopProfiles, err = profileFanout(ds[0].httpAddr, k, *configProfile); err != nil {
						p.close()
						return err
					}
				}
				r, err := runClusterFanout(p, k, *configPubs, every)
				if perr := stopProfiles(); perr != nil && err == nil {
					err = perr
				}
				p.close()
				if err != nil {
					return fmt.Errorf("%s, K=%d, round %d: %w", name, k, round, err)
				}
				runs[key{name, k}] = append(runs[key{name, k}], r)
				var by []string
				for m := range members {
					if l := r.byMember[m]; len(l) > 0 {
						by = append(by, fmt.Sprintf("m%d %.1fms", m, percentile(l, 99)/1000))
					}
				}
				all := r.all()
				fmt.Printf("%-34s %6d %5d %7.2fms %7.2fms %10.2fms   %-40s %7.0fms  %18.1fms  %s\n", name, k, round, percentile(all, 50)/1000, percentile(all, 99)/1000,
					percentile(r.afterCommit, 99)/1000, strings.Join(by, "  "), float64(r.setup.Microseconds())/1000, percentile(r.first, 99)/1000, r.slowest())
			}
		}
	}
	fmt.Printf("\ntargets (coordd / raw etcd in the same round; below 1 is better):\n")
	for _, k := range ks {
		for _, name := range []string{sdkSpread, sdkLeader} {
			var p99s, fans, setups []string
			worst, worstFan, worstSetup := 0.0, 0.0, 0.0
			for round, r := range runs[key{name, k}] {
				e := runs[key{rawSpread, k}][round]
				p := percentile(r.all(), 99) / percentile(e.all(), 99)
				f := percentile(r.afterCommit, 99) / percentile(e.afterCommit, 99)
				s := r.setup.Seconds() / e.setup.Seconds()
				worst, worstFan, worstSetup = max(worst, p), max(worstFan, f), max(worstSetup, s)
				p99s, setups = append(p99s, fmt.Sprintf("%.2f", p)), append(setups, fmt.Sprintf("%.2f", s))
				fans = append(fans, fmt.Sprintf("%.2f", f))
			}
			target := "<= 1.0 every round"
			if k >= 10000 {
				target = "<= 0.5"
			}
			fmt.Printf("  K=%d, %s: delivery p99 by round %s, worst %.2f (target %s); after the commit %s, worst %.2f; set-up by round %s, worst %.2f (target <= 1.0)\n",
				k, name, strings.Join(p99s, " "), worst, target, strings.Join(fans, " "), worstFan, strings.Join(setups, " "), worstSetup)
		}
	}
	return nil
}

// profileFanout starts CPU profiles of member m0 (at httpAddr) and of the
// clients (this process) over a fan-out run; the returned func ends the
// clients' and waits for m0's. The run's set-up comes first: the profiles
// last long enough for the set-up and the publishes.
func profileFanout(httpAddr string, k int, file string) (func() error, error) {
	d := time.Duration(*configPubs)*60*time.Millisecond + time.Duration(k)*100*time.Microsecond + time.Second
	server := make(chan error, 1)
	go func() { server <- cpuProfile(httpAddr, d, file) }()
	clients, err := os.Create(file + ".clients")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(clients); err != nil {
		_ = clients.Close() // not written to; the profile's error is the one to report
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		err := clients.Close()
		if serr := <-server; serr != nil {
			return serr
		}
		fmt.Printf("(CPU profile of m0 during the first spread run at K=%d: %s; of the clients: %[2]s.clients)\n", k, file)
		return err
	}, nil
}
