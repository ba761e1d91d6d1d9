package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

type result struct{ coorddP50, coorddP99, etcdP50, etcdP99 []float64 }

// compare runs both peers for rounds, alternating which goes first, and
// returns per-round p50/p99 in microseconds.
func compare(coordd, etcd func() error) (result, error) {
	var r result
	for round := range *rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, peer := range order {
			fn := coordd
			if peer == 1 {
				fn = etcd
			}
			lat, err := measure(fn)
			if err != nil {
				return r, err
			}
			p50, p99 := percentile(lat, 50), percentile(lat, 99)
			if peer == 0 {
				r.coorddP50, r.coorddP99 = append(r.coorddP50, p50), append(r.coorddP99, p99)
			} else {
				r.etcdP50, r.etcdP99 = append(r.etcdP50, p50), append(r.etcdP99, p99)
			}
		}
	}
	return r, nil
}

func measure(fn func() error) ([]float64, error) {
	for range 20 { // warm up
		if err := fn(); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	lat := make([]float64, 0, *ops)
	for range *ops {
		t0 := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds()))
	}
	return lat, nil
}

func printRow(name string, r result) {
	c50, c99, e50, e99 := median(r.coorddP50), median(r.coorddP99), median(r.etcdP50), median(r.etcdP99)
	fmt.Printf("%-48s %8.0fus %8.0fus %8.0fus %8.0fus %8.2f %8.2f\n", name, c50, c99, e50, e99, c50/e50, c99/e99)
}

// percentile is NaN for no samples (a workload that was not run).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

func median(xs []float64) float64 { return percentile(xs, 50) }

// rawPuts times n raw etcd puts one after another, in microseconds.
func rawPuts(ctx context.Context, raw *clientv3.Client, n int) ([]float64, error) {
	lat := make([]float64, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := raw.Put(ctx, "/bench/raw-put", "x"); err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds()))
	}
	return lat, nil
}

// cpuMark is a moment's CPU counters: the servers' and this process's CPU
// time, and the machine's busy, stolen and total CPU time, in seconds.
// Steal is time the hypervisor gave the machine's virtual CPUs to other
// guests: neither busy here nor idle, and every process waited through it.
type cpuMark struct{ server, self, busy, steal, total float64 }

// selfCPUSeconds is this process's CPU time so far, user and system (0
// where it cannot be read).
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// takeCPU reads the counters now (the machine's from /proc/stat; zero
// where it cannot be read).
func takeCPU(serverCPU func() float64) cpuMark {
	m := cpuMark{server: serverCPU(), self: selfCPUSeconds()}
	if raw, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(raw), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i := 1; i < len(f) && i <= 8; i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			m.total += v / 100
			switch i {
			case 4, 5: // idle, iowait
			case 8:
				m.steal += v / 100
			default:
				m.busy += v / 100
			}
		}
	}
	return m
}

// stealPct is the share of the machine's CPU time stolen since from, in
// percent.
func (m cpuMark) stealPct(from cpuMark) float64 {
	if dt := m.total - from.total; dt > 0 {
		return (m.steal - from.steal) / dt * 100
	}
	return 0
}

// since returns, for the n operations done since `from`, the servers' and
// this process's CPU per operation in microseconds, and how busy the
// machine was in percent.
func (m cpuMark) since(from cpuMark, n float64) (serverUs, selfUs, busyPct float64) {
	if n > 0 {
		serverUs, selfUs = (m.server-from.server)/n*1e6, (m.self-from.self)/n*1e6
	}
	if dt := m.total - from.total; dt > 0 {
		busyPct = (m.busy - from.busy) / dt * 100
	}
	return serverUs, selfUs, busyPct
}
