package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/coordd/coordd/clientlib"
)

var (
	revokeRounds   = flag.Int("revoke-rounds", 4, "rounds of -only revoke (each runs every daemon in turn, in rotating order)")
	revokeOps      = flag.Int("revoke-ops", 300, "hand-overs per path, daemon and round of -only revoke")
	revokeOtherBin = flag.String("revoke-other-bin", "", "with -only revoke: also run the coordd binary at this path (an earlier build, for the figures of before the hand-shake)")
)

// benchRevoke measures what asking the old holder first costs a hand-over
// from outside: a live SDK holder, a waiting SDK client and an operator on
// clients of their own; the operator releases the holder's token (or
// resigns the leader's term) and the waiter's call returns. Daemons: this
// build (the hand-shake), this build with --unsafe-no-revocation (the next
// holder granted in the commit that ends the old one, as before), and
// optionally an earlier build (-revoke-other-bin). It prints, per daemon
// and path, the hand-over latency (from the operator's call to the next
// holder's return) p50/p90/p99, the overlaps (the old holder's context
// still live when the next one's call returned), and the holder's own
// release hand-off (release to the waiter's return), with ratios to the
// daemon without the hand-shake.
func benchRevoke(bin, tmp string) error {
	type side struct {
		name string
		bin  string
		args []string
		d    *daemon
		// by path: latencies (ms) over every round; overlaps
		lat      map[string][]float64
		overlaps map[string]int
	}
	sides := []*side{
		{name: "coordd (asks first)", bin: bin},
		{name: "coordd --unsafe-no-revocation", bin: bin, args: []string{"--unsafe-no-revocation"}},
	}
	if *revokeOtherBin != "" {
		sides = append(sides, &side{name: "earlier build", bin: *revokeOtherBin})
	}
	paths := []string{"outside release", "outside resign", "own release"}
	for i, s := range sides {
		d, err := startDaemon(s.bin, filepath.Join(tmp, fmt.Sprintf("revoke-%d", i)), s.args...)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		defer d.stop()
		s.d, s.lat, s.overlaps = d, map[string][]float64{}, map[string]int{}
	}
	for round := range *revokeRounds {
		for k := range sides {
			s := sides[(k+round)%len(sides)]
			for _, p := range paths {
				lat, overlaps, err := handOvers(s.d.grpcAddr, p, *revokeOps)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", s.name, p, err)
				}
				s.lat[p] = append(s.lat[p], lat...)
				s.overlaps[p] += overlaps
			}
		}
	}
	fmt.Printf("Hand-overs from outside (%d rounds x %d per path; one member, fsync on): latency from the operator's call (or the holder's own release) to the next holder's return\n\n", *revokeRounds, *revokeOps)
	fmt.Printf("%-32s %-16s %8s %8s %8s %10s %10s\n", "daemon", "path", "p50 ms", "p90 ms", "p99 ms", "overlaps", "p50 ratio")
	base := sides[1]
	for _, s := range sides {
		for _, p := range paths {
			l := s.lat[p]
			slices.Sort(l)
			ratio := pct(l, 50) / pct(sorted(base.lat[p]), 50)
			fmt.Printf("%-32s %-16s %8.2f %8.2f %8.2f %6d/%-4d %9.2fx\n", s.name, p, pct(l, 50), pct(l, 90), pct(l, 99), s.overlaps[p], len(l), ratio)
		}
	}
	return nil
}

func sorted(v []float64) []float64 {
	out := slices.Clone(v)
	slices.Sort(out)
	return out
}

// pct is the p-th percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// handOvers runs n hand-overs of path on the daemon at addr and returns
// their latencies (ms) and how many overlapped.
func handOvers(addr, path string, n int) (lat []float64, overlaps int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var clients []*clientlib.Client
	for range 3 {
		c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{addr}})
		if err != nil {
			return nil, 0, err
		}
		defer func() { _ = c.Close() }()
		clients = append(clients, c)
	}
	op := clients[2]
	var ss [2]*clientlib.Session
	for i := range ss {
		if ss[i], err = clients[i].NewSession(ctx, clientlib.WithTTL(30*time.Second)); err != nil {
			return nil, 0, err
		}
		defer func() { _ = ss[i].Close(context.Background()) }()
	}
	name := fmt.Sprintf("bench/revoke/%s/%d", strings.ReplaceAll(path, " ", "-"), time.Now().UnixNano())
	type result struct {
		at    time.Time
		stale bool
		err   error
		lock  *clientlib.Lock
		lead  *clientlib.Leadership
	}
	election := path == "outside resign"
	var lock *clientlib.Lock
	var lead *clientlib.Leadership
	if election {
		lead, err = ss[0].Campaign(ctx, name, "v")
	} else {
		lock, err = ss[0].Lock(ctx, name)
	}
	if err != nil {
		return nil, 0, err
	}
	for i := range n {
		next := ss[(i+1)%2]
		var old interface{ Context() context.Context } = lock
		if election {
			old = lead
		}
		done := make(chan result, 1)
		go func() {
			var r result
			if election {
				r.lead, r.err = next.Campaign(ctx, name, "v")
			} else {
				r.lock, r.err = next.Lock(ctx, name)
			}
			r.at, r.stale = time.Now(), old.Context().Err() == nil
			done <- r
		}()
		// Wait until the next one waits (a read per try).
		for {
			if election {
				cs, err := op.Candidates(ctx, name)
				if err == nil && len(cs) > 0 {
					break
				}
			} else if st, err := op.Admin().DescribeLock(ctx, name); err == nil && len(st.Waiters) > 0 {
				break
			}
		}
		t0 := time.Now()
		switch path {
		case "outside release":
			err = op.Admin().Release(ctx, name, lock.Token())
		case "outside resign":
			err = op.Admin().Resign(ctx, name, lead.Term())
		default:
			err = lock.Release(ctx)
		}
		if err != nil {
			return nil, 0, err
		}
		r := <-done
		if r.err != nil {
			return nil, 0, r.err
		}
		lat = append(lat, float64(r.at.Sub(t0))/float64(time.Millisecond))
		if r.stale && path != "own release" {
			overlaps++
		}
		lock, lead = r.lock, r.lead
	}
	if election {
		return lat, overlaps, lead.Resign(ctx)
	}
	return lat, overlaps, lock.Release(ctx)
}
