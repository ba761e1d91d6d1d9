package configcenter

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/names"
)

// Applied-status feedback: each subscribed instance reports, per
// namespace, the release it applied and the last one it rejected; the
// store keeps the latest report per instance (outside the watched config
// tree, under root+"configstatus/") and aggregates them. Reports older
// than StatusTTL count as gone: an instance reports at least every half
// StatusTTL while it lives.

// StatusTTL is how long a report counts without being renewed.
const StatusTTL = 2 * time.Minute

// Limits of a report.
const (
	MaxInstanceBytes = 128
	MaxStatusLabels  = 16
	MaxReasonBytes   = 1024
)

// InstanceStatus is one instance's report for one namespace.
type InstanceStatus struct {
	Instance string            `json:"-"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Applied is the release the instance runs with (0: none yet).
	Applied int64 `json:"applied"`
	// Rejected is the last release it refused (failed to decode or
	// validate), if newer than Applied; Reason says why.
	Rejected int64  `json:"rejected,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// AppliedGray is the gray release the instance runs on top of Applied;
	// RejectedGray the gray release of Rejected, if the content it refused
	// was a gray's.
	AppliedGray  int64     `json:"applied_gray,omitempty"`
	RejectedGray int64     `json:"rejected_gray,omitempty"`
	Time         time.Time `json:"time"`
}

// ApplyStatus aggregates the live reports of a namespace.
type ApplyStatus struct {
	Namespace string
	Instances []InstanceStatus // sorted by instance
	Applied   map[int64]int    // release -> instances running it
	Rejected  map[int64]int    // release -> instances that refused it
	// AppliedGray and RejectedGray count the same per gray release.
	AppliedGray  map[int64]int
	RejectedGray map[int64]int
}

func (s *Store) statusPrefix(ns string) string {
	return strings.TrimSuffix(s.root, "config/") + "configstatus/" + names.Escape(ns) + "/"
}

// ReportStatus records an instance's status for a namespace.
func (s *Store) ReportStatus(ctx context.Context, ns string, st InstanceStatus) error {
	if err := ValidateNamespace(ns); err != nil {
		return err
	}
	if err := names.CheckRequestID(st.Instance); err != nil || len(st.Instance) > MaxInstanceBytes {
		return fmt.Errorf("%w: instance id %q: 1-%d bytes of letters, digits and . _ : @ -", ErrInvalid, st.Instance, MaxInstanceBytes)
	}
	if len(st.Labels) > MaxStatusLabels {
		return fmt.Errorf("%w: %d labels, at most %d are allowed", ErrInvalid, len(st.Labels), MaxStatusLabels)
	}
	for k, v := range st.Labels {
		if err := validateLine("label", k+v, 512); err != nil {
			return err
		}
	}
	if err := validateText("reason", st.Reason, MaxReasonBytes); err != nil {
		return err
	}
	if st.Applied < 0 || st.Rejected < 0 || st.AppliedGray < 0 || st.RejectedGray < 0 {
		return fmt.Errorf("%w: releases must not be negative", ErrInvalid)
	}
	st.Time = s.now().UTC()
	val, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.statusPrefix(ns)+st.Instance, string(val)); err != nil {
		return fmt.Errorf("config: report status: %w", err)
	}
	return nil
}

// ApplyStatus returns the live reports of a namespace, and removes the
// expired ones.
func (s *Store) ApplyStatus(ctx context.Context, ns string) (ApplyStatus, error) {
	if err := ValidateNamespace(ns); err != nil {
		return ApplyStatus{}, err
	}
	resp, err := s.cli.Get(ctx, s.statusPrefix(ns), clientv3.WithPrefix())
	if err != nil {
		return ApplyStatus{}, fmt.Errorf("config: status of %q: %w", ns, err)
	}
	out := ApplyStatus{Namespace: ns, Applied: map[int64]int{}, Rejected: map[int64]int{}, AppliedGray: map[int64]int{}, RejectedGray: map[int64]int{}}
	now := s.now()
	for _, kv := range resp.Kvs {
		var st InstanceStatus
		if json.Unmarshal(kv.Value, &st) != nil || now.Sub(st.Time) > StatusTTL {
			// Expired: gone, unless it reported again meanwhile.
			_, _ = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(string(kv.Key))).Commit()
			continue
		}
		st.Instance = strings.TrimPrefix(string(kv.Key), s.statusPrefix(ns))
		out.Instances = append(out.Instances, st)
		out.Applied[st.Applied]++
		if st.AppliedGray > 0 {
			out.AppliedGray[st.AppliedGray]++
		}
		switch {
		case st.RejectedGray > 0 && st.RejectedGray != st.AppliedGray:
			out.RejectedGray[st.RejectedGray]++
		case st.RejectedGray == 0 && st.Rejected > st.Applied:
			out.Rejected[st.Rejected]++
		}
	}
	sort.Slice(out.Instances, func(i, j int) bool { return out.Instances[i].Instance < out.Instances[j].Instance })
	return out, nil
}
