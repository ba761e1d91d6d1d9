package clientlib

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/coordd/coordd/fencing"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The calls below act on sessions, locks and elections by id, token and
// term, without keeping anything alive: for tools (coordctl) and for
// programs that manage sessions themselves. Prefer NewSession, Lock and
// Campaign, which keep the session alive and track loss.

// CreateSession creates a session that nobody keeps alive: it ends after
// ttl unless KeepAliveSession renews it.
func (c *Client) CreateSession(ctx context.Context, ttl time.Duration, owner, hostname string, labels map[string]string) (SessionInfo, error) {
	resp, err := c.sessions.CreateSession(ctx, &coorddv1.CreateSessionRequest{Ttl: durationpb.New(ttl), Owner: owner, Hostname: hostname, Labels: labels})
	if err != nil {
		return SessionInfo{}, convert(ctx, err)
	}
	return sessionInfo(resp.GetSession()), nil
}

// KeepAliveSession renews a session once and returns the TTL granted.
func (c *Client) KeepAliveSession(ctx context.Context, id string) (time.Duration, error) {
	resp, err := c.sessions.KeepAlive(ctx, &coorddv1.KeepAliveRequest{SessionId: id})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return resp.GetTtl().AsDuration(), nil
}

// LockGrant is a grant made to a session by id.
type LockGrant struct {
	Name      string
	Token     fencing.Token
	SessionID string
	RequestID string
	Revision  int64
}

// AcquireLock takes a lock for the session sessionID (which the caller
// keeps alive), waiting as long as ctx allows, or not at all with try.
func (c *Client) AcquireLock(ctx context.Context, sessionID, name string, try bool, opts ...LockOption) (LockGrant, error) {
	o := lockOptions{limit: 1}
	for _, opt := range opts {
		opt(&o)
	}
	g, err := c.acquire(ctx, sessionID, name, !try, o)
	if err != nil {
		return LockGrant{}, convert(ctx, err)
	}
	return LockGrant{Name: g.GetName(), Token: fencing.Token(g.GetToken()), SessionID: g.GetSessionId(), RequestID: g.GetRequestId(), Revision: g.GetRevision()}, nil
}

// ReleaseLock gives up the grant that token names; ErrNotHolder if it
// holds nothing.
func (c *Client) ReleaseLock(ctx context.Context, name string, token fencing.Token) error {
	_, err := c.locks.Release(ctx, &coorddv1.ReleaseRequest{Name: name, Token: int64(token)})
	return convert(ctx, err)
}

// ListLocks returns the names of locks with holders or waiters that start
// with prefix.
func (c *Client) ListLocks(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := c.locks.ListLocks(ctx, &coorddv1.ListLocksRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNames(), resp.GetNextPageToken(), err
	})
}

// ListElections returns the names of elections with a leader or candidates
// that start with prefix.
func (c *Client) ListElections(ctx context.Context, prefix string) ([]string, error) {
	return allNames(ctx, func(token string) ([]string, string, error) {
		resp, err := c.elections.ListElections(ctx, &coorddv1.ListElectionsRequest{Prefix: prefix, PageSize: 1000, PageToken: token})
		return resp.GetNames(), resp.GetNextPageToken(), err
	})
}

// CampaignAs campaigns for the session sessionID (which the caller keeps
// alive) and returns the term once it leads.
func (c *Client) CampaignAs(ctx context.Context, sessionID, name, value string) (fencing.Token, error) {
	resp, err := c.elections.Campaign(ctx, &coorddv1.CampaignRequest{Name: name, SessionId: sessionID, Value: value, RequestId: randomID()})
	if err != nil {
		return 0, convert(ctx, err)
	}
	return fencing.Token(resp.GetLeadership().GetTerm()), nil
}

// ProclaimTerm replaces the value of the leader whose term is term.
func (c *Client) ProclaimTerm(ctx context.Context, name string, term fencing.Token, value string) error {
	_, err := c.elections.Proclaim(ctx, &coorddv1.ProclaimRequest{Name: name, Term: int64(term), Value: value})
	return convert(ctx, err)
}

// ResignTerm ends the leadership whose term is term.
func (c *Client) ResignTerm(ctx context.Context, name string, term fencing.Token) error {
	_, err := c.elections.Resign(ctx, &coorddv1.ResignRequest{Name: name, Term: int64(term)})
	return convert(ctx, err)
}

// ClusterMember is one etcd member.
type ClusterMember struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerUrls,omitempty"`
	ClientURLs []string `json:"clientUrls,omitempty"`
	Leader     bool     `json:"leader,omitempty"`
	Learner    bool     `json:"learner,omitempty"`
}

// ClusterStatus describes the cluster as the answering member sees it.
type ClusterStatus struct {
	ClusterID     string          `json:"clusterId,omitempty"`
	MemberID      string          `json:"memberId,omitempty"` // the answering member (empty with an external etcd)
	LeaderID      string          `json:"leaderId,omitempty"`
	Members       []ClusterMember `json:"members,omitempty"`
	Revision      int64           `json:"revision,omitempty"`
	RaftTerm      uint64          `json:"raftTerm,omitempty"`
	DBSize        int64           `json:"dbSize,omitempty"`
	DBSizeInUse   int64           `json:"dbSizeInUse,omitempty"`
	EtcdVersion   string          `json:"etcdVersion,omitempty"`
	CoorddVersion string          `json:"coorddVersion,omitempty"`
}

// ClusterStatus describes the cluster.
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	resp, err := c.cluster.GetClusterStatus(ctx, &coorddv1.GetClusterStatusRequest{})
	if err != nil {
		return ClusterStatus{}, convert(ctx, err)
	}
	st := ClusterStatus{ClusterID: resp.GetClusterId(), MemberID: resp.GetMemberId(), LeaderID: resp.GetLeaderId(), Revision: resp.GetRevision(), RaftTerm: resp.GetRaftTerm(),
		DBSize: resp.GetDbSizeBytes(), DBSizeInUse: resp.GetDbSizeInUseBytes(), EtcdVersion: resp.GetEtcdVersion(), CoorddVersion: resp.GetCoorddVersion()}
	for _, m := range resp.GetMembers() {
		st.Members = append(st.Members, ClusterMember{ID: m.GetId(), Name: m.GetName(), PeerURLs: m.GetPeerUrls(), ClientURLs: m.GetClientUrls(), Leader: m.GetIsLeader(), Learner: m.GetIsLearner()})
	}
	return st, nil
}

// SaveSnapshot writes a backup of etcd's database to w and returns its
// size. Restore it with etcdutl snapshot restore --bump-revision …
// --mark-compacted, so fencing tokens never go backwards.
func (c *Client) SaveSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	st, err := c.cluster.SaveSnapshot(ctx, &coorddv1.SaveSnapshotRequest{})
	if err != nil {
		return 0, convert(ctx, err)
	}
	var n int64
	for {
		chunk, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, convert(ctx, err)
		}
		m, err := w.Write(chunk.GetData())
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
}

// ConfigWatchEvent is one message of a config watch.
type ConfigWatchEvent struct {
	Type      string // "SNAPSHOT", "CHANGE" or "BOOKMARK"
	Revision  int64
	Snapshots []NamespaceSnapshot // SNAPSHOT
	Release   *ConfigRelease      // CHANGE
}

// WatchConfig streams a config watch's messages as they come, from
// revision from (0: a snapshot first), until ctx ends or fn fails. It
// does not reconnect; Subscribe does.
func (c *Client) WatchConfig(ctx context.Context, namespaces []string, from int64, fn func(ConfigWatchEvent) error) error {
	st, err := c.config.Watch(ctx, &coorddv1.WatchRequest{Namespaces: namespaces, FromRevision: from})
	if err != nil {
		return convert(ctx, err)
	}
	for {
		msg, err := st.Recv()
		if err != nil {
			return convert(ctx, err)
		}
		ev := ConfigWatchEvent{Revision: msg.GetRevision()}
		switch msg.GetType() {
		case coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT:
			ev.Type = "SNAPSHOT"
			for _, s := range msg.GetSnapshots() {
				ns := NamespaceSnapshot{Namespace: s.GetNamespace(), Release: s.GetRelease(), Revision: s.GetRevision(), Changed: s.GetChangedRevision(), Values: map[string]string{}}
				for _, e := range s.GetEntries() {
					ns.Values[e.GetKey()] = e.GetValue()
				}
				ev.Snapshots = append(ev.Snapshots, ns)
			}
		case coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE:
			ev.Type = "CHANGE"
			r := releaseFrom(msg.GetRelease())
			ev.Release = &r
		default:
			ev.Type = "BOOKMARK"
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// allNames gathers the pages page returns, from the first (token "") to
// the one with no next token.
func allNames(ctx context.Context, page func(token string) ([]string, string, error)) ([]string, error) {
	var out []string
	token := ""
	for {
		names, next, err := page(token)
		if err != nil {
			return nil, convert(ctx, err)
		}
		out = append(out, names...)
		if token = next; token == "" {
			return out, nil
		}
	}
}
