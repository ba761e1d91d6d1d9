package api

import (
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/revoke"
)

// Metrics counts what this member's adapters serve. Every metric counts
// calls served by this member: sum over members for the cluster. Labels
// are few and fixed (never a lock, election or namespace name). A nil
// *Metrics records nothing.
//
// The cluster-wide gauges (sessions alive, locks held, ...) are read from
// etcd when /metrics is scraped; see internal/server/daemon.
type Metrics struct {
	sessionsCreated prometheus.Counter
	sessionsClosed  prometheus.Counter
	sessionExpiries prometheus.Counter
	grants          prometheus.Counter
	lockWait        prometheus.Histogram
	delayWaits      prometheus.Counter
	fencedWrites    *prometheus.CounterVec
	leaderChanges   prometheus.Counter
	observers       prometheus.Gauge
	configReleases  *prometheus.CounterVec
	statusReports   prometheus.Counter
	rateLimits      *prometheus.CounterVec
	streamCalls     prometheus.Counter
	quotaRefusals   *prometheus.CounterVec
	revocations     *prometheus.CounterVec
	revocationWait  *prometheus.HistogramVec
}

// Fenced write results, the values of coordd_fenced_writes_total's
// result label.
const (
	fencedAccepted     = "accepted"
	fencedStaleToken   = "stale_token"
	fencedNotHolder    = "not_holder"
	fencedNoSession    = "session_not_found"
	fencedOtherFailure = "error"
)

// NewMetrics creates the adapters' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordd_quota_refused_total",
			Help: "Streams and config subscriptions this member refused because their principal had as many open as it may (--max-streams-per-principal, --max-subscriptions-per-principal), by quota."},
			[]string{"quota"}),
		sessionsCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_sessions_created_total", Help: "Sessions created through this member."}),
		sessionsClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_sessions_closed_total", Help: "Sessions closed by their clients through this member."}),
		sessionExpiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_session_expiries_total",
			Help: "Keep-alives on this member that found their session gone (expired, or closed elsewhere): clients that lost a session they still kept alive."}),
		grants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_lock_grants_total", Help: "Lock and semaphore grants made through this member (Acquire and TryAcquire)."}),
		lockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordd_lock_wait_seconds",
			Help:    "Time from an Acquire call's arrival to its grant, on this member (granted calls only).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		delayWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_lock_delay_waits_total", Help: "Grants on this member that sat out a lock-delay (a holder ended without releasing)."}),
		fencedWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordd_fenced_writes_total",
			Help: "Fenced writes (FencedPut, FencedDelete) on this member by result: accepted, stale_token, not_holder, session_not_found, error."},
			[]string{"result"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_election_leader_changes_total", Help: "Terms begun by campaigns served on this member (each is a new leader of an election)."}),
		observers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "coordd_election_observers", Help: "Observe streams open on this member."}),
		configReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordd_config_releases_total", Help: "Config releases published through this member, by operation: publish, put, delete, rollback, approve, inherit (dry runs not counted; a shared release carried to an heir is not counted)."},
			[]string{"op"}),
		statusReports: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_config_status_reports_total", Help: "Applied-status reports from config subscribers received by this member."}),
		rateLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordd_rate_limited_total", Help: "Calls this member refused for rate, by limit: principal (--rate-limit) or namespace (--publish-rate)."},
			[]string{"limit"}),
		revocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordd_revocations_total",
			Help: "Grants and leaderships ended from outside through this member (a release or resignation that did not name the holder's session), by kind (lock, election) and outcome: acknowledged (the holder let go when asked), bound (it did not within the bound), forced (not asked)."},
			[]string{"kind", "outcome"}),
		revocationWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordd_revocation_wait_seconds",
			Help:    "How long a revocation on this member waited for the holder to let go before the next grant, by kind and outcome (forced ones wait 0).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"kind", "outcome"}),
		streamCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordd_stream_calls_total",
			Help: "Lock and election calls this member took on Calls streams (the Go SDK pipelines them there); the rest came as unary RPCs."}),
	}
	reg.MustRegister(m.streamCalls, m.sessionsCreated, m.sessionsClosed, m.sessionExpiries, m.grants, m.lockWait, m.delayWaits,
		m.fencedWrites, m.leaderChanges, m.observers, m.configReleases, m.statusReports, m.rateLimits, m.quotaRefusals,
		m.revocations, m.revocationWait)
	for _, k := range []string{"lock", "election"} {
		for _, o := range []revoke.Outcome{revoke.Acknowledged, revoke.Bound, revoke.Forced} {
			m.revocations.WithLabelValues(k, string(o))
			m.revocationWait.WithLabelValues(k, string(o))
		}
	}
	for _, q := range []string{"streams", "subscriptions"} {
		m.quotaRefusals.WithLabelValues(q)
	}
	m.rateLimits.WithLabelValues("principal")
	m.rateLimits.WithLabelValues("namespace")
	// Every series exists from the start, so rates and alerts see zeros.
	for _, r := range []string{fencedAccepted, fencedStaleToken, fencedNotHolder, fencedNoSession, fencedOtherFailure} {
		m.fencedWrites.WithLabelValues(r)
	}
	for _, op := range []string{"publish", "put", "delete", "rollback", "approve", "inherit"} {
		m.configReleases.WithLabelValues(op)
	}
	return m
}

func (m *Metrics) streamCall() {
	if m != nil {
		m.streamCalls.Inc()
	}
}

func (m *Metrics) sessionCreated() {
	if m != nil {
		m.sessionsCreated.Inc()
	}
}

func (m *Metrics) sessionClosed() {
	if m != nil {
		m.sessionsClosed.Inc()
	}
}

// keepAlive records a keep-alive's outcome: one that finds its session
// gone is an expiry its client did not expect.
func (m *Metrics) keepAlive(err error) {
	if m != nil && errors.Is(err, errkind.SessionNotFound) {
		m.sessionExpiries.Inc()
	}
}

// granted records a lock grant; waited is the Acquire call's time to it
// (negative for TryAcquire, which does not wait), delay the lock-delay
// it sat out.
func (m *Metrics) granted(waited, delay time.Duration) {
	if m == nil {
		return
	}
	m.grants.Inc()
	if waited >= 0 {
		m.lockWait.Observe(waited.Seconds())
	}
	if delay > 0 {
		m.delayWaits.Inc()
	}
}

func (m *Metrics) fencedWrite(err error) {
	if m == nil {
		return
	}
	r := fencedOtherFailure
	switch {
	case err == nil:
		r = fencedAccepted
	case errors.Is(err, errkind.StaleToken):
		r = fencedStaleToken
	case errors.Is(err, errkind.NotHolder), errors.Is(err, errkind.NotLeader):
		r = fencedNotHolder
	case errors.Is(err, errkind.SessionNotFound):
		r = fencedNoSession
	}
	m.fencedWrites.WithLabelValues(r).Inc()
}

func (m *Metrics) leaderChanged() {
	if m != nil {
		m.leaderChanges.Inc()
	}
}

// observing counts an Observe stream until the returned func is called.
func (m *Metrics) observing() func() {
	if m == nil {
		return func() {}
	}
	m.observers.Inc()
	return m.observers.Dec
}

// revoked counts a revocation of kind (lock, election) that ended as r says.
func (m *Metrics) revoked(kind string, r revoke.Revocation) {
	if m == nil || r.Outcome == "" {
		return
	}
	m.revocations.WithLabelValues(kind, string(r.Outcome)).Inc()
	m.revocationWait.WithLabelValues(kind, string(r.Outcome)).Observe(r.Waited.Seconds())
}

func (m *Metrics) released(op string) {
	if m != nil {
		m.configReleases.WithLabelValues(op).Inc()
	}
}

func (m *Metrics) statusReported() {
	if m != nil {
		m.statusReports.Inc()
	}
}

// rateLimited counts a refusal for rate; what is the limit's
// "principal ..." or "namespace ...".
func (m *Metrics) rateLimited(what string) {
	if m == nil {
		return
	}
	limit := "principal"
	if strings.HasPrefix(what, "namespace") {
		limit = "namespace"
	}
	m.rateLimits.WithLabelValues(limit).Inc()
}

// QuotaRefused returns the function that counts a refusal of quota
// ("streams", "subscriptions"); it does nothing on a nil *Metrics.
func (m *Metrics) QuotaRefused(quota string) func() {
	if m == nil {
		return nil
	}
	c := m.quotaRefusals.WithLabelValues(quota)
	return c.Inc
}
