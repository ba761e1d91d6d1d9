package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Membership errors. Each leaves the cluster as it was.
var (
	ErrMemberNotFound = errkind.MemberNotFound.New("cluster: no member has that name or id")
	// ErrChangeRefused wraps every refused membership change; the message
	// says which rule refused it and what to do.
	ErrChangeRefused = errkind.MemberChangeRefused.New("cluster: member change refused")
)

// DefaultHealthInterval is how often an embedded member reports its health.
const DefaultHealthInterval = 5 * time.Second

// staleAfter is how many report intervals a report stays fresh.
const staleAfter = 3

// Health is one member's account of itself.
type Health struct {
	At            time.Time `json:"at"` // when the member measured it, by its own clock
	LeaderID      uint64    `json:"leader"`
	RaftTerm      uint64    `json:"raft_term"`
	RaftIndex     uint64    `json:"raft_index"`
	AppliedIndex  uint64    `json:"applied_index"`
	DBSize        int64     `json:"db_size"`
	DBSizeInUse   int64     `json:"db_size_in_use"`
	EtcdVersion   string    `json:"etcd_version"`
	CoorddVersion string    `json:"coordd_version,omitempty"`
	Errors        []string  `json:"errors,omitempty"` // etcd's own (e.g. a corrupt backend)
	// DiskSlow: the member found its own disk slow (coordd's slow-disk
	// watch: --slow-disk-threshold).
	DiskSlow bool `json:"disk_slow,omitempty"`

	// Set by the reader, not stored.
	Alarms []Alarm `json:"-"`
	// Stale: the report is older than three report intervals, or the member
	// did not answer; Error says why.
	Stale bool   `json:"-"`
	Error string `json:"-"`
}

// healthKey is where the member id reports its health.
func (m *Manager) healthKey(id uint64) string {
	return m.root + "cluster/health/" + strconv.FormatUint(id, 16)
}

// measure asks the member at endpoint for its raft and database status.
func (m *Manager) measure(ctx context.Context, endpoint string) (uint64, Health, error) {
	if endpoint == m.endpoint && m.local.Measure != nil {
		h := m.local.Measure()
		h.At = time.Now()
		return m.local.MemberID, h, nil
	}
	st, err := m.cli.Status(ctx, endpoint)
	if err != nil {
		return 0, Health{}, err
	}
	return st.Header.MemberId, Health{
		At: time.Now(), LeaderID: st.Leader, RaftTerm: st.RaftTerm, RaftIndex: st.RaftIndex, AppliedIndex: st.RaftAppliedIndex,
		DBSize: st.DbSize, DBSizeInUse: st.DbSizeInUse, EtcdVersion: st.Version, Errors: st.Errors,
	}, nil
}

// RunHealthReports writes the embedded member's health under the key root
// every interval until ctx ends, so that every member can show every
// other's (their etcd client ports are not reachable from each other). A
// report that cannot be written (no quorum, a full database) is retried at
// the next tick. With an external etcd (no embedded member) it returns at
// once: members are asked directly.
func (m *Manager) RunHealthReports(ctx context.Context, interval time.Duration, coorddVersion string, lg *zap.Logger) {
	if m.local.MemberID == 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.report(ctx, coorddVersion); err != nil && ctx.Err() == nil {
			lg.Debug("health report not written", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Manager) report(ctx context.Context, coorddVersion string) error {
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	_, h, err := m.measure(ctx, m.endpoint)
	if err != nil {
		return err
	}
	h.CoorddVersion = coorddVersion
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = m.cli.Put(ctx, m.healthKey(m.local.MemberID), string(b))
	return err
}

// HandOverOrder orders ids (voting members other than this one) for a
// hand-over of etcd's leadership, healthiest first: members whose last
// health report is fresh and whose disk is not slow, then those whose disk
// is slow, then those without a fresh report; the most caught up (applied
// index) first within each. It reads this member's own copy of the reports
// (no round to the leader), so it answers on a member that cannot commit.
func (m *Manager) HandOverOrder(ctx context.Context, ids []uint64) []uint64 {
	reports := m.reports(ctx)
	maps.DeleteFunc(reports, func(_ uint64, h Health) bool { return h.Stale })
	rank := func(id uint64) int {
		h, ok := reports[id]
		switch {
		case !ok:
			return 2
		case h.DiskSlow:
			return 1
		}
		return 0
	}
	out := slices.Clone(ids)
	slices.SortStableFunc(out, func(a, b uint64) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		switch ia, ib := reports[a].AppliedIndex, reports[b].AppliedIndex; {
		case ia > ib:
			return -1
		case ia < ib:
			return 1
		}
		return 0
	})
	return out
}

// reports reads the embedded members' health reports from this member's
// own copy (serializable: no round to the leader), by member id; a report
// older than three intervals is marked Stale. None when the read fails.
func (m *Manager) reports(ctx context.Context) map[uint64]Health {
	out := map[uint64]Health{}
	resp, err := m.cli.Get(ctx, m.root+"cluster/health/", clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		return out
	}
	for _, kv := range resp.Kvs {
		var h Health
		id, perr := strconv.ParseUint(strings.TrimPrefix(string(kv.Key), m.root+"cluster/health/"), 16, 64)
		if perr != nil || json.Unmarshal(kv.Value, &h) != nil {
			continue
		}
		if age := time.Since(h.At); age > staleAfter*m.interval {
			h.Stale, h.Error = true, fmt.Sprintf("last report %s ago: the member is down, cut off or not reporting", age.Round(time.Second))
		}
		out[id] = h
	}
	return out
}

// healthOf returns each member's health: the answering member's (self,
// measured by the caller just now), the others' from their last report
// (embedded members) or asked directly (an external etcd, whose client
// URLs coordd reaches).
func (m *Manager) healthOf(ctx context.Context, members []Member, alarms []Alarm, self Health) map[uint64]Health {
	out := map[uint64]Health{}
	var mu sync.Mutex
	if m.local.MemberID != 0 {
		maps.Copy(out, m.reports(ctx))
		self.CoorddVersion = m.version
		out[m.local.MemberID] = self
	} else {
		var wg sync.WaitGroup
		for _, mb := range members {
			if len(mb.ClientURLs) == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				id, h, err := m.measure(ctx, mb.ClientURLs[0])
				switch {
				case err != nil:
					h = Health{Stale: true, Error: fmt.Sprintf("no answer from %s: %v", mb.ClientURLs[0], err)}
				case id != mb.ID:
					h = Health{Stale: true, Error: fmt.Sprintf("%s answered as member %x", mb.ClientURLs[0], id)}
				}
				mu.Lock()
				out[mb.ID] = h
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	for _, mb := range members {
		h, ok := out[mb.ID]
		if !ok {
			if mb.Name == "" {
				continue // added, never started: nothing to report
			}
			h = Health{Stale: true, Error: "no health report from this member"}
		}
		for _, a := range alarms {
			if a.MemberID == mb.ID {
				h.Alarms = append(h.Alarms, a)
			}
		}
		out[mb.ID] = h
	}
	return out
}

// Members lists the members, each with its health, and the leader as the
// answering member sees it (0 while there is none).
func (m *Manager) Members(ctx context.Context) ([]Member, uint64, error) {
	v, err := m.view(ctx)
	if err != nil {
		return nil, 0, err
	}
	return v.members, v.self.LeaderID, nil
}

// view is the member list, with health, as the answering member sees it.
type view struct {
	clusterID uint64
	members   []Member
	self      Health  // the answering member's
	alarms    []Alarm // cluster-wide, with member names
}

func (m *Manager) view(ctx context.Context) (view, error) {
	resp, err := m.cli.MemberList(ctx)
	if err != nil {
		return view{}, fmt.Errorf("cluster: member list: %w", err)
	}
	_, self, err := m.measure(ctx, m.endpoint)
	if err != nil {
		return view{}, fmt.Errorf("cluster: status: %w", err)
	}
	alarms, err := m.cli.AlarmList(ctx) // a raft request: once per view
	if err != nil {
		return view{}, fmt.Errorf("cluster: alarms: %w", err)
	}
	v := view{clusterID: resp.Header.ClusterId, self: self, alarms: AlarmsFrom(alarms.Alarms)}
	names := map[uint64]string{}
	for _, mb := range resp.Members {
		names[mb.ID] = mb.Name
		v.members = append(v.members, Member{
			ID: mb.ID, Name: mb.Name, PeerURLs: mb.PeerURLs, ClientURLs: mb.ClientURLs,
			Leader: mb.ID == self.LeaderID, Learner: mb.IsLearner,
		})
	}
	for i := range v.alarms {
		v.alarms[i].MemberName = names[v.alarms[i].MemberID]
	}
	health := m.healthOf(ctx, v.members, v.alarms, self)
	for i := range v.members {
		if h, ok := health[v.members[i].ID]; ok {
			v.members[i].Health = &h
		}
	}
	return v, nil
}

// find returns the member named by name or hex id.
func find(members []Member, nameOrID string) (Member, error) {
	for _, mb := range members {
		if mb.Name == nameOrID && nameOrID != "" {
			return mb, nil
		}
	}
	if id, err := strconv.ParseUint(nameOrID, 16, 64); err == nil {
		for _, mb := range members {
			if mb.ID == id {
				return mb, nil
			}
		}
	}
	names := make([]string, 0, len(members))
	for _, mb := range members {
		names = append(names, fmt.Sprintf("%s (%x)", cmp(mb.Name, "unstarted"), mb.ID))
	}
	return Member{}, fmt.Errorf("%w: %q; members: %s", ErrMemberNotFound, nameOrID, strings.Join(names, ", "))
}

func cmp(s, orElse string) string {
	if s == "" {
		return orElse
	}
	return s
}

// memberName is what a member's --name may be: it becomes part of
// --initial-cluster, so no commas, equals signs or spaces.
var memberName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Added describes a learner just added and how to start it.
type Added struct {
	Member              Member
	InitialCluster      string // its --initial-cluster
	InitialClusterState string // its --initial-cluster-state: "existing"
}

// AddMember adds a learner that will start with name and peerURLs. The
// quorum does not change until PromoteMember; the learner receives the log
// meanwhile. Refused: a name or peer URL in use, a bad URL, and a second
// learner (etcd allows one at a time) or a member added but never started.
func (m *Manager) AddMember(ctx context.Context, name string, peerURLs []string) (Added, error) {
	if !memberName.MatchString(name) {
		return Added{}, invalidf("cluster: member name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if len(peerURLs) == 0 {
		return Added{}, errkind.Invalid.New("cluster: at least one peer URL is needed (where the other members reach the new one, e.g. http://10.0.0.4:7423)")
	}
	for _, u := range peerURLs {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.Port() == "" {
			return Added{}, invalidf("cluster: peer URL %q: want http(s)://host:port", u)
		}
	}
	resp, err := m.cli.MemberList(ctx)
	if err != nil {
		return Added{}, fmt.Errorf("cluster: member list: %w", err)
	}
	var parts []string
	for _, mb := range resp.Members {
		switch mb.Name {
		case name:
			return Added{}, fmt.Errorf("%w: a member named %q exists already (%x)", ErrChangeRefused, name, mb.ID)
		case "":
			return Added{}, fmt.Errorf("%w: member %x (%s) was added but has not started: start it, or remove it, before adding another",
				ErrChangeRefused, mb.ID, strings.Join(mb.PeerURLs, ","))
		}
		for _, u := range mb.PeerURLs {
			if slices.Contains(peerURLs, u) {
				return Added{}, fmt.Errorf("%w: peer URL %s is member %s's", ErrChangeRefused, u, mb.Name)
			}
			parts = append(parts, mb.Name+"="+u)
		}
	}
	var added *clientv3.MemberAddResponse
	if err := reconfigure(ctx, "add "+name, func() (err error) {
		added, err = m.cli.MemberAddAsLearner(ctx, peerURLs)
		return err
	}); err != nil {
		return Added{}, err
	}
	for _, u := range peerURLs {
		parts = append(parts, name+"="+u)
	}
	return Added{
		Member:         Member{ID: added.Member.ID, Name: name, PeerURLs: added.Member.PeerURLs, Learner: true},
		InitialCluster: strings.Join(parts, ","), InitialClusterState: "existing",
	}, nil
}

// PromoteMember makes a learner a voting member. It waits, until ctx
// ends, for the learner to catch up with the leader's log (etcd refuses to
// promote it before); then it is refused and nothing changed. Refused at
// once for a voting member.
//
// Every membership change waits likewise, until ctx ends, while etcd's
// leader has not been connected to every voting member for 5 s.
func (m *Manager) PromoteMember(ctx context.Context, nameOrID string) (Member, error) {
	members, _, err := m.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	mb, err := find(members, nameOrID)
	if err != nil {
		return Member{}, err
	}
	if !mb.Learner {
		return Member{}, fmt.Errorf("%w: %s is a voting member already", ErrChangeRefused, cmp(mb.Name, nameOrID))
	}
	if err := reconfigure(ctx, "promote "+cmp(mb.Name, nameOrID), func() error {
		_, err := m.cli.MemberPromote(ctx, mb.ID)
		return err
	}); err != nil {
		return Member{}, err
	}
	mb.Learner = false
	return mb, nil
}

// RemoveMember removes a member for good: its etcd stops, and so does the
// coordd that embeds it; its data dir cannot be used again. Refused: the
// last voting member; the leader while a learner is unpromoted (promote or
// remove the learner first); a removal that would leave fewer started
// voting members than a quorum (etcd's strict reconfiguration check).
func (m *Manager) RemoveMember(ctx context.Context, nameOrID string) (Member, error) {
	members, leader, err := m.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	mb, err := find(members, nameOrID)
	if err != nil {
		return Member{}, err
	}
	voters := 0
	var learner *Member
	for i, o := range members {
		if o.Learner {
			learner = &members[i]
		} else {
			voters++
		}
	}
	switch {
	case !mb.Learner && voters == 1:
		return Member{}, fmt.Errorf("%w: %s is the last voting member: removing it would end the cluster", ErrChangeRefused, mb.Name)
	case mb.ID == leader && learner != nil:
		return Member{}, fmt.Errorf("%w: %s leads the cluster while learner %s is unpromoted: promote the learner (coordctl member promote %s) or remove it first",
			ErrChangeRefused, mb.Name, cmp(learner.Name, strconv.FormatUint(learner.ID, 16)), cmp(learner.Name, strconv.FormatUint(learner.ID, 16)))
	}
	if err := reconfigure(ctx, "remove "+cmp(mb.Name, nameOrID), func() error {
		_, err := m.cli.MemberRemove(ctx, mb.ID)
		return err
	}); err != nil {
		return Member{}, err
	}
	// Its last report would only confuse; a failure leaves a stale entry
	// that no member shows (it is no longer listed).
	_, _ = m.cli.Delete(ctx, m.healthKey(mb.ID))
	return mb, nil
}

// reconfigure runs one membership change, retrying while etcd refuses it
// for a reason that passes (every 200 ms, until ctx ends): before any
// change, etcd's leader must have been connected to every voting member
// for 5 s (ErrUnhealthy), and a learner is promoted only once it has caught
// up (ErrMemberLearnerNotReady). etcd refuses both before proposing
// anything, so a retry never applies a change twice.
func reconfigure(ctx context.Context, op string, change func() error) error {
	for {
		err := change()
		if err == nil {
			return nil
		}
		if e := rpctypes.Error(err); !errors.Is(e, rpctypes.ErrUnhealthy) && !errors.Is(e, rpctypes.ErrMemberLearnerNotReady) {
			return memberErr(op, err)
		}
		select {
		case <-ctx.Done():
			return memberErr(op, err) // still refused when the call's deadline came
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// memberErr turns etcd's refusals of a membership change into coordd's.
func memberErr(op string, err error) error {
	e := rpctypes.Error(err)
	switch {
	case errors.Is(e, rpctypes.ErrMemberNotFound):
		return fmt.Errorf("%w (%s)", ErrMemberNotFound, op)
	case errors.Is(e, rpctypes.ErrMemberLearnerNotReady):
		return fmt.Errorf("%w: %s: the learner has not caught up with the leader yet; retry in a moment", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrTooManyLearners):
		return fmt.Errorf("%w: %s: the cluster has a learner already; promote or remove it first", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrMemberNotEnoughStarted):
		return fmt.Errorf("%w: %s: the members left would not have a quorum of started members; start the stopped members first", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrPeerURLExist):
		return fmt.Errorf("%w: %s: a member has that peer URL already", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrMemberNotLearner):
		return fmt.Errorf("%w: %s: it is a voting member already", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrUnhealthy):
		return fmt.Errorf("%w: %s: etcd's leader has not been connected to every voting member for the last 5 s (its check before any membership change); retry once every member is up", ErrChangeRefused, op)
	case errors.Is(e, rpctypes.ErrMemberBadURLs):
		return invalidf("cluster: %s: bad peer URL", op)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("cluster: %s: %w", op, err)
}

func invalidf(format string, args ...any) error {
	return errkind.Invalid.New(fmt.Sprintf(format, args...))
}

// Local measures the member this Manager reports on (the embedded member,
// or the first external endpoint): its raft position and database size.
func (m *Manager) Local(ctx context.Context) (Health, error) {
	_, h, err := m.measure(ctx, m.endpoint)
	return h, err
}
