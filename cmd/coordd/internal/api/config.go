package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/coordd/coordd/configcenter"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ConfigServer adapts configcenter's Store and Cache to
// coordd.v1.ConfigService.
type ConfigServer struct {
	coorddv1.UnsafeConfigServiceServer // compile errors when the service grows

	store   *configcenter.Store
	cache   *configcenter.Cache
	stopped context.Context // done once the daemon stops

	// recent holds the messages of the latest releases, so a release sent
	// to K watchers is converted once, not K times.
	mu     sync.Mutex
	recent [16]struct {
		rel *configcenter.Release
		msg *Encoded
	}
	next int
}

// NewConfigServer returns the ConfigService adapter. Watch streams end with
// ErrStopping once stopped is done.
func NewConfigServer(store *configcenter.Store, cache *configcenter.Cache, stopped context.Context) *ConfigServer {
	return &ConfigServer{store: store, cache: cache, stopped: stopped}
}

// changeMessage returns the (shared, read-only) message of a release,
// marshaled once for all its watchers.
func (s *ConfigServer) changeMessage(ev configcenter.Event) (*Encoded, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recent {
		if r.rel == ev.Release {
			return r.msg, nil
		}
	}
	msg, err := Encode(watchMessage(ev))
	if err != nil {
		return nil, err
	}
	s.recent[s.next].rel, s.recent[s.next].msg = ev.Release, msg
	s.next = (s.next + 1) % len(s.recent)
	return msg, nil
}

// Put implements ConfigService.
func (s *ConfigServer) Put(ctx context.Context, req *coorddv1.PutRequest) (*coorddv1.PutResponse, error) {
	r, err := s.store.Put(ctx, req.GetNamespace(), req.GetKey(), req.GetValue(), req.GetExpectedRevision(), req.GetAuthor(), req.GetMessage())
	if err != nil {
		return nil, err
	}
	return &coorddv1.PutResponse{Release: releaseProto(r)}, nil
}

// Delete implements ConfigService.
func (s *ConfigServer) Delete(ctx context.Context, req *coorddv1.DeleteRequest) (*coorddv1.DeleteResponse, error) {
	r, err := s.store.Delete(ctx, req.GetNamespace(), req.GetKey(), req.GetExpectedRevision(), req.GetAuthor(), req.GetMessage())
	if err != nil {
		return nil, err
	}
	return &coorddv1.DeleteResponse{Release: releaseProto(r)}, nil
}

// Publish implements ConfigService.
func (s *ConfigServer) Publish(ctx context.Context, req *coorddv1.PublishRequest) (*coorddv1.PublishResponse, error) {
	pr := configcenter.PublishRequest{
		Namespace: req.GetNamespace(), ExpectedRevision: req.GetExpectedRevision(),
		Author: req.GetAuthor(), Message: req.GetMessage(), DryRun: req.GetDryRun(),
	}
	for _, m := range req.GetMutations() {
		pr.Mutations = append(pr.Mutations, configcenter.Mutation{Key: m.GetKey(), Value: m.GetValue(), Delete: m.GetDelete()})
	}
	r, err := s.store.Publish(ctx, pr)
	if err != nil {
		return nil, err
	}
	return &coorddv1.PublishResponse{Release: releaseProto(r)}, nil
}

// Get implements ConfigService.
func (s *ConfigServer) Get(ctx context.Context, req *coorddv1.GetRequest) (*coorddv1.GetResponse, error) {
	e, rev, err := s.store.Get(ctx, req.GetNamespace(), req.GetKey(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetResponse{Key: e.Key, Value: e.Value, ModRevision: e.ModRevision, Revision: rev}, nil
}

// Snapshot implements ConfigService. A current read is served from the
// watch cache once the cache has reached etcd's current revision (read
// linearizably); a past revision, or a cache that lags, is read from etcd.
func (s *ConfigServer) Snapshot(ctx context.Context, req *coorddv1.SnapshotRequest) (*coorddv1.SnapshotResponse, error) {
	if req.GetRevision() == 0 {
		if err := configcenter.ValidateNamespace(req.GetNamespace()); err != nil {
			return nil, err
		}
		rev, err := s.store.CurrentRevision(ctx)
		if err != nil {
			return nil, err
		}
		if snap, err := s.cache.Snapshot(ctx, req.GetNamespace(), rev); err == nil {
			return &coorddv1.SnapshotResponse{Snapshot: snapshotProto(snap)}, nil
		}
	}
	snap, err := s.store.Snapshot(ctx, req.GetNamespace(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	return &coorddv1.SnapshotResponse{Snapshot: snapshotProto(snap)}, nil
}

// MaxPollWait bounds a long poll.
const MaxPollWait = 5 * time.Minute

// Poll implements ConfigService.
func (s *ConfigServer) Poll(ctx context.Context, req *coorddv1.PollRequest) (*coorddv1.PollResponse, error) {
	wait := 30 * time.Second
	if w := req.GetWait(); w != nil {
		if err := w.CheckValid(); err != nil || w.AsDuration() < 0 || w.AsDuration() > MaxPollWait {
			return nil, invalid("wait must be a duration from 0s to 5m (for example \"30s\")")
		}
		wait = w.AsDuration()
	}
	snap, modified, err := s.cache.Poll(ctx, req.GetNamespace(), req.GetAfterRevision(), wait)
	if err != nil {
		return nil, err
	}
	return &coorddv1.PollResponse{Modified: modified, Snapshot: snapshotProto(snap)}, nil
}

// ListReleases implements ConfigService.
func (s *ConfigServer) ListReleases(ctx context.Context, req *coorddv1.ListReleasesRequest) (*coorddv1.ListReleasesResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = 20
	case size < 0 || size > 100:
		return nil, invalid("page_size must be 1 to 100")
	}
	rels, err := s.store.Releases(ctx, req.GetNamespace(), req.GetBefore(), size)
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.ListReleasesResponse{}
	for _, r := range rels {
		resp.Releases = append(resp.Releases, releaseProto(r))
	}
	if len(rels) == size && rels[len(rels)-1].Number > 1 {
		resp.NextBefore = rels[len(rels)-1].Number
	}
	return resp, nil
}

// Diff implements ConfigService.
func (s *ConfigServer) Diff(ctx context.Context, req *coorddv1.DiffRequest) (*coorddv1.DiffResponse, error) {
	changes, err := s.store.Diff(ctx, req.GetNamespace(), req.GetFromRelease(), req.GetToRelease())
	if err != nil {
		return nil, err
	}
	return &coorddv1.DiffResponse{Changes: changesProto(changes)}, nil
}

// Rollback implements ConfigService.
func (s *ConfigServer) Rollback(ctx context.Context, req *coorddv1.RollbackRequest) (*coorddv1.RollbackResponse, error) {
	r, err := s.store.Rollback(ctx, req.GetNamespace(), req.GetToRelease(), req.GetExpectedRevision(), req.GetAuthor(), req.GetMessage())
	if err != nil {
		return nil, err
	}
	return &coorddv1.RollbackResponse{Release: releaseProto(r)}, nil
}

// GetSchema implements ConfigService.
func (s *ConfigServer) GetSchema(ctx context.Context, req *coorddv1.GetSchemaRequest) (*coorddv1.GetSchemaResponse, error) {
	schema, rev, err := s.store.Schema(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetSchemaResponse{Schema: schema, Revision: rev}, nil
}

// SetSchema implements ConfigService.
func (s *ConfigServer) SetSchema(ctx context.Context, req *coorddv1.SetSchemaRequest) (*coorddv1.SetSchemaResponse, error) {
	rev, err := s.store.SetSchema(ctx, req.GetNamespace(), req.GetSchema())
	if err != nil {
		return nil, err
	}
	return &coorddv1.SetSchemaResponse{Revision: rev}, nil
}

// ListNamespaces implements ConfigService.
func (s *ConfigServer) ListNamespaces(ctx context.Context, req *coorddv1.ListNamespacesRequest) (*coorddv1.ListNamespacesResponse, error) {
	nss, next, err := namesPage(req.GetPageSize(), req.GetPageToken(), func(after string, limit int) ([]string, error) {
		return s.store.Namespaces(ctx, req.GetPrefix(), after, limit)
	})
	if err != nil {
		return nil, err
	}
	return &coorddv1.ListNamespacesResponse{Namespaces: nss, NextPageToken: next}, nil
}

// Watch implements ConfigService.
func (s *ConfigServer) Watch(req *coorddv1.WatchRequest, stream coorddv1.ConfigService_WatchServer) error {
	// No goroutine per watch: an idle watcher costs only its stream.
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()
	sub, err := s.cache.Subscribe(ctx, req.GetNamespaces(), req.GetFromRevision())
	if err != nil {
		return stoppingOr(ctx, err)
	}
	defer sub.Close()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return stoppingOr(ctx, err)
		}
		var msg any = watchMessage(ev)
		if ev.Type == configcenter.EventChange {
			if msg, err = s.changeMessage(ev); err != nil {
				return err
			}
		}
		if err := stream.SendMsg(msg); err != nil {
			return err
		}
	}
}

// watchMessage is the message of a watch event.
func watchMessage(ev configcenter.Event) *coorddv1.WatchResponse {
	msg := &coorddv1.WatchResponse{Revision: ev.Revision}
	switch ev.Type {
	case configcenter.EventSnapshot:
		msg.Type, msg.ClusterId = coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT, strconv.FormatUint(ev.Cluster, 16)
		for _, snap := range ev.Snapshots {
			msg.Snapshots = append(msg.Snapshots, snapshotProto(snap))
		}
	case configcenter.EventChange:
		msg.Type, msg.Release = coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE, releaseProto(*ev.Release)
	default:
		msg.Type = coorddv1.WatchEventType_WATCH_EVENT_TYPE_BOOKMARK
	}
	return msg
}

// stoppingOr returns ErrStopping if that is why ctx ended, else err.
func stoppingOr(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), ErrStopping) {
		return ErrStopping
	}
	return err
}

func releaseProto(r configcenter.Release) *coorddv1.ConfigRelease {
	out := &coorddv1.ConfigRelease{
		Namespace:  r.Namespace,
		Number:     r.Number,
		Revision:   r.Revision,
		Author:     r.Author,
		Message:    r.Message,
		RollbackOf: r.RollbackOf,
		Changes:    changesProto(r.Changes),
	}
	if !r.Time.IsZero() {
		out.Time = timestamppb.New(r.Time)
	}
	return out
}

func changesProto(cs []configcenter.Change) []*coorddv1.ConfigChange {
	out := make([]*coorddv1.ConfigChange, 0, len(cs))
	for _, c := range cs {
		out = append(out, &coorddv1.ConfigChange{Key: c.Key, OldValue: c.Old, NewValue: c.New})
	}
	return out
}

func snapshotProto(s configcenter.Snapshot) *coorddv1.NamespaceSnapshot {
	out := &coorddv1.NamespaceSnapshot{Namespace: s.Namespace, Release: s.Release, Revision: s.Revision, ChangedRevision: s.Changed}
	keys := make([]string, 0, len(s.Content))
	for k := range s.Content {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out.Entries = append(out.Entries, &coorddv1.ConfigEntry{Key: k, Value: s.Content[k]})
	}
	return out
}

// ReportStatus implements ConfigService.
func (s *ConfigServer) ReportStatus(ctx context.Context, req *coorddv1.ReportStatusRequest) (*coorddv1.ReportStatusResponse, error) {
	if len(req.GetNamespaces()) == 0 || len(req.GetNamespaces()) > configcenter.MaxNamespacesPerWatch {
		return nil, invalid("report 1 to 64 namespaces")
	}
	for _, n := range req.GetNamespaces() {
		st := configcenter.InstanceStatus{Instance: req.GetInstance(), Labels: req.GetLabels(), Applied: n.GetAppliedRelease(), Rejected: n.GetRejectedRelease(), Reason: n.GetReason()}
		if err := s.store.ReportStatus(ctx, n.GetNamespace(), st); err != nil {
			return nil, err
		}
	}
	return &coorddv1.ReportStatusResponse{}, nil
}

// GetApplyStatus implements ConfigService.
func (s *ConfigServer) GetApplyStatus(ctx context.Context, req *coorddv1.GetApplyStatusRequest) (*coorddv1.GetApplyStatusResponse, error) {
	st, err := s.store.ApplyStatus(ctx, req.GetNamespace())
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.GetApplyStatusResponse{}
	for _, in := range st.Instances {
		resp.Instances = append(resp.Instances, &coorddv1.InstanceApplyStatus{
			Instance: in.Instance, Labels: in.Labels, AppliedRelease: in.Applied, RejectedRelease: in.Rejected,
			Reason: in.Reason, ReportTime: timestamppb.New(in.Time),
		})
	}
	counts := func(m map[int64]int) []*coorddv1.ReleaseCount {
		var out []*coorddv1.ReleaseCount
		for r, n := range m {
			out = append(out, &coorddv1.ReleaseCount{Release: r, Instances: int32(n)})
		}
		slices.SortFunc(out, func(a, b *coorddv1.ReleaseCount) int { return int(b.GetRelease() - a.GetRelease()) })
		return out
	}
	resp.Applied, resp.Rejected = counts(st.Applied), counts(st.Rejected)
	return resp, nil
}

// WatchMany implements ConfigService: many watches on one stream, served by
// this one goroutine (plus a reader of the client's requests), so an idle
// watch costs the server its subscription, not a stream. Each round takes
// at most one event from every watch and sends a release shared by
// several watches once, so every watch still gets its events in order.
func (s *ConfigServer) WatchMany(stream coorddv1.ConfigService_WatchManyServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()

	// The reader never waits for this goroutine (which may be blocked in
	// Send on a slow client): requests queue up, so the two sides can never
	// wait on each other's flow-control windows.
	var (
		qmu      sync.Mutex
		queue    []*coorddv1.WatchManyRequest
		reqReady = make(chan struct{}, 1)
		recvErr  = make(chan error, 1)
	)
	go func() { // exits when the stream ends: Recv fails then
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			qmu.Lock()
			full := len(queue) >= maxQueuedRequests
			if !full {
				queue = append(queue, req)
			}
			qmu.Unlock()
			if full {
				recvErr <- invalid(fmt.Sprintf("more than %d WatchMany requests waiting; send fewer at once", maxQueuedRequests))
				return
			}
			select {
			case reqReady <- struct{}{}:
			default:
			}
		}
	}()

	notify := make(chan struct{}, 1)
	subs := map[int64]*configcenter.Subscription{}
	defer func() {
		for _, sub := range subs {
			sub.Close()
		}
	}()
	ticker := time.NewTicker(s.cache.BookmarkInterval())
	defer ticker.Stop()
	for {
		bookmarks := false
		select {
		case <-ctx.Done():
			return stoppingOr(ctx, ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-reqReady:
			qmu.Lock()
			batch := queue
			queue = nil
			qmu.Unlock()
			for _, req := range batch {
				if err := s.watchManyRequest(ctx, stream, req, subs, notify); err != nil {
					return err
				}
			}
		case <-notify:
		case <-ticker.C:
			bookmarks = true
		}
		more, err := s.drain(stream, subs, bookmarks)
		if err != nil {
			return err
		}
		if more { // let requests in between long runs of events
			select {
			case notify <- struct{}{}:
			default:
			}
		}
	}
}

// maxQueuedRequests bounds the WatchMany requests waiting to be handled.
const maxQueuedRequests = 10000

// maxDrainRounds bounds one drain, so requests are handled between long
// runs of events.
const maxDrainRounds = 64

func (s *ConfigServer) watchManyRequest(ctx context.Context, stream coorddv1.ConfigService_WatchManyServer, req *coorddv1.WatchManyRequest,
	subs map[int64]*configcenter.Subscription, notify chan struct{}) error {
	if st := req.GetStop(); st != nil {
		if sub := subs[st.GetWatchId()]; sub != nil {
			sub.Close()
			delete(subs, st.GetWatchId())
		}
		return nil
	}
	start := req.GetStart()
	if start == nil {
		return invalid("a WatchMany request needs start or stop")
	}
	if old := subs[start.GetWatchId()]; old != nil { // a restart of the same watch
		old.Close()
		delete(subs, start.GetWatchId())
	}
	sub, err := s.cache.SubscribeNotify(ctx, start.GetNamespaces(), start.GetFromRevision(), notify)
	if err != nil {
		st, _ := ToStatus(err)
		reason := ""
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
			}
		}
		return stream.Send(&coorddv1.WatchManyResponse{WatchIds: []int64{start.GetWatchId()}, ErrorReason: reason, ErrorMessage: st.Message()})
	}
	subs[start.GetWatchId()] = sub
	select {
	case notify <- struct{}{}: // greet it: its first event is due now
	default:
	}
	return nil
}

// drain sends the due events of every watch, in rounds of at most one
// event per watch, a release shared by several watches once. It reports
// whether events may remain (it stopped after maxDrainRounds).
func (s *ConfigServer) drain(stream coorddv1.ConfigService_WatchManyServer, subs map[int64]*configcenter.Subscription, bookmarks bool) (bool, error) {
	ids := make([]int64, 0, len(subs))
	for id := range subs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for round := 0; ; round++ {
		if round == maxDrainRounds {
			return true, nil
		}
		type group struct {
			ids []int64
			ev  configcenter.Event
		}
		var changes []*group
		byRelease := map[*configcenter.Release]*group{}
		marks := map[int64][]int64{} // bookmark revision -> watches
		var markRevs []int64
		sent := false
		for _, id := range ids {
			ev, ok := subs[id].TryNext(bookmarks)
			if !ok {
				continue
			}
			sent = true
			switch ev.Type {
			case configcenter.EventChange:
				if g := byRelease[ev.Release]; g != nil {
					g.ids = append(g.ids, id)
				} else {
					g := &group{ids: []int64{id}, ev: ev}
					byRelease[ev.Release] = g
					changes = append(changes, g)
				}
			case configcenter.EventBookmark:
				// Grouped by revision: a bookmark must not claim a revision
				// beyond what its own watch had been sent.
				if marks[ev.Revision] == nil {
					markRevs = append(markRevs, ev.Revision)
				}
				marks[ev.Revision] = append(marks[ev.Revision], id)
			default:
				if err := stream.Send(&coorddv1.WatchManyResponse{WatchIds: []int64{id}, Event: watchMessage(ev)}); err != nil {
					return false, err
				}
			}
		}
		for _, g := range changes {
			if err := stream.Send(&coorddv1.WatchManyResponse{WatchIds: g.ids, Event: watchMessage(g.ev)}); err != nil {
				return false, err
			}
		}
		for _, rev := range markRevs {
			msg := watchMessage(configcenter.Event{Type: configcenter.EventBookmark, Revision: rev})
			if err := stream.Send(&coorddv1.WatchManyResponse{WatchIds: marks[rev], Event: msg}); err != nil {
				return false, err
			}
		}
		if !sent {
			return false, nil
		}
		bookmarks = false
	}
}
