package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// diskWatch hands etcd's leadership over when the member leads on a slow
// disk. etcd keeps a leader whose disk crawls: every write waits for the
// leader's own WAL fsync, and its heartbeats wait behind it, so the whole
// cluster stalls without electing anyone else (etcd's FAQ: "disk latency is
// part of leader liveness"). The watch reads the member's own fsync and
// commit times (etcd's histograms etcd_disk_wal_fsync_duration_seconds and
// etcd_disk_backend_commit_duration_seconds, on the default registry) every
// tick. Each histogram keeps a verdict: slow when the mean of what finished
// during a tick is above threshold, kept through ticks in which none
// finished (an fsync still under way). A tick is slow when either verdict
// is. After window of slow ticks the disk is slow:
// the member logs an error, reports coordd_etcd_disk_slow 1, and, while it
// leads a cluster of several voters, moves the leadership to another voting
// member: the healthiest that takes it (a fresh health report without a
// slow disk, the most caught up). It moves it again if it is elected
// while its disk stays slow. A tick whose mean is at or under threshold
// makes its histogram's verdict healthy again.
//
// Non-guarantees: the histograms are the process's, so two members in one
// process (tests) read each other's disks too; a disk that is slow on every
// member moves the leadership around for nothing (each hand-over costs one
// leader change, no election timeout).
type diskWatch struct {
	etcd              *embed.Etcd
	gather            prometheus.Gatherer
	threshold, window time.Duration
	lg                *zap.Logger
	handedOver        prometheus.Counter
	// order, if set, orders the other voters for a hand-over, healthiest
	// first (cluster.Manager.HandOverOrder).
	order func(ctx context.Context, ids []uint64) []uint64

	slow atomic.Bool // the disk is slow (see above)
}

// diskSample is the two histograms' sums and counts at one moment.
type diskSample struct {
	sum   float64 // seconds
	count uint64
}

var diskHistograms = []string{"etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds"}

// read returns the histograms' current sums and counts (zero when absent).
func (w *diskWatch) read() (map[string]diskSample, error) {
	fams, err := w.gather.Gather()
	if err != nil {
		return nil, err
	}
	out := make(map[string]diskSample, len(diskHistograms))
	for _, f := range fams {
		for _, name := range diskHistograms {
			if f.GetName() != name || len(f.GetMetric()) == 0 {
				continue
			}
			h := f.GetMetric()[0].GetHistogram()
			out[name] = diskSample{sum: h.GetSampleSum(), count: h.GetSampleCount()}
		}
	}
	return out, nil
}

// diskState follows the ticks: how long the disk has been slow.
type diskState struct {
	slowFor time.Duration // 0: no histogram was slow at the last tick
	// lastSlow is each histogram's verdict at the last tick in which one
	// of its operations finished (carried over ticks with none).
	lastSlow [2]bool
}

// tick records one tick of length d with the histograms' change since the
// last one, and reports whether the disk is slow (slow for window). Each
// histogram is judged on its own: backend commits finishing fast do not
// make a WAL fsync still under way fast.
func (s *diskState) tick(d, threshold, window time.Duration, before, now map[string]diskSample) bool {
	slow := false
	for i, name := range diskHistograms {
		if now[name].count > before[name].count {
			n := float64(now[name].count - before[name].count)
			s.lastSlow[i] = (now[name].sum-before[name].sum)/n > threshold.Seconds()
		}
		slow = slow || s.lastSlow[i]
	}
	if slow {
		s.slowFor += d
	} else {
		s.slowFor = 0
	}
	return s.slowFor >= window
}

// etcdDiskGatherer gathers etcd's two disk histograms alone: registering
// look-alikes on the default registry answers with the collectors etcd
// registered there. (Gathering the whole default registry costs about
// 3 ms, a second of CPU every 40 s at eight ticks a second.) When
// they are not found (another etcd version), the default registry is
// gathered instead.
func etcdDiskGatherer() prometheus.Gatherer {
	reg := prometheus.NewRegistry()
	for _, o := range []prometheus.HistogramOpts{
		{Namespace: "etcd", Subsystem: "disk", Name: "wal_fsync_duration_seconds", Help: "The latency distributions of fsync called by WAL."},
		{Namespace: "etcd", Subsystem: "disk", Name: "backend_commit_duration_seconds", Help: "The latency distributions of commit called by backend."},
	} {
		o.Buckets = prometheus.ExponentialBuckets(0.001, 2, 14)
		h := prometheus.NewHistogram(o)
		var found prometheus.AlreadyRegisteredError
		switch err := prometheus.DefaultRegisterer.Register(h); {
		case errors.As(err, &found):
			if reg.Register(found.ExistingCollector) == nil {
				continue
			}
		case err == nil:
			prometheus.DefaultRegisterer.Unregister(h)
		}
		return prometheus.DefaultGatherer
	}
	return reg
}

// run watches until ctx ends.
func (w *diskWatch) run(ctx context.Context) {
	every := min(w.window/8, 250*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var st diskState
	before, err := w.read()
	if err != nil {
		w.lg.Warn("slow-disk watch: etcd's disk metrics unreadable; the watch is off", zap.Error(err))
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, err := w.read()
		if err != nil {
			continue
		}
		slow := st.tick(every, w.threshold, w.window, before, now)
		before = now
		if slow != w.slow.Swap(slow) {
			if slow {
				w.lg.Error("this member's disk is slow: etcd's WAL fsync or backend commit took longer than --slow-disk-threshold for --slow-disk-window; a leader here stalls the cluster, so it hands leadership over while this lasts",
					zap.Duration("threshold", w.threshold), zap.Duration("window", w.window))
			} else {
				w.lg.Info("this member's disk is fast again")
			}
		}
		if slow {
			w.handOver(ctx)
		}
	}
}

// handOver moves etcd's leadership to another voting member when this one
// leads, trying them healthiest first. Each try gets an election timeout
// and a half: raft gives a transfer up after an election timeout, and a
// transfer may complete after the call gave up on it, which counts too.
func (w *diskWatch) handOver(ctx context.Context) {
	s := w.etcd.Server
	self := s.MemberID()
	if s.Leader() != self {
		return
	}
	others := otherVoters(s)
	if len(others) == 0 {
		return
	}
	if w.order != nil {
		others = w.order(ctx, others)
	}
	per := time.Duration(w.etcd.Config().ElectionMs) * time.Millisecond * 3 / 2
	for _, id := range others {
		mctx, cancel := context.WithTimeout(ctx, per)
		err := s.MoveLeader(mctx, uint64(self), id)
		cancel()
		if lead := s.Leader(); err == nil || lead != self && lead != 0 {
			w.handedOver.Inc()
			w.lg.Warn("handed etcd's leadership over: this member's disk is slow", zap.String("to", types.ID(lead).String()))
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
	w.lg.Warn("could not hand etcd's leadership over; trying again at the next tick")
}
