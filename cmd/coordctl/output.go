package main

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/coordd/coordd/clientlib"
)

// JSON output (-o json) is the REST API's JSON for the same objects, as
// protojson writes it: lowerCamelCase field names, 64-bit integers (ids,
// tokens, terms, revisions, release numbers) as strings, since JavaScript
// cannot hold them as numbers, times in RFC 3339 (UTC), durations in
// seconds ("60s"), every field present (lists as [], maps as {}, never
// null) except unset times and durations. A list command prints a JSON
// array of such objects. These types are coordctl's own: clientlib's
// result types are for Go programs.

// i64 is an int64 as protojson writes it: a string.
func i64(n int64) string { return strconv.FormatInt(n, 10) }

// timestamp is a google.protobuf.Timestamp as protojson writes it, or ""
// for the zero time.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	t = t.UTC()
	switch ns := t.Nanosecond(); {
	case ns == 0:
		return t.Format("2006-01-02T15:04:05Z")
	case ns%1e6 == 0:
		return t.Format("2006-01-02T15:04:05.000Z")
	case ns%1e3 == 0:
		return t.Format("2006-01-02T15:04:05.000000Z")
	}
	return t.Format("2006-01-02T15:04:05.000000000Z")
}

// duration is a google.protobuf.Duration as protojson writes it: seconds,
// with 0, 3, 6 or 9 fractional digits.
func duration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	s, ns := int64(d/time.Second), int64(d%time.Second)
	switch {
	case ns == 0:
		return fmt.Sprintf("%s%ds", sign, s)
	case ns%1e6 == 0:
		return fmt.Sprintf("%s%d.%03ds", sign, s, ns/1e6)
	case ns%1e3 == 0:
		return fmt.Sprintf("%s%d.%06ds", sign, s, ns/1e3)
	}
	return fmt.Sprintf("%s%d.%09ds", sign, s, ns)
}

// orEmpty keeps a nil map from printing as null.
func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// list keeps a nil slice from printing as null.
func list[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// sessionJSON is REST's Session.
type sessionJSON struct {
	ID           string            `json:"id"`
	TTL          string            `json:"ttl"`
	Owner        string            `json:"owner"`
	Hostname     string            `json:"hostname"`
	Labels       map[string]string `json:"labels"`
	CreateTime   string            `json:"createTime,omitempty"`
	RemainingTTL string            `json:"remainingTtl,omitempty"`
	Principal    string            `json:"principal"`
	Locks        []string          `json:"locks"`
	Elections    []string          `json:"elections"`
}

func sessionOut(s clientlib.SessionInfo) sessionJSON {
	out := sessionJSON{ID: s.ID, TTL: duration(s.TTL), Owner: s.Owner, Hostname: s.Hostname, Labels: orEmpty(s.Labels), CreateTime: timestamp(s.Created),
		Principal: s.Principal, Locks: emptyIfNil(s.Locks), Elections: emptyIfNil(s.Elections)}
	if s.Remaining > 0 {
		out.RemainingTTL = duration(s.Remaining)
	}
	return out
}

// keepAliveJSON is REST's KeepAliveResponse.
type keepAliveJSON struct {
	SessionID string `json:"sessionId"`
	TTL       string `json:"ttl"`
}

// grantJSON is REST's LockGrant.
type grantJSON struct {
	Name      string `json:"name"`
	Token     string `json:"token"`
	SessionID string `json:"sessionId"`
	RequestID string `json:"requestId"`
	Revision  string `json:"revision"`
	Read      bool   `json:"read"`
}

func grantOut(g clientlib.LockGrant) grantJSON {
	return grantJSON{Name: g.Name, Token: g.Token.String(), SessionID: g.SessionID, RequestID: g.RequestID, Revision: i64(g.Revision), Read: g.Read}
}

// lockEntryJSON is REST's LockEntry.
type lockEntryJSON struct {
	SessionID   string `json:"sessionId"`
	RequestID   string `json:"requestId"`
	Metadata    string `json:"metadata"`
	Token       string `json:"token"`
	EnqueueTime string `json:"enqueueTime,omitempty"`
	Owner       string `json:"owner"`
	Hostname    string `json:"hostname"`
	GrantTime   string `json:"grantTime,omitempty"`
	Read        bool   `json:"read"`
}

// lockStateJSON is REST's DescribeLockResponse.
type lockStateJSON struct {
	Name         string          `json:"name"`
	Limit        int             `json:"limit"`
	Holders      []lockEntryJSON `json:"holders"`
	Waiters      []lockEntryJSON `json:"waiters"`
	Revision     string          `json:"revision"`
	DelayedUntil string          `json:"delayedUntil,omitempty"`
	HolderCount  int             `json:"holderCount"`
	WaiterCount  int             `json:"waiterCount"`
	NextPage     string          `json:"nextPageToken,omitempty"`
}

func lockStateOut(st clientlib.LockState) lockStateJSON {
	entries := func(es []clientlib.LockEntry) []lockEntryJSON {
		out := make([]lockEntryJSON, 0, len(es))
		for _, e := range es {
			out = append(out, lockEntryJSON{SessionID: e.SessionID, RequestID: e.RequestID, Metadata: e.Metadata, Token: e.Token.String(),
				EnqueueTime: timestamp(e.Enqueued), Owner: e.Owner, Hostname: e.Hostname, GrantTime: timestamp(e.Granted), Read: e.Read})
		}
		return out
	}
	return lockStateJSON{Name: st.Name, Limit: st.Limit, Holders: entries(st.Holders), Waiters: entries(st.Waiters), Revision: i64(st.Revision), DelayedUntil: timestamp(st.DelayedUntil),
		HolderCount: st.HolderCount, WaiterCount: st.WaiterCount, NextPage: st.NextPageToken}
}

// validJSON reports a valid token or term.
type validJSON struct {
	Name  string `json:"name"`
	Token string `json:"token"`
	Valid bool   `json:"valid"`
}

// leadershipJSON is REST's Leadership, as far as a campaign returns it.
type leadershipJSON struct {
	Name      string `json:"name"`
	Term      string `json:"term"`
	Value     string `json:"value"`
	SessionID string `json:"sessionId"`
}

// leaderJSON is REST's ElectionLeader.
type leaderJSON struct {
	Term      string `json:"term"`
	Value     string `json:"value"`
	SessionID string `json:"sessionId"`
	RequestID string `json:"requestId"`
	Owner     string `json:"owner"`
	Hostname  string `json:"hostname"`
	Since     string `json:"since,omitempty"`
	Proclaims string `json:"proclaims"`
	Priority  int32  `json:"priority,omitempty"`
}

func leaderOut(l clientlib.Leader) leaderJSON {
	return leaderJSON{Term: l.Term.String(), Value: l.Value, SessionID: l.SessionID, RequestID: l.RequestID, Owner: l.Owner, Hostname: l.Hostname, Since: timestamp(l.Since), Proclaims: i64(l.Proclaims), Priority: l.Priority}
}

// candidateJSON is REST's ElectionCandidate.
type candidateJSON struct {
	JoinedRevision string `json:"joinedRevision,omitempty"`
	Priority       int32  `json:"priority,omitempty"`
	Value          string `json:"value"`
	SessionID      string `json:"sessionId"`
	RequestID      string `json:"requestId"`
	Owner          string `json:"owner"`
	Hostname       string `json:"hostname"`
	EnqueueTime    string `json:"enqueueTime,omitempty"`
}

func candidatesOut(cs []clientlib.Candidate) []candidateJSON {
	out := make([]candidateJSON, 0, len(cs))
	for _, c := range cs {
		out = append(out, candidateJSON{JoinedRevision: i64(c.Joined), Priority: c.Priority, Value: c.Value, SessionID: c.SessionID, RequestID: c.RequestID, Owner: c.Owner, Hostname: c.Hostname, EnqueueTime: timestamp(c.Enqueued)})
	}
	return out
}

// electionEventJSON is REST's ElectionEvent (type without its
// ELECTION_EVENT_TYPE_ prefix).
type electionEventJSON struct {
	Type     string         `json:"type"`
	Revision string         `json:"revision"`
	Leader   *leaderJSON    `json:"leader,omitempty"`
	Current  bool           `json:"current"`
	By       *candidateJSON `json:"by,omitempty"`
}

// releaseJSON is REST's ConfigRelease.
type releaseJSON struct {
	Namespace    string       `json:"namespace"`
	Number       string       `json:"number"`
	Revision     string       `json:"revision"`
	Author       string       `json:"author"`
	Message      string       `json:"message"`
	Time         string       `json:"time,omitempty"`
	RollbackOf   string       `json:"rollbackOf"`
	Changes      []changeJSON `json:"changes"`
	PromotedGray string       `json:"promotedGray"`
	Proposal     string       `json:"proposal"`
	ProposedBy   string       `json:"proposedBy,omitempty"`
	ApprovedBy   string       `json:"approvedBy,omitempty"`
	// InheritedFrom and InheritedRelease: the shared release it carried.
	InheritedFrom    string `json:"inheritedFrom,omitempty"`
	InheritedRelease string `json:"inheritedRelease"`
}

// changeJSON is REST's ConfigChange: oldValue is absent for an added key,
// newValue for a removed one.
type changeJSON struct {
	Key      string  `json:"key"`
	OldValue *string `json:"oldValue,omitempty"`
	NewValue *string `json:"newValue,omitempty"`
	Secret   bool    `json:"secret,omitempty"`
}

func releaseOut(r clientlib.ConfigRelease) releaseJSON {
	out := releaseJSON{Namespace: r.Namespace, Number: i64(r.Number), Revision: i64(r.Revision), Author: r.Author, Message: r.Message,
		Time: timestamp(r.Time), RollbackOf: i64(r.RollbackOf), Changes: changesOut(r.Changes), PromotedGray: i64(r.PromotedGray),
		Proposal: i64(r.Proposal), ProposedBy: r.ProposedBy, ApprovedBy: r.ApprovedBy,
		InheritedFrom: r.InheritedFrom, InheritedRelease: i64(r.InheritedRelease)}
	return out
}

func releasesOut(rs []clientlib.ConfigRelease) []releaseJSON {
	out := make([]releaseJSON, 0, len(rs))
	for _, r := range rs {
		out = append(out, releaseOut(r))
	}
	return out
}

func changesOut(cs []clientlib.KeyChange) []changeJSON {
	out := make([]changeJSON, 0, len(cs))
	for _, c := range cs {
		out = append(out, changeJSON{Key: c.Key, OldValue: c.Old, NewValue: c.New, Secret: c.Secret})
	}
	return out
}

// valueJSON is REST's GetResponse, as far as clientlib returns it.
type valueJSON struct {
	Key         string `json:"key"`
	Value       string `json:"value"`
	ModRevision string `json:"modRevision"`
}

// entryJSON is REST's ConfigEntry.
type entryJSON struct {
	Key       string `json:"key"`
	Value     string `json:"value"`
	Secret    bool   `json:"secret,omitempty"`
	Inherited bool   `json:"inherited,omitempty"`
}

// snapshotJSON is REST's NamespaceSnapshot: entries in key order.
type snapshotJSON struct {
	Namespace            string      `json:"namespace"`
	Release              string      `json:"release"`
	Revision             string      `json:"revision"`
	ChangedRevision      string      `json:"changedRevision"`
	Gray                 string      `json:"gray"`
	Inherits             string      `json:"inherits,omitempty"`
	InheritanceSuspended string      `json:"inheritanceSuspended,omitempty"`
	Entries              []entryJSON `json:"entries"`
}

func snapshotOut(s clientlib.NamespaceSnapshot) snapshotJSON {
	out := snapshotJSON{Namespace: s.Namespace, Release: i64(s.Release), Revision: i64(s.Revision), ChangedRevision: i64(s.Changed), Gray: i64(s.Gray), Inherits: s.Inherits,
		InheritanceSuspended: s.InheritanceSuspended, Entries: []entryJSON{}}
	for _, k := range slices.Sorted(maps.Keys(s.Values)) {
		out.Entries = append(out.Entries, entryJSON{Key: k, Value: s.Values[k], Secret: slices.Contains(s.Secret, k), Inherited: slices.Contains(s.Inherited, k)})
	}
	for _, k := range s.Hidden {
		out.Entries = append(out.Entries, entryJSON{Key: k, Secret: true})
	}
	slices.SortFunc(out.Entries, func(a, b entryJSON) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// watchJSON is REST's WatchResponse (type without its WATCH_EVENT_TYPE_
// prefix).
type watchJSON struct {
	Type      string         `json:"type"`
	Revision  string         `json:"revision"`
	Snapshots []snapshotJSON `json:"snapshots"`
	Release   *releaseJSON   `json:"release,omitempty"`
	Gray      string         `json:"gray"`
}

func watchOut(ev clientlib.ConfigWatchEvent) watchJSON {
	out := watchJSON{Type: ev.Type, Revision: i64(ev.Revision), Snapshots: make([]snapshotJSON, 0, len(ev.Snapshots)), Gray: i64(ev.Gray)}
	for _, s := range ev.Snapshots {
		out.Snapshots = append(out.Snapshots, snapshotOut(s))
	}
	if ev.Release != nil {
		r := releaseOut(*ev.Release)
		out.Release = &r
	}
	return out
}

// schemaJSON is REST's GetSchemaResponse, as far as clientlib returns it.
type schemaJSON struct {
	Namespace string `json:"namespace"`
	Schema    string `json:"schema"`
}

// applyStatusJSON is REST's GetApplyStatusResponse.
type applyStatusJSON struct {
	Instances []instanceJSON     `json:"instances"`
	Applied   []releaseCountJSON `json:"applied"`
	Rejected  []releaseCountJSON `json:"rejected"`
	// AppliedGray and RejectedGray count per gray release.
	AppliedGray  []releaseCountJSON `json:"appliedGray"`
	RejectedGray []releaseCountJSON `json:"rejectedGray"`
}

// instanceJSON is REST's InstanceApplyStatus.
type instanceJSON struct {
	Instance        string            `json:"instance"`
	Labels          map[string]string `json:"labels"`
	AppliedRelease  string            `json:"appliedRelease"`
	RejectedRelease string            `json:"rejectedRelease"`
	Reason          string            `json:"reason"`
	ReportTime      string            `json:"reportTime,omitempty"`
	AppliedGray     string            `json:"appliedGray"`
	RejectedGray    string            `json:"rejectedGray"`
}

// releaseCountJSON is REST's ReleaseCount.
type releaseCountJSON struct {
	Release   string `json:"release"`
	Instances int    `json:"instances"`
}

func applyStatusOut(st clientlib.ApplyStatus) applyStatusJSON {
	counts := func(m map[int64]int) []releaseCountJSON {
		out := make([]releaseCountJSON, 0, len(m))
		for _, r := range slices.Sorted(maps.Keys(m)) {
			out = append(out, releaseCountJSON{Release: i64(r), Instances: m[r]})
		}
		return out
	}
	out := applyStatusJSON{Instances: make([]instanceJSON, 0, len(st.Instances)), Applied: counts(st.Applied), Rejected: counts(st.Rejected),
		AppliedGray: counts(st.AppliedGray), RejectedGray: counts(st.RejectedGray)}
	for _, in := range st.Instances {
		out.Instances = append(out.Instances, instanceJSON{Instance: in.Instance, Labels: orEmpty(in.Labels), AppliedRelease: i64(in.Applied),
			RejectedRelease: i64(in.Rejected), Reason: in.Reason, ReportTime: timestamp(in.Reported), AppliedGray: i64(in.AppliedGray), RejectedGray: i64(in.RejectedGray)})
	}
	return out
}

// clusterJSON is REST's GetClusterStatusResponse.
type clusterJSON struct {
	ClusterID        string       `json:"clusterId"`
	Members          []memberJSON `json:"members"`
	LeaderID         string       `json:"leaderId"`
	Revision         string       `json:"revision"`
	RaftTerm         string       `json:"raftTerm"`
	DBSizeBytes      string       `json:"dbSizeBytes"`
	DBSizeInUseBytes string       `json:"dbSizeInUseBytes"`
	EtcdVersion      string       `json:"etcdVersion"`
	CoorddVersion    string       `json:"coorddVersion"`
	MemberID         string       `json:"memberId"`
	Alarms           []alarmJSON  `json:"alarms"`
	QuotaBytes       string       `json:"quotaBackendBytes"`
}

// memberJSON is REST's ClusterMember.
type memberJSON struct {
	ID         string      `json:"id"`
	Name       string      `json:"name"`
	PeerURLs   []string    `json:"peerUrls"`
	ClientURLs []string    `json:"clientUrls"`
	IsLeader   bool        `json:"isLeader"`
	IsLearner  bool        `json:"isLearner"`
	Health     *healthJSON `json:"health,omitempty"`
}

// healthJSON is coordd.v1.MemberHealth as REST shows it.
type healthJSON struct {
	ReportedAt       string      `json:"reportedAt,omitempty"`
	Stale            bool        `json:"stale,omitempty"`
	Error            string      `json:"error,omitempty"`
	LeaderID         string      `json:"leaderId,omitempty"`
	RaftTerm         string      `json:"raftTerm"`
	RaftIndex        string      `json:"raftIndex"`
	RaftAppliedIndex string      `json:"raftAppliedIndex"`
	DBSizeBytes      string      `json:"dbSizeBytes"`
	DBSizeInUseBytes string      `json:"dbSizeInUseBytes"`
	EtcdVersion      string      `json:"etcdVersion,omitempty"`
	CoorddVersion    string      `json:"coorddVersion,omitempty"`
	Alarms           []alarmJSON `json:"alarms"`
}

func memberOut(m clientlib.ClusterMember) memberJSON {
	out := memberJSON{ID: m.ID, Name: m.Name, PeerURLs: list(m.PeerURLs), ClientURLs: list(m.ClientURLs), IsLeader: m.Leader, IsLearner: m.Learner}
	if h := m.Health; h != nil {
		out.Health = &healthJSON{Stale: h.Stale, Error: h.Error, LeaderID: h.LeaderID,
			RaftTerm: strconv.FormatUint(h.RaftTerm, 10), RaftIndex: strconv.FormatUint(h.RaftIndex, 10), RaftAppliedIndex: strconv.FormatUint(h.AppliedIndex, 10),
			DBSizeBytes: i64(h.DBSize), DBSizeInUseBytes: i64(h.DBSizeInUse), EtcdVersion: h.EtcdVersion, CoorddVersion: h.CoorddVersion, Alarms: alarmsOut(h.Alarms)}
		if !h.ReportedAt.IsZero() {
			out.Health.ReportedAt = timestamp(h.ReportedAt)
		}
	}
	return out
}

func clusterOut(st clientlib.ClusterStatus) clusterJSON {
	out := clusterJSON{ClusterID: st.ClusterID, Members: make([]memberJSON, 0, len(st.Members)), LeaderID: st.LeaderID, Revision: i64(st.Revision),
		RaftTerm: strconv.FormatUint(st.RaftTerm, 10), DBSizeBytes: i64(st.DBSize), DBSizeInUseBytes: i64(st.DBSizeInUse),
		EtcdVersion: st.EtcdVersion, CoorddVersion: st.CoorddVersion, MemberID: st.MemberID, Alarms: alarmsOut(st.Alarms), QuotaBytes: i64(st.Quota)}
	for _, m := range st.Members {
		out.Members = append(out.Members, memberOut(m))
	}
	return out
}

type alarmJSON struct {
	MemberID   string `json:"memberId"`
	MemberName string `json:"memberName"`
	Type       string `json:"type"`
}

func alarmsOut(as []clientlib.Alarm) []alarmJSON {
	out := make([]alarmJSON, 0, len(as))
	for _, a := range as {
		out = append(out, alarmJSON{MemberID: a.MemberID, MemberName: a.MemberName, Type: "ALARM_TYPE_" + a.Type})
	}
	return out
}

type whoAmIJSON struct {
	Principal string   `json:"principal"`
	Groups    []string `json:"groups"`
	Policy    bool     `json:"policy"`
}

func whoAmIOut(id clientlib.Identity) whoAmIJSON {
	return whoAmIJSON{Principal: id.Principal, Groups: append([]string{}, id.Groups...), Policy: id.Policy}
}

type defragJSON struct {
	MemberID          string `json:"memberId"`
	MemberName        string `json:"memberName"`
	DBSizeBeforeBytes string `json:"dbSizeBeforeBytes"`
	DBSizeAfterBytes  string `json:"dbSizeAfterBytes"`
	TookMs            string `json:"tookMs"`
}

func defragsOut(ds []clientlib.Defrag) []defragJSON {
	out := make([]defragJSON, 0, len(ds))
	for _, d := range ds {
		out = append(out, defragJSON{MemberID: d.MemberID, MemberName: d.MemberName, DBSizeBeforeBytes: i64(d.SizeBefore),
			DBSizeAfterBytes: i64(d.SizeAfter), TookMs: i64(d.Took.Milliseconds())})
	}
	return out
}

// errorJSON is an error as -o json prints it, on stderr.
type errorJSON struct {
	Error errorBodyJSON `json:"error"`
}

type errorBodyJSON struct {
	// Code is the gRPC code's name for a server's error ("NOT_FOUND"),
	// else one of USAGE, NOT_FOUND, CONFLICT, UNAVAILABLE,
	// DEADLINE_EXCEEDED, LOST (run lost its hold) or UNKNOWN.
	Code     string        `json:"code"`
	Reason   string        `json:"reason,omitempty"` // the server's reason: "SESSION_NOT_FOUND"
	Message  string        `json:"message"`
	Problems []problemJSON `json:"problems,omitempty"` // of a refused config write
	ExitCode int           `json:"exitCode"`
}

type problemJSON struct {
	Key         string `json:"key,omitempty"`
	Description string `json:"description"`
}

// localCodes name the errors that do not come from the server, by exit code.
var localCodes = map[int]string{
	exitUsage:       "USAGE",
	exitNotFound:    "NOT_FOUND",
	exitConflict:    "CONFLICT",
	exitUnavailable: "UNAVAILABLE",
	exitTimeout:     "DEADLINE_EXCEEDED",
	exitLost:        "LOST",
}

func errorOut(err error, exit int) errorJSON {
	out := errorBodyJSON{Code: cmp.Or(localCodes[exit], "UNKNOWN"), Message: describe(err), ExitCode: exit}
	var ce *clientlib.Error
	if errors.As(err, &ce) {
		out.Code, out.Reason, out.Message = code.Code(ce.Code).String(), ce.Reason, ce.Message
		for _, p := range ce.Problems {
			out.Problems = append(out.Problems, problemJSON{Key: p.Key, Description: p.Description})
		}
	}
	return errorJSON{out}
}

// emptyIfNil makes a missing list [] in JSON, as REST has it.
func emptyIfNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// cell is free text (an author, a message) made safe for one cell of a
// table on a terminal: newlines, tabs and every other control character
// (an escape sequence, a carriage return, a bidi override) are shown
// escaped, so a stored text can neither break the table's lines nor make
// the terminal do anything. coordd refuses such characters in new text;
// this covers what was stored before, and what other paths carry.
func cell(s string) string {
	return escapeControls(s, false)
}

// block is cell for a block of text shown on lines of its own: newlines
// stay.
func block(s string) string {
	return escapeControls(s, true)
}

func escapeControls(s string, keepNewlines bool) string {
	if !strings.ContainsFunc(s, isTerminalControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' && keepNewlines:
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case isTerminalControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isTerminalControl reports whether r makes a terminal do something
// rather than show a character: C0 and C1 controls, DEL, and the
// bidirectional embeddings, overrides and isolates.
func isTerminalControl(r rune) bool {
	return unicode.IsControl(r) || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}
