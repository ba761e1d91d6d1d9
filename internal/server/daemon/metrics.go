package daemon

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/base/groupcommit"
	"github.com/coordd/coordd/internal/cluster"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
)

// stateReadTimeout bounds the etcd reads of one scrape.
const stateReadTimeout = 2 * time.Second

// stateCollector reads coordd's state when /metrics is scraped: the
// cluster-wide counts (sessions, locks, elections) from this member's etcd
// (serializable reads: every member reports the same values, give or take
// a moment; aggregate with max, not sum), and this member's own watch
// cache, database and alarms. A read that fails leaves its metrics out of
// that scrape and counts in coordd_state_read_failures_total.
type stateCollector struct {
	stateSources
	failures prometheus.Counter

	mu        sync.Mutex
	compacted int64 // the last compaction revision found
}

// stateSources are where a stateCollector reads.
type stateSources struct {
	sessions  *session.Manager
	locks     *lock.Manager
	elections *election.Manager
	cache     *configcenter.Cache
	cluster   *cluster.Manager
	quota     int64 // the embedded member's; 0 with an external etcd
	alarms    func() []cluster.Alarm
	learner   func() bool // nil with an external etcd
	canCommit func() bool // nil with an external etcd
	diskSlow  func() bool // nil with an external etcd or the slow-disk watch off
	commits   *groupcommit.Committer
	lg        *zap.Logger
}

var (
	descSessions       = prometheus.NewDesc("coordd_sessions", "Live sessions, cluster-wide.", nil, nil)
	descLocksHeld      = prometheus.NewDesc("coordd_locks_held", "Locks with at least one holder, cluster-wide.", nil, nil)
	descLockHolders    = prometheus.NewDesc("coordd_lock_holders", "Lock grants held (a semaphore may have several holders), cluster-wide.", nil, nil)
	descLockWaiters    = prometheus.NewDesc("coordd_lock_waiters", "Acquire calls waiting in lock queues, cluster-wide.", nil, nil)
	descElections      = prometheus.NewDesc("coordd_elections_with_leader", "Elections that have a leader, cluster-wide.", nil, nil)
	descCandidates     = prometheus.NewDesc("coordd_election_candidates_waiting", "Campaigns waiting behind a leader, cluster-wide.", nil, nil)
	descNamespaces     = prometheus.NewDesc("coordd_config_namespaces", "Config namespaces with a release (as config:namespaces lists them), in this member's watch cache.", nil, nil)
	descWatchers       = prometheus.NewDesc("coordd_config_watchers", "Config subscriptions (Watch, WatchMany, Poll waits) served by this member's watch cache.", nil, nil)
	descCacheLagRevs   = prometheus.NewDesc("coordd_config_watch_cache_lag_revisions", "etcd revisions this member's config watch cache is behind its etcd (it advances on config changes and on watch progress, about every second, so a few hundred under write load is normal).", nil, nil)
	descCacheLagSecs   = prometheus.NewDesc("coordd_config_watch_cache_lag_seconds", "Seconds since this member's config watch cache last advanced while behind its etcd (0 when current).", nil, nil)
	descCacheLive      = prometheus.NewDesc("coordd_config_watch_cache_live", "1 while this member's config watch cache follows etcd, 0 while its watch is being re-established.", nil, nil)
	descRevision       = prometheus.NewDesc("coordd_etcd_revision", "etcd's current revision, as this member sees it.", nil, nil)
	descCompacted      = prometheus.NewDesc("coordd_etcd_compact_revision", "etcd's compaction revision (the oldest revision still readable; 0 before any compaction), as this member sees it.", nil, nil)
	descDBSize         = prometheus.NewDesc("coordd_etcd_db_size_bytes", "Size of this member's etcd database file.", nil, nil)
	descDBInUse        = prometheus.NewDesc("coordd_etcd_db_size_in_use_bytes", "Bytes in use in this member's etcd database file (the rest is free after compaction; defragmentation gives it back).", nil, nil)
	descQuota          = prometheus.NewDesc("coordd_etcd_quota_backend_bytes", "This member's database quota (--quota-backend-bytes); absent with an external etcd.", nil, nil)
	descAlarm          = prometheus.NewDesc("coordd_etcd_alarm", "1 while etcd has an alarm of this type raised (NOSPACE: the database reached its quota; CORRUPT: a member's data differs), else 0.", []string{"type"}, nil)
	descMemberLearner  = prometheus.NewDesc("coordd_etcd_is_learner", "1 while this member is a learner (added, not yet promoted), else 0; absent with an external etcd.", nil, nil)
	descDiskSlow       = prometheus.NewDesc("coordd_etcd_disk_slow", "1 while this member's disk is slow: etcd's WAL fsync or backend commit took longer than --slow-disk-threshold on average for --slow-disk-window (a leader here hands leadership over), else 0; absent with an external etcd or the watch off.", nil, nil)
	descCanCommit      = prometheus.NewDesc("coordd_etcd_can_commit", "1 while this member can commit (its etcd member has a leader and confirmed a linearizable read through it within half an election timeout), else 0: without it the member answers NOT_SERVING and ends its waiting calls; absent with an external etcd.", nil, nil)
	descBatches        = prometheus.NewDesc("coordd_group_commit_batches_total", "etcd transactions this member committed for lock and election changes (each carries one or more of them; see coordd_group_commit_changes_total).", nil, nil)
	descBatched        = prometheus.NewDesc("coordd_group_commit_changes_total", "Lock and election changes this member committed; divided by coordd_group_commit_batches_total, the mean batch size.", nil, nil)
	stateDescriptions  = []*prometheus.Desc{descBatches, descBatched, descSessions, descLocksHeld, descLockHolders, descLockWaiters, descElections, descCandidates, descNamespaces, descWatchers, descCacheLagRevs, descCacheLagSecs, descCacheLive, descRevision, descCompacted, descDBSize, descDBInUse, descQuota, descAlarm, descMemberLearner, descCanCommit, descDiskSlow}
	alarmTypesExported = []cluster.AlarmType{cluster.AlarmNoSpace, cluster.AlarmCorrupt}
)

func newStateCollector(src stateSources) *stateCollector {
	return &stateCollector{stateSources: src, failures: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordd_state_read_failures_total",
		Help: "Reads of coordd's state in etcd for /metrics that failed or timed out (their metrics were left out of that scrape).",
	})}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescriptions {
		ch <- d
	}
	c.failures.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), stateReadTimeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	failed := func(what string, err error) {
		c.failures.Inc()
		c.lg.Debug("metrics: state not read", zap.String("what", what), zap.Error(err))
	}

	if n, err := c.sessions.Count(ctx); err != nil {
		failed("sessions", err)
	} else {
		gauge(descSessions, float64(n))
	}
	if lc, err := c.locks.Count(ctx); err != nil {
		failed("locks", err)
	} else {
		gauge(descLocksHeld, float64(lc.Locks))
		gauge(descLockHolders, float64(lc.Holders))
		gauge(descLockWaiters, float64(lc.Waiters))
	}
	if ec, err := c.elections.Count(ctx); err != nil {
		failed("elections", err)
	} else {
		gauge(descElections, float64(ec.WithLeader))
		gauge(descCandidates, float64(ec.Waiting))
	}

	c.mu.Lock()
	known := c.compacted
	c.mu.Unlock()
	cur, compacted, err := c.cluster.Revisions(ctx, known)
	if err != nil {
		failed("revisions", err)
	} else {
		c.mu.Lock()
		c.compacted = max(c.compacted, compacted)
		c.mu.Unlock()
		gauge(descRevision, float64(cur))
		gauge(descCompacted, float64(compacted))
	}

	cs := c.cache.Stats()
	gauge(descNamespaces, float64(cs.Namespaces))
	gauge(descWatchers, float64(cs.Subscribers))
	gauge(descCacheLive, boolFloat(cs.Live))
	if err == nil {
		behind := max(cur-cs.Revision, 0)
		gauge(descCacheLagRevs, float64(behind))
		secs := 0.0
		if behind > 0 && !cs.AdvancedAt.IsZero() {
			secs = time.Since(cs.AdvancedAt).Seconds()
		}
		gauge(descCacheLagSecs, secs)
	}

	if h, err := c.cluster.Local(ctx); err != nil {
		failed("database size", err)
	} else {
		gauge(descDBSize, float64(h.DBSize))
		gauge(descDBInUse, float64(h.DBSizeInUse))
	}
	if c.quota > 0 {
		gauge(descQuota, float64(c.quota))
	}
	alarms := c.alarms()
	for _, t := range alarmTypesExported {
		gauge(descAlarm, boolFloat(slices.ContainsFunc(alarms, func(a cluster.Alarm) bool { return a.Type == t })), string(t))
	}
	c.collectMember(gauge)
	batches, changes := c.commits.Stats()
	ch <- prometheus.MustNewConstMetric(descBatches, prometheus.CounterValue, float64(batches))
	ch <- prometheus.MustNewConstMetric(descBatched, prometheus.CounterValue, float64(changes))
	c.failures.Collect(ch)
}

// collectMember reports the embedded member's own state (nothing with an
// external etcd).
func (c *stateCollector) collectMember(gauge func(d *prometheus.Desc, v float64, labels ...string)) {
	if c.diskSlow != nil {
		gauge(descDiskSlow, boolFloat(c.diskSlow()))
	}
	if c.canCommit != nil {
		gauge(descCanCommit, boolFloat(c.canCommit()))
	}
	if c.learner != nil {
		gauge(descMemberLearner, boolFloat(c.learner()))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// b2f is 1 for true, 0 for false: a boolean gauge.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
