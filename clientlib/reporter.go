package clientlib

import (
	"context"
	"maps"
	"sync"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// reporter tells the server, per namespace, which release this instance
// applied and which it rejected: after every change (coalesced: only the
// latest state is sent) and every reportEvery, so the server can count
// live instances.
type reporter struct {
	c    *Client
	opts subscribeOptions

	mu    sync.Mutex
	state map[string]*coorddv1.NamespaceApplyReport // guarded by mu
	dirty chan struct{}
}

func newReporter(c *Client, o subscribeOptions) *reporter {
	return &reporter{c: c, opts: o, state: map[string]*coorddv1.NamespaceApplyReport{}, dirty: make(chan struct{}, 1)}
}

// applied records that snap's releases were applied, except in the
// namespaces a binding rejected (those keep their applied release and
// record the rejection).
func (r *reporter) applied(snap *ConfigSnapshot, rejected map[string]error) {
	if snap.revision == 0 && len(rejected) == 0 {
		return // nothing known yet
	}
	r.mu.Lock()
	for ns, v := range snap.spaces {
		st := r.state[ns]
		if st == nil {
			st = &coorddv1.NamespaceApplyReport{Namespace: ns}
			r.state[ns] = st
		}
		switch err, ok := rejected[ns]; {
		case ok:
			st.RejectedRelease, st.RejectedGray, st.Reason = v.release, v.gray, truncate(err.Error(), 1000)
		case st.RejectedRelease != 0 && (v.release < st.RejectedRelease || v.release == st.RejectedRelease && v.gray == st.RejectedGray):
			// The rejected release is still the latest (a relist, or another
			// namespace changed): it stays rejected, nothing new applied.
		default:
			st.AppliedRelease, st.AppliedGray = v.release, v.gray
			st.RejectedRelease, st.RejectedGray, st.Reason = 0, 0, ""
		}
	}
	r.mu.Unlock()
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// minReportGap spaces reports out: a burst of releases makes one report
// per second per subscription, not one per release.
const minReportGap = time.Second

func (r *reporter) run(ctx context.Context) {
	ticker := time.NewTicker(r.opts.reportEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.dirty:
		case <-ticker.C:
		}
		r.mu.Lock()
		var reports []*coorddv1.NamespaceApplyReport
		for _, st := range r.state {
			reports = append(reports, &coorddv1.NamespaceApplyReport{Namespace: st.Namespace, AppliedRelease: st.AppliedRelease, RejectedRelease: st.RejectedRelease, Reason: st.Reason,
				AppliedGray: st.AppliedGray, RejectedGray: st.RejectedGray})
		}
		r.mu.Unlock()
		if len(reports) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.c.config.ReportStatus(rctx, &coorddv1.ReportStatusRequest{Instance: r.opts.instance, Labels: maps.Clone(r.opts.labels), Namespaces: reports})
		cancel()
		if err != nil && ctx.Err() == nil {
			r.c.lg.Debug("coordd: status report failed; the next one will carry it", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(minReportGap):
		}
	}
}
