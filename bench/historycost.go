package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

var (
	historyRounds     = flag.Int("history-rounds", 8, "rounds of -only history-cost (each runs both daemons, in alternating order)")
	historyPairRounds = flag.Int("history-pair-rounds", 4, "rounds of -only history-cost that one pair of daemons runs: a fresh pair (new processes, new data directories) starts every so many rounds, so that what one process happens to be (its memory's layout, its files') weighs on a few rounds, not on the run")
	historyOtherBin   = flag.String("history-other-bin", "", "with -only history-cost: run this build against the coordd binary at this path instead (both recording, both with -history-flags), in the same turns: an A/B of two builds")
	historyFlags      = flag.String("history-flags", "", "extra coordd flags for -only history-cost's recording daemon (e.g. \"--history-max-records 1000000\")")
	historyProfile    = flag.String("history-profile", "", "write CPU profiles of the recording daemon during -only history-cost's 64-client runs to this file.N (N the round) and its lone client's to this file.one.N, and of the other daemon to this file.off.N and file.off.one.N (go tool pprof takes them all at once)")
)

// benchHistoryCost measures what recording the grant history costs the
// grant path: two daemons, one recording (the default) and one started
// with --no-history, take turns running the same workload (one client
// cycling one lock for a second, the grant path when the CPUs are not the
// bound; then 64 SDK clients on 64 locks, -lock-duration), in the order
// AB BA AB ... so that a drift of the machine's speed over the run weighs
// on both alike, and with a fresh pair of daemons every
// -history-pair-rounds rounds, so that what one process happens to be
// weighs on a few rounds only (single pairs gave medians from 0.91 to 1.04
// for the same build). Only one daemon works at a time; the other idles. It
// prints each round, the medians of the rounds' ratios (throughput and
// server CPU per acquisition, recording / not), and the one client's
// cycle percentiles (p10 to p99) over every turn.
func benchHistoryCost(bin, tmp string) error {
	type side struct {
		name      string
		d         *daemon
		acq, srv  []float64
		cycles    []float64  // one client's acquire+release, every turn's
		disk      [4]float64 // over the lone client's turns: WAL fsyncs (count, seconds), backend commits (count, seconds)
		disk64    [4]float64 // the same over the 64 clients' turns
		acquired  float64    // by the 64 clients, over all turns
		profileTo string
	}
	sides := []*side{{name: "history on"}, {name: "--no-history"}}
	against := "one started with --no-history"
	if *historyOtherBin != "" {
		sides[0].name, sides[1].name = "this build", "other build"
		against = "the build " + *historyOtherBin + ", both recording"
	}
	// start starts a fresh pair of daemons (new data directories) for the
	// rounds from round on, and stops the last pair.
	start := func(round int) error {
		for i, s := range sides {
			if s.d != nil {
				s.d.stop()
				s.d = nil
			}
			b, args := bin, strings.Fields(*historyFlags)
			if i == 1 && *historyOtherBin != "" {
				b = *historyOtherBin
			} else if i == 1 {
				args = []string{"--no-history"}
			}
			d, err := startDaemon(b, filepath.Join(tmp, fmt.Sprintf("history-%d-%d", i, round)), args...)
			if err != nil {
				return err
			}
			s.d = d
		}
		return nil
	}
	defer func() {
		for _, s := range sides {
			if s.d != nil {
				s.d.stop()
			}
		}
	}()
	if *historyProfile != "" {
		sides[0].profileTo, sides[1].profileTo = *historyProfile, *historyProfile+".off"
	}
	fmt.Printf("history cost: one client cycling one lock for 1s, then 64 SDK clients on 64 locks for %s, a turn; %d rounds; a daemon recording the grant history against %s, in turns; a fresh pair of daemons every %d rounds\n", *lockD, *historyRounds, against, *historyPairRounds)
	fmt.Printf("%-6s %-14s %12s %16s %8s %12s\n", "round", "daemon", "acquired/s", "server CPU/acq", "steal", "cycle p50")
	for round := range *historyRounds {
		if round%max(*historyPairRounds, 1) == 0 {
			if err := start(round); err != nil {
				return err
			}
		}
		order := []*side{sides[0], sides[1]}
		if round%2 == 1 { // ABBA: each round starts with the one the last ended with
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			p := coorddPeer("coordd SDK", s.d.grpcAddr, nil, false)
			// The lone client first: the daemon idled through the other's
			// turn, so its recorder has written what the last turn made.
			before, err := metricSums(s.d.httpAddr, diskHistograms...)
			if err != nil {
				return err
			}
			var oneProf chan error // of the lone client's second
			if s.profileTo != "" {
				oneProf = make(chan error, 1)
				go func() { oneProf <- cpuProfile(s.d.httpAddr, time.Second, fmt.Sprintf("%s.one.%d", s.profileTo, round)) }()
			}
			one, err := runLocks(p, 1, 1, time.Second, fmt.Sprintf("hist-one-%d", round), s.d.cpuSeconds)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if oneProf != nil {
				if err := <-oneProf; err != nil {
					return fmt.Errorf("profile: %w", err)
				}
			}
			after, err := metricSums(s.d.httpAddr, diskHistograms...)
			if err != nil {
				return err
			}
			for i := range s.disk {
				s.disk[i] += after[i] - before[i]
			}
			var prof chan error // of the 64 clients' run
			if s.profileTo != "" {
				prof = make(chan error, 1)
				go func() { prof <- cpuProfile(s.d.httpAddr, *lockD*3/4, fmt.Sprintf("%s.%d", s.profileTo, round)) }()
			}
			if before, err = metricSums(s.d.httpAddr, diskHistograms...); err != nil {
				return err
			}
			r, err := runLocks(p, 64, 64, *lockD, fmt.Sprintf("hist-%d", round), s.d.cpuSeconds)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if after, err = metricSums(s.d.httpAddr, diskHistograms...); err != nil {
				return err
			}
			for i := range s.disk64 {
				s.disk64[i] += after[i] - before[i]
			}
			s.acquired += r.acqPerSec * lockD.Seconds()
			if prof != nil {
				if err := <-prof; err != nil {
					return fmt.Errorf("profile: %w", err)
				}
			}
			s.acq, s.srv = append(s.acq, r.acqPerSec), append(s.srv, r.serverUs)
			s.cycles = append(s.cycles, one.cycleUs...)
			fmt.Printf("%-6d %-14s %12.0f %14.0fus %7.0f%% %10.0fus\n", round, s.name, r.acqPerSec, r.serverUs, r.steal, percentile(one.cycleUs, 50))
		}
	}
	// Each round's ratio compares two turns run back to back; their median
	// is the figure least swayed by a slow stretch of the machine.
	var acqRatio, cpuRatio []float64
	for i := range sides[0].acq {
		acqRatio = append(acqRatio, sides[0].acq[i]/sides[1].acq[i])
		cpuRatio = append(cpuRatio, sides[0].srv[i]/sides[1].srv[i])
	}
	fmt.Printf("medians: %s %.0f/s %.0fus; %s %.0f/s %.0fus\n",
		sides[0].name, median(sides[0].acq), median(sides[0].srv), sides[1].name, median(sides[1].acq), median(sides[1].srv))
	ab := sides[0].name + " / " + sides[1].name
	fmt.Printf("history cost: throughput %s, median of rounds %.3f (rounds %s); server CPU per acquisition %s %.3f (rounds %s)\n",
		ab, median(acqRatio), fmtRatios(acqRatio), ab, median(cpuRatio), fmtRatios(cpuRatio))
	// The grant path itself: one client's cycle, not CPU-bound. A shift
	// of every percentile alike is a cost per operation; of the high ones
	// alone, stalls.
	fmt.Printf("history cost: one client's acquire+release, every turn's cycles (%d and %d), %s:", len(sides[0].cycles), len(sides[1].cycles), ab)
	for _, q := range []float64{10, 50, 90, 99} {
		on, off := percentile(sides[0].cycles, q), percentile(sides[1].cycles, q)
		fmt.Printf(" p%.0f %.0fus / %.0fus = %.3f;", q, on, off, on/off)
	}
	fmt.Println()
	// What the disk did meanwhile: the history's writes share etcd's WAL
	// and backend with the grant path.
	for _, s := range sides {
		fmt.Printf("history cost: %s, over the lone client's turns: %.2f WAL fsyncs per cycle, %.0fus each; %.2f backend commits per cycle, %.0fus each\n",
			s.name, s.disk[0]/float64(len(s.cycles)), s.disk[1]/max(s.disk[0], 1)*1e6, s.disk[2]/float64(len(s.cycles)), s.disk[3]/max(s.disk[2], 1)*1e6)
		fmt.Printf("history cost: %s, over the 64 clients' turns: %.3f WAL fsyncs per acquisition, %.0fus each; %.1f backend commits per second of turn, %.0fus each\n",
			s.name, s.disk64[0]/max(s.acquired, 1), s.disk64[1]/max(s.disk64[0], 1)*1e6, s.disk64[2]/(float64(*historyRounds)*lockD.Seconds()), s.disk64[3]/max(s.disk64[2], 1)*1e6)
	}
	return nil
}

// diskHistograms are etcd's histograms of the WAL's fsyncs and the
// backend's commits.
var diskHistograms = []string{"etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds"}

// metricSums reads the count and the sum of each histogram from the
// daemon's /metrics: count, sum, count, sum, ...
func metricSums(httpAddr string, histograms ...string) ([]float64, error) {
	line, err := scrapeMetrics(httpAddr)
	if err != nil {
		return nil, err
	}
	var out []float64
	for _, h := range histograms {
		count, ok1 := line[h+"_count"]
		sum, ok2 := line[h+"_sum"]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s: no %s histogram", httpAddr, h)
		}
		out = append(out, count, sum)
	}
	return out, nil
}

func fmtRatios(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(out, " ")
}
