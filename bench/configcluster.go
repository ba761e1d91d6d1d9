package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	"github.com/coordd/coordd/internal/base/names"
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
	byMember map[int][]float64 // microseconds from the start of the publish call
	// afterMember are the same deliveries timed from the end of their
	// publish call: the fan-out alone, without the commit (which stalls
	// now and then on this machine's disk, for every peer).
	afterMember map[int][]float64
	firstMember map[int][]float64 // the first publish's deliveries
	setup       time.Duration
	missed      int       // deliveries not seen within the wait (should be 0)
	last        []float64 // per publish: its last delivery, microseconds
	calls       []float64 // per publish: the publish call itself (its commit), microseconds
	current     []sample  // the current publish's deliveries
	disk        diskOps   // the members' slow disk operations during the run
	// CPU seconds per publish over the publishes (their pauses included):
	// the members' (this build's daemons, all of them; -1: not measured)
	// and this process's, which holds every peer's clients.
	memberCPU, clientCPU float64
}

// sample is one delivery: the subscriber's member and its latency.
type sample struct {
	member int
	us     float64
}

// delivery is a sample and its latency after the publish call returned.
type delivery struct {
	member    int
	us, after float64
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

func merged(by map[int][]float64) []float64 {
	var out []float64
	for _, l := range by {
		out = append(out, l...)
	}
	return out
}

func (r clusterFanoutRun) all() []float64         { return merged(r.byMember) }
func (r clusterFanoutRun) afterCommit() []float64 { return merged(r.afterMember) }
func (r clusterFanoutRun) first() []float64       { return merged(r.firstMember) }

// only is r with the deliveries of the members keep keeps.
func (r clusterFanoutRun) only(keep func(member int) bool) clusterFanoutRun {
	pick := func(by map[int][]float64) map[int][]float64 {
		out := map[int][]float64{}
		for m, l := range by {
			if keep(m) {
				out[m] = l
			}
		}
		return out
	}
	r.byMember, r.afterMember, r.firstMember = pick(r.byMember), pick(r.afterMember), pick(r.firstMember)
	return r
}

// runClusterFanout opens k subscribers on p, then publishes n values, each
// at least every apart and once the previous one reached everyone.
//
// membersCPU, when not nil, returns the members' CPU seconds so far (-1:
// unknown).
func runClusterFanout(p clusterFanout, k, n int, every time.Duration, membersCPU func() float64) (r clusterFanoutRun, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r = clusterFanoutRun{byMember: map[int][]float64{}, afterMember: map[int][]float64{}, firstMember: map[int][]float64{}}
	// Every delivery's sample is kept in room made before the first
	// publish, and sorted by member after the last: growing slices while
	// deliveries are timed made the bench's own garbage, collected during
	// some publishes, whichever peer ran.
	r.current = make([]sample, 0, k)
	timed := make([]delivery, 0, k*n)
	defer func() {
		for _, d := range timed {
			r.byMember[d.member] = append(r.byMember[d.member], d.us)
			r.afterMember[d.member] = append(r.afterMember[d.member], d.after)
		}
	}()
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
		if len(r.last) == 0 {
			r.firstMember[m] = append(r.firstMember[m], us)
		}
		r.current = append(r.current, sample{m, us})
		if got++; got == k {
			done <- struct{}{}
		}
	}
	t1 := time.Now()
	if err := p.subscribeAll(ctx, k, seen); err != nil {
		return r, err
	}
	r.setup = time.Since(t1)
	// On two CPUs shared by the members and the clients, a round's
	// deliveries wait for CPU: what a publish costs both sides says how
	// much of a ratio is that.
	c0, m0 := selfCPUSeconds(), -1.0
	if membersCPU != nil {
		m0 = membersCPU()
	}
	r.memberCPU = -1
	defer func() {
		if err != nil {
			return
		}
		r.clientCPU = (selfCPUSeconds() - c0) / float64(n)
		if m0 >= 0 {
			if m1 := membersCPU(); m1 >= 0 {
				r.memberCPU = (m1 - m0) / float64(n)
			}
		}
	}()
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
			for _, d := range r.current {
				timed = append(timed, delivery{d.member, d.us, max(d.us-called, 0)})
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
	peers := []string{sdkSpread, sdkLeader, rawSpread, sharedPair}
	// The other build's member, for the A/B (one member: checked by run).
	var others []string
	if *configOtherBin != "" {
		od, err := startCluster(*configOtherBin, filepath.Join(tmp, "config-other"), 1)
		if err != nil {
			return fmt.Errorf("the other build: %w", err)
		}
		defer od[0].stop()
		others = []string{od[0].grpcAddr}
		peers = append(peers, sdkOther)
		fmt.Printf("(A/B: %q is the build %s, on a member of its own beside this build's)\n", sdkOther, *configOtherBin)
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
		"subscribers opened all at once; %d updates %s apart published through m0; etcd's leader: %s\n", members, clients, members, publishes(true), every, leader)
	fmt.Printf("(shared commits: the SDK's spread subscribers and raw etcd watches of the etcd key the SDK's publishes write, all open at once: " +
		"each publish is one commit both see, timed from the same call, so a commit that stalls stalls both)\n")
	fmt.Printf("%-38s %6s %5s %9s %9s %12s %16s %18s   %-40s %9s  %-18s %-27s %s\n", "peer", "K", "round", "p50", "p99", "p99 commit+", "call p50/p99",
		"CPU/publish m+c", "p99 by subscriber's member", "set-up", "first publish p99", "disk ops over 32 (16) ms", "slowest publish (its last delivery)")
	var https []string
	for _, d := range ds {
		https = append(https, d.httpAddr)
	}
	// A fresh cluster's first runs are slower, whichever peer makes them
	// (the members' and this process's first connections, heaps and
	// caches): each peer runs once untimed, at the smallest K, first.
	for _, name := range peers {
		if _, err := runClusterPeer(name, slices.Min(ks), -1, peerMembers(name, grpcs, others), etcds, clients, every, ds, false); err != nil {
			return fmt.Errorf("%s, warm-up: %w", name, err)
		}
	}
	fmt.Printf("(each peer ran once at K=%d before the rounds, untimed; a round runs the peers in turn, the first one rotating)\n", slices.Min(ks))
	runs := map[clusterKey][]clusterFanoutRun{}
	for _, k := range ks {
		for round := range *configClusterRounds {
			for i := range peers {
				name := peers[(i+round)%len(peers)]
				before := slowDiskOps(https)
				r, err := runClusterPeer(name, k, round, peerMembers(name, grpcs, others), etcds, clients, every, ds, *configProfile != "" && round == 0 && k == ks[len(ks)-1] && name == sdkSpread)
				if err != nil {
					return fmt.Errorf("%s, K=%d, round %d: %w", name, k, round, err)
				}
				disk := slowDiskOps(https).minus(before)
				r.disk = disk
				if name != sharedPair {
					runs[clusterKey{name, k}] = append(runs[clusterKey{name, k}], r)
					printClusterRow(name, k, round, r, members, disk)
					continue
				}
				sdk, raw := r.only(func(m int) bool { return m < rawGroup }), r.only(func(m int) bool { return m >= rawGroup })
				sdk.setup, raw.setup = 0, 0 // both opened in one run: no set-up of either alone
				runs[clusterKey{sharedSDK, k}] = append(runs[clusterKey{sharedSDK, k}], sdk)
				runs[clusterKey{sharedRaw, k}] = append(runs[clusterKey{sharedRaw, k}], raw)
				printClusterRow(sharedSDK, k, round, sdk, members, disk)
				printClusterRow(sharedRaw, k, round, raw, members, disk)
			}
		}
	}
	printClusterTargets(ks, runs, members)
	return nil
}

// peerMembers returns the gRPC addresses a peer's subscribers go to: the
// other build's member for the A/B peer, else the members.
func peerMembers(name string, grpcs, others []string) []string {
	if name == sdkOther {
		return others
	}
	return grpcs
}

// The peers of the fan-out on a cluster.
const (
	sdkSpread  = "coordd SDK, spread over members"
	sdkLeader  = "coordd SDK, every endpoint given"
	rawSpread  = "raw etcd watch, spread"
	sharedPair = "shared commits"
	sharedSDK  = "shared commits: coordd SDK, spread"
	sharedRaw  = "shared commits: raw etcd watch, spread"
	sdkOther   = "coordd SDK, spread, other build"
)

// rawGroup is added to the member index of the raw etcd watches in a
// shared-commit run, to tell their deliveries from the SDK's.
const rawGroup = 100

type clusterKey struct {
	peer string
	k    int
}

// runClusterPeer runs one round of one peer (of name) with k subscribers
// (k of each in a shared-commit run), profiling it when asked. ds are
// this build's members, m0 first.
func runClusterPeer(name string, k, round int, grpcs, etcds []string, clients int, every time.Duration, ds []*daemon, profile bool) (clusterFanoutRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var p clusterFanout
	var err error
	prefix := fmt.Sprintf("k%d-r%d", k, round) // round -1: the warm-up
	subscribers := k
	switch name {
	case sdkSpread, sdkOther:
		p, err = newSDKClusterFanout(ctx, grpcs, "bench/spread-"+prefix, clients, false)
	case sdkLeader:
		p, err = newSDKClusterFanout(ctx, grpcs, "bench/leader-"+prefix, clients, true)
	case rawSpread:
		p, err = newEtcdClusterFanout(etcds, "/bench-config-cluster/"+prefix+"/", clients)
	default:
		p, err = newSharedFanout(ctx, grpcs, etcds, "bench/shared-"+prefix, clients, k)
		subscribers = 2 * k
	}
	if err != nil {
		return clusterFanoutRun{}, err
	}
	defer p.close()
	stopProfiles := func() error { return nil }
	if profile {
		if stopProfiles, err = profileFanout(ds[0].httpAddr, k, *configProfile); err != nil {
			return clusterFanoutRun{}, err
		}
	}
	var membersCPU func() float64
	if name != sdkOther { // its member is the other build's
		membersCPU = func() float64 {
			sum := 0.0
			for _, d := range ds {
				if c := d.cpuSeconds(); c >= 0 {
					sum += c
				} else {
					return -1
				}
			}
			return sum
		}
	}
	r, err := runClusterFanout(p, subscribers, publishes(true), every, membersCPU)
	if perr := stopProfiles(); perr != nil && err == nil {
		err = perr
	}
	return r, err
}

// cpuColumn is the CPU a publish cost the members and the clients.
func (r clusterFanoutRun) cpuColumn() string {
	m := "-"
	if r.memberCPU >= 0 {
		m = fmt.Sprintf("%.1f", r.memberCPU*1000)
	}
	return fmt.Sprintf("%s+%.1fms", m, r.clientCPU*1000)
}

func printClusterRow(name string, k, round int, r clusterFanoutRun, members int, disk diskOps) {
	var by []string
	for m := range members {
		for _, g := range []int{m, rawGroup + m} {
			if l := r.byMember[g]; len(l) > 0 {
				by = append(by, fmt.Sprintf("m%d %.1fms", m, percentile(l, 99)/1000))
			}
		}
	}
	setup := "-"
	if r.setup > 0 {
		setup = fmt.Sprintf("%.0fms", float64(r.setup.Microseconds())/1000)
	}
	all := r.all()
	fmt.Printf("%-38s %6d %5d %7.2fms %7.2fms %10.2fms %6.1f/%5.1fms %18s   %-40s %9s  %16.1fms %-27s %s\n", name, k, round, percentile(all, 50)/1000, percentile(all, 99)/1000,
		percentile(r.afterCommit(), 99)/1000, percentile(r.calls, 50)/1000, percentile(r.calls, 99)/1000, r.cpuColumn(), strings.Join(by, "  "), setup,
		percentile(r.first(), 99)/1000, disk, r.slowest())
}

// printClusterTargets prints the ratios of issue #41, coordd over raw etcd
// in the same round: separate runs, and the shared commits. Since a commit
// that stalls on the disk sets a round's p99 for whichever peer drew it,
// the worst ratio is also given over the rounds in which no member's WAL
// fsync or backend commit took over 32 ms in either peer's run.
func printClusterTargets(ks []int, runs map[clusterKey][]clusterFanoutRun, members int) {
	if len(runs[clusterKey{sdkOther, ks[0]}]) > 0 {
		fmt.Printf("\nA/B (this build / the other build, in the same round; below 1: this build is faster):\n")
		for _, k := range ks {
			var p50s, p99s, fans, calls []string
			for round, r := range runs[clusterKey{sdkSpread, k}] {
				o := runs[clusterKey{sdkOther, k}][round]
				p50s = append(p50s, fmt.Sprintf("%.2f", percentile(r.all(), 50)/percentile(o.all(), 50)))
				p99s = append(p99s, fmt.Sprintf("%.2f", percentile(r.all(), 99)/percentile(o.all(), 99)))
				fans = append(fans, fmt.Sprintf("%.2f", percentile(r.afterCommit(), 99)/percentile(o.afterCommit(), 99)))
				calls = append(calls, fmt.Sprintf("%.2f", percentile(r.calls, 50)/percentile(o.calls, 50)))
			}
			fmt.Printf("  K=%d: delivery p50 by round %s; p99 %s; after the commit p99 %s; publish call p50 %s\n",
				k, strings.Join(p50s, " "), strings.Join(p99s, " "), strings.Join(fans, " "), strings.Join(calls, " "))
		}
	}
	fmt.Printf("\ntargets (coordd / raw etcd in the same round; below 1 is better; \"calm\": rounds without a disk operation over 32 ms in either run):\n")
	for _, k := range ks {
		for _, pair := range [][2]string{{sdkSpread, rawSpread}, {sdkLeader, rawSpread}, {sharedSDK, sharedRaw}} {
			var p99s, fans, setups, cpus []string
			worst, worstCalm, worstFan, worstSetup := 0.0, 0.0, 0.0, 0.0
			calm := 0
			for round, r := range runs[clusterKey{pair[0], k}] {
				e := runs[clusterKey{pair[1], k}][round]
				p := percentile(r.all(), 99) / percentile(e.all(), 99)
				f := percentile(r.afterCommit(), 99) / percentile(e.afterCommit(), 99)
				worst, worstFan = max(worst, p), max(worstFan, f)
				mark := ""
				if r.disk.calm() && e.disk.calm() {
					worstCalm, calm = max(worstCalm, p), calm+1
				} else {
					mark = "*"
				}
				p99s, fans = append(p99s, fmt.Sprintf("%.2f%s", p, mark)), append(fans, fmt.Sprintf("%.2f", f))
				if r.memberCPU > 0 && e.memberCPU > 0 && pair[0] != sharedSDK {
					cpus = append(cpus, fmt.Sprintf("%.2f", (r.memberCPU+r.clientCPU)/(e.memberCPU+e.clientCPU)))
				}
				if r.setup > 0 && e.setup > 0 {
					s := r.setup.Seconds() / e.setup.Seconds()
					worstSetup = max(worstSetup, s)
					setups = append(setups, fmt.Sprintf("%.2f", s))
				}
			}
			target := "target <= 1.0 every round"
			if k >= 10000 || members == 1 {
				target = "target <= 0.5"
			}
			if pair[0] == sharedSDK {
				target = "no target: both fan-outs run at once on the same CPUs"
			}
			line := fmt.Sprintf("  K=%d, %s: delivery p99 by round %s (* the disk stalled), worst %.2f, worst of %d calm rounds %.2f (%s); after the commit %s, worst %.2f",
				k, pair[0], strings.Join(p99s, " "), worst, calm, worstCalm, target, strings.Join(fans, " "), worstFan)
			if len(setups) > 0 {
				line += fmt.Sprintf("; set-up by round %s, worst %.2f (target <= 1.0)", strings.Join(setups, " "), worstSetup)
			}
			if len(cpus) > 0 {
				line += fmt.Sprintf("; CPU per publish, members and clients, by round %s", strings.Join(cpus, " "))
			}
			fmt.Println(line)
		}
	}
}

// sharedFanout is the SDK's spread subscribers and raw etcd watches of the
// etcd key its publishes write (key k of the namespace), open at once.
// Subscribers 0..k-1 are the SDK's; k..2k-1 the raw watches, reported on
// member rawGroup+m.
type sharedFanout struct {
	sdk *sdkClusterFanout
	raw *etcdClusterFanout
	k   int
}

func newSharedFanout(ctx context.Context, grpcs, etcds []string, ns string, clients, k int) (*sharedFanout, error) {
	sdk, err := newSDKClusterFanout(ctx, grpcs, ns, clients, false)
	if err != nil {
		return nil, err
	}
	// The key the config store writes for key "k" of ns (configcenter's
	// layout under coordd's default key root).
	raw, err := newEtcdClusterFanout(etcds, "/coordd/config/ns/"+names.Escape(ns)+"/k/k", clients)
	if err != nil {
		sdk.close()
		return nil, err
	}
	return &sharedFanout{sdk: sdk, raw: raw, k: k}, nil
}

func (f *sharedFanout) subscribeAll(ctx context.Context, k2 int, seen func(i int, value string)) error {
	if err := f.sdk.subscribeAll(ctx, k2/2, seen); err != nil {
		return err
	}
	return f.raw.subscribeAll(ctx, k2/2, func(i int, v string) { seen(f.k+i, v) })
}

func (f *sharedFanout) memberOf(i int) int {
	if i < f.k {
		return f.sdk.memberOf(i)
	}
	return rawGroup + f.raw.memberOf(i-f.k)
}

func (f *sharedFanout) publish(ctx context.Context, value string) error {
	return f.sdk.publish(ctx, value)
}

func (f *sharedFanout) close() {
	f.sdk.close()
	f.raw.close()
}

// diskOps counts the members' etcd disk operations that took over 32 ms:
// WAL fsyncs and backend commits. A publish call that stalls with them is
// the disk's doing, not the peer's. It also counts those over 16 ms, which
// a round's slowest publish shows too (a publish takes 4 ms at the
// median): a put of 28.7 ms came in a round with three fsyncs of 16 to
// 32 ms. They are shown, not used to call a round calm: under the load
// of 10,000 subscribers most rounds have one.
type diskOps struct {
	fsyncs, commits     float64 // over 32 ms
	fsyncs16, commits16 float64 // over 16 ms
	unknown             bool    // a member's /metrics could not be read
}

func (d diskOps) minus(o diskOps) diskOps {
	return diskOps{d.fsyncs - o.fsyncs, d.commits - o.commits, d.fsyncs16 - o.fsyncs16, d.commits16 - o.commits16, d.unknown || o.unknown}
}

// calm says no slow disk operation was seen (and the count is known).
func (d diskOps) calm() bool { return !d.unknown && d.fsyncs == 0 && d.commits == 0 }

func (d diskOps) String() string {
	if d.unknown {
		return "?"
	}
	return fmt.Sprintf("fsync %.0f (%.0f), commit %.0f (%.0f)", d.fsyncs, d.fsyncs16, d.commits, d.commits16)
}

// slowDiskOps sums diskOps over the members at httpAddrs.
func slowDiskOps(httpAddrs []string) diskOps {
	var d diskOps
	for _, a := range httpAddrs {
		vals, err := metricValues(a, "etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds")
		if err != nil {
			return diskOps{unknown: true}
		}
		d.fsyncs += vals[0][1]
		d.commits += vals[1][1]
		d.fsyncs16 += vals[0][0]
		d.commits16 += vals[1][0]
	}
	return d
}

// metricValues reads, for each histogram named, how many of its
// observations were over 16 ms and over 32 ms, from one read of the
// member's /metrics.
func metricValues(httpAddr string, histograms ...string) ([][2]float64, error) {
	line, err := scrapeMetrics(httpAddr)
	if err != nil {
		return nil, err
	}
	out := make([][2]float64, len(histograms))
	for i, h := range histograms {
		count, ok := line[h+"_count"]
		if !ok {
			return nil, fmt.Errorf("%s: no %s histogram", httpAddr, h)
		}
		for j, le := range []string{"0.016", "0.032"} {
			fast, ok := line[h+`_bucket{le="`+le+`"}`]
			if !ok {
				return nil, fmt.Errorf("%s: no %s bucket %s", httpAddr, h, le)
			}
			out[i][j] = count - fast
		}
	}
	return out, nil
}

// scrapeMetrics reads the daemon's /metrics: each sample's value by its
// name and labels, as the exposition format writes them.
func scrapeMetrics(httpAddr string) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	line := map[string]float64{}
	for l := range strings.SplitSeq(string(body), "\n") {
		if name, v, ok := strings.Cut(l, " "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				line[name] = f
			}
		}
	}
	return line, nil
}

// profileFanout starts CPU profiles of member m0 (at httpAddr) and of the
// clients (this process) over a fan-out run; the returned func ends the
// clients' and waits for m0's. The run's set-up comes first: the profiles
// last long enough for the set-up and the publishes.
func profileFanout(httpAddr string, k int, file string) (func() error, error) {
	d := time.Duration(publishes(true))*60*time.Millisecond + time.Duration(k)*100*time.Microsecond + time.Second
	server := make(chan error, 2)
	go func() { server <- cpuProfile(httpAddr, d, file) }()
	go func() {
		secs := max(1, int(d.Seconds()))
		server <- saveURL(fmt.Sprintf("http://%s/debug/pprof/allocs?seconds=%d", httpAddr, secs), file+".allocs")
	}()
	clients, err := os.Create(file + ".clients")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(clients); err != nil {
		_ = clients.Close() // not written to; the profile's error is the one to report
		return nil, err
	}
	// The clients' allocations: the allocs profile counts from the
	// process's start, so the run's are the difference of two.
	if err := writeAllocs(file + ".clients.allocs.base"); err != nil {
		pprof.StopCPUProfile()
		_ = clients.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		err := errors.Join(clients.Close(), writeAllocs(file+".clients.allocs"))
		for range 2 {
			err = errors.Join(err, <-server)
		}
		if err != nil {
			return err
		}
		fmt.Printf("(profiles of m0 during the first spread run at K=%d: CPU %s, allocations %[2]s.allocs; of the clients: CPU %[2]s.clients, allocations go tool pprof -base %[2]s.clients.allocs.base %[2]s.clients.allocs)\n", k, file)
		return nil
	}, nil
}

// writeAllocs writes this process's allocation profile (since its start)
// to file.
func writeAllocs(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}
