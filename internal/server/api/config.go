package api

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/keyring"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// ConfigServer adapts configcenter's Store and Cache to
// coordd.v1.ConfigService.
type ConfigServer struct {
	coorddv1.UnsafeConfigServiceServer // compile errors when the service grows

	store   *configcenter.Store
	cache   *configcenter.Cache
	stopped context.Context // done once the daemon stops
	metrics *Metrics

	// The rest: see ConfigOptions' fields of the same names.
	mayReadSecrets func(ctx context.Context, ns string) bool
	mayRead        func(ctx context.Context, ns string) bool
	subscriptions  *PerPrincipal

	// recent holds the messages of the latest releases, so a release sent
	// to K watchers is converted once, not K times.
	mu     sync.Mutex
	recent [16]struct {
		rel *configcenter.Release
		msg *Encoded
	}
	next int
}

// ConfigOptions is what a ConfigServer is built from (NewConfigServer).
type ConfigOptions struct {
	// Stopped is done once the daemon stops, which ends Watch streams
	// with ErrStopping; required.
	Stopped context.Context
	// Store is the config store served; required.
	Store *configcenter.Store
	// Cache is the member's cache of the store, which snapshots, polls
	// and watches read; required.
	Cache *configcenter.Cache
	// Metrics counts what the adapter serves; nil: nothing is counted.
	Metrics *Metrics
	// MayReadSecrets says whether the caller may read a namespace's
	// secrets (config.read-secret): setting the schema of a namespace
	// that holds secrets needs it, since a schema's verdict on the
	// content tells of the secrets in it. nil: every caller may.
	MayReadSecrets func(ctx context.Context, ns string) bool
	// MayRead says whether the caller may read a namespace (config.read):
	// making a namespace inherit from a shared one needs it on the shared
	// one, whose content the heir then shows. nil: every caller may.
	MayRead func(ctx context.Context, ns string) bool
	// Subscriptions bounds each principal's config watches on this
	// member: a Watch stream is one, each live watch of a WatchMany
	// stream one. nil: no bound.
	Subscriptions *PerPrincipal
}

// NewConfigServer returns the ConfigService adapter.
func NewConfigServer(o ConfigOptions) *ConfigServer {
	return &ConfigServer{
		store: o.Store, cache: o.Cache, stopped: o.Stopped, metrics: o.Metrics,
		mayReadSecrets: o.MayReadSecrets, mayRead: o.MayRead, subscriptions: o.Subscriptions,
	}
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
	r, err := s.store.Publish(ctx, configcenter.PublishRequest{
		Namespace: req.GetNamespace(), Mutations: []configcenter.Mutation{{Key: req.GetKey(), Value: req.GetValue(), Secret: req.GetSecret()}},
		ExpectedRevision: req.GetExpectedRevision(), Author: author(ctx, req.GetAuthor()), Message: req.GetMessage(),
	})
	if err != nil {
		return nil, err
	}
	if len(r.Changes) > 0 { // else nothing changed and no release was made
		s.metrics.released("put")
	}
	return &coorddv1.PutResponse{Release: releaseProto(r)}, nil
}

// Delete implements ConfigService.
func (s *ConfigServer) Delete(ctx context.Context, req *coorddv1.DeleteRequest) (*coorddv1.DeleteResponse, error) {
	r, err := s.store.Delete(ctx, req.GetNamespace(), req.GetKey(), req.GetExpectedRevision(), author(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	if len(r.Changes) > 0 {
		s.metrics.released("delete")
	}
	return &coorddv1.DeleteResponse{Release: releaseProto(r)}, nil
}

// Publish implements ConfigService.
func (s *ConfigServer) Publish(ctx context.Context, req *coorddv1.PublishRequest) (*coorddv1.PublishResponse, error) {
	pr := configcenter.PublishRequest{
		Namespace: req.GetNamespace(), ExpectedRevision: req.GetExpectedRevision(),
		Author: author(ctx, req.GetAuthor()), Message: req.GetMessage(), DryRun: req.GetDryRun(),
	}
	for _, m := range req.GetMutations() {
		pr.Mutations = append(pr.Mutations, configcenter.Mutation{Key: m.GetKey(), Value: m.GetValue(), Delete: m.GetDelete(), Secret: m.GetSecret()})
	}
	r, err := s.store.Publish(ctx, pr)
	if err != nil {
		return nil, err
	}
	if !pr.DryRun && len(r.Changes) > 0 {
		s.metrics.released("publish")
	}
	return &coorddv1.PublishResponse{Release: releaseProto(r)}, nil
}

// Get implements ConfigService.
func (s *ConfigServer) Get(ctx context.Context, req *coorddv1.GetRequest) (*coorddv1.GetResponse, error) {
	e, rev, err := s.store.Get(ctx, req.GetNamespace(), req.GetKey(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	resp := &coorddv1.GetResponse{Key: e.Key, Value: e.Value, ModRevision: e.ModRevision, Revision: rev, Secret: keyring.IsSealed(e.Value)}
	if resp.Secret {
		resp.Value = ""
		if req.GetRevealSecrets() {
			if resp.Value, err = s.store.OpenValue(ctx, req.GetNamespace(), e.Key, e.Value); err != nil {
				return nil, err
			}
		}
	}
	return resp, nil
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
			out, err := s.snapshotFor(ctx, snap, req.GetRevealSecrets())
			return &coorddv1.SnapshotResponse{Snapshot: out}, err
		}
	}
	snap, err := s.store.Snapshot(ctx, req.GetNamespace(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	out, err := s.snapshotFor(ctx, snap, req.GetRevealSecrets())
	return &coorddv1.SnapshotResponse{Snapshot: out}, err
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
	out, err := s.snapshotFor(ctx, snap, req.GetRevealSecrets())
	return &coorddv1.PollResponse{Modified: modified, Snapshot: out}, err
}

// ListReleases implements ConfigService.
func (s *ConfigServer) ListReleases(ctx context.Context, req *coorddv1.ListReleasesRequest) (*coorddv1.ListReleasesResponse, error) {
	size, err := pageSizeOf(req.GetPageSize(), defaultReleasePageSize, maxReleasePageSize)
	if err != nil {
		return nil, err
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
	changes, err := s.store.DiffRefs(ctx, req.GetNamespace(),
		configcenter.Ref{Number: req.GetFromRelease(), Gray: req.GetFromGray()}, configcenter.Ref{Number: req.GetToRelease(), Gray: req.GetToGray()})
	if err != nil {
		return nil, err
	}
	return &coorddv1.DiffResponse{Changes: changesProto(changes)}, nil
}

// Rollback implements ConfigService.
func (s *ConfigServer) Rollback(ctx context.Context, req *coorddv1.RollbackRequest) (*coorddv1.RollbackResponse, error) {
	r, err := s.store.Rollback(ctx, req.GetNamespace(), req.GetToRelease(), req.GetExpectedRevision(), author(ctx, req.GetAuthor()), req.GetMessage())
	if err != nil {
		return nil, err
	}
	s.metrics.released("rollback")
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
	if s.mayReadSecrets != nil && req.GetSchema() != "" && !s.mayReadSecrets(ctx, req.GetNamespace()) {
		holds, err := s.store.HoldsSecrets(ctx, req.GetNamespace())
		if err != nil {
			return nil, err
		}
		if holds {
			return nil, errkind.PermissionDenied.New("auth: " + strconv.Quote(req.GetNamespace()) + " holds secrets, and whether they match a schema tells of them: setting its schema needs config.read-secret too")
		}
	}
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
	release, err := s.subscriptions.take(ctx, 1)
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.cache.SubscribeAs(ctx, req.GetNamespaces(), req.GetFromRevision(), identityFrom(req.GetInstance(), req.GetLabels()))
	if err != nil {
		return stoppingOr(ctx, err)
	}
	defer sub.Close()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return stoppingOr(ctx, err)
		}
		msg, err := s.eventMessage(ctx, ev, req.GetRevealSecrets())
		if err != nil {
			return err
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
		msg.Type, msg.Release, msg.Gray = coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE, releaseProto(*ev.Release), ev.Gray
	default:
		msg.Type = coorddv1.WatchEventType_WATCH_EVENT_TYPE_BOOKMARK
	}
	return msg
}

// stoppingOr returns ErrStopping if that is why ctx ended, else err.
// untilStopped is ctx, ended with cause ErrStopping once stopped is done:
// a waiting acquisition or campaign answers UNAVAILABLE, which its client
// retries, when the daemon stops, and keeps its place in the queue for that
// retry (queue.Abandoned).
func untilStopped(ctx, stopped context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(stopped, func() { cancel(ErrStopping) })
	return ctx, func() { stop(); cancel(nil) }
}

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

		PromotedGray: r.PromotedGray,
		Proposal:     r.Proposal,
		ProposedBy:   r.ProposedBy,
		ApprovedBy:   r.ApprovedBy,

		InheritedFrom:    r.InheritedFrom,
		InheritedRelease: r.InheritedRelease,
	}
	if !r.Time.IsZero() {
		out.Time = timestamppb.New(r.Time)
	}
	return out
}

// changesProto is the message of changes; a secret's values are left
// empty.
func changesProto(cs []configcenter.Change) []*coorddv1.ConfigChange {
	out := make([]*coorddv1.ConfigChange, 0, len(cs))
	for _, c := range cs {
		m := &coorddv1.ConfigChange{Key: c.Key, OldValue: c.Old, NewValue: c.New}
		if (c.Old != nil && keyring.IsSealed(*c.Old)) || (c.New != nil && keyring.IsSealed(*c.New)) {
			m.Secret = true
			if c.Old != nil {
				m.OldValue = new(string)
			}
			if c.New != nil {
				m.NewValue = new(string)
			}
		}
		out = append(out, m)
	}
	return out
}

// snapshotProto is the message of a snapshot; a secret's value is left
// empty.
func snapshotProto(s configcenter.Snapshot) *coorddv1.NamespaceSnapshot {
	out := &coorddv1.NamespaceSnapshot{Namespace: s.Namespace, Release: s.Release, Revision: s.Revision, ChangedRevision: s.Changed, Gray: s.Gray, Inherits: s.Inherits,
		InheritanceSuspended: s.InheritanceSuspended}
	keys := make([]string, 0, len(s.Content))
	for k := range s.Content {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		e := &coorddv1.ConfigEntry{Key: k, Value: s.Content[k], Inherited: s.Inherited[k]}
		if keyring.IsSealed(e.Value) {
			e.Value, e.Secret = "", true
		}
		out.Entries = append(out.Entries, e)
	}
	return out
}

// ReportStatus implements ConfigService.
func (s *ConfigServer) ReportStatus(ctx context.Context, req *coorddv1.ReportStatusRequest) (*coorddv1.ReportStatusResponse, error) {
	if len(req.GetNamespaces()) == 0 || len(req.GetNamespaces()) > configcenter.MaxNamespacesPerWatch {
		return nil, invalid("report 1 to 64 namespaces")
	}
	for _, n := range req.GetNamespaces() {
		st := configcenter.InstanceStatus{
			Instance: req.GetInstance(), Labels: req.GetLabels(), Applied: n.GetAppliedRelease(), Rejected: n.GetRejectedRelease(), Reason: n.GetReason(),
			AppliedGray: n.GetAppliedGray(), RejectedGray: n.GetRejectedGray(),
		}
		if err := s.store.ReportStatus(ctx, n.GetNamespace(), st); err != nil {
			return nil, err
		}
	}
	s.metrics.statusReported()
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
			Reason: in.Reason, ReportTime: timestamppb.New(in.Time), AppliedGray: in.AppliedGray, RejectedGray: in.RejectedGray,
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
	resp.AppliedGray, resp.RejectedGray = counts(st.AppliedGray), counts(st.RejectedGray)
	return resp, nil
}

// WatchMany implements ConfigService: many watches on one stream, served by
// a configcenter.WatchMux (which holds the rounds, the batching and the
// queue of requests) from this one goroutine, plus a reader of the
// client's requests.
func (s *ConfigServer) WatchMany(stream coorddv1.ConfigService_WatchManyServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()
	mux := configcenter.NewWatchMux(s.cache)
	defer mux.Close()
	// The reader never waits for this goroutine (which may be blocked in
	// Send on a slow client): the mux queues requests, so the two sides can
	// never wait on each other's flow-control windows.
	recvErr := make(chan error, 1)
	subs := &subscriptions{ctx: ctx, q: s.subscriptions}
	go func() { // exits when the stream ends: Recv fails then
		recvErr <- readWatchMany(stream, mux, subs)
		subs.close()
		cancel(errRecvEnded)
	}()
	for {
		b, err := mux.Next(ctx)
		if err != nil {
			if errors.Is(context.Cause(ctx), errRecvEnded) {
				if err := <-recvErr; !errors.Is(err, io.EOF) {
					return err
				}
				return nil
			}
			return stoppingOr(ctx, err)
		}
		if err := s.sendWatchMany(ctx, stream, b, mux); err != nil {
			return err
		}
	}
}

// sendWatchMany sends a batch: one message, or, when its event carries
// secrets and some of its watches reveal them, one message for those
// watches with the secrets opened and one for the rest without.
func (s *ConfigServer) sendWatchMany(ctx context.Context, stream coorddv1.ConfigService_WatchManyServer, b configcenter.WatchBatch, mux *configcenter.WatchMux) error {
	if b.Err != nil || !eventHasSecrets(b.Event) {
		return stream.Send(watchManyMessage(b))
	}
	var reveal, other []int64
	for _, id := range b.IDs {
		if mux.Revealing(id) {
			reveal = append(reveal, id)
		} else {
			other = append(other, id)
		}
	}
	if len(other) > 0 {
		if err := stream.Send(&coorddv1.WatchManyResponse{WatchIds: other, Event: watchMessage(b.Event)}); err != nil {
			return err
		}
	}
	if len(reveal) == 0 {
		return nil
	}
	msg, err := s.revealedMessage(ctx, b.Event)
	if err != nil {
		// Those watches cannot be served here: they end (the client hears
		// why), the others go on.
		for _, id := range reveal {
			_ = mux.Stop(id)
		}
		st, _ := ToStatus(err)
		return stream.Send(&coorddv1.WatchManyResponse{WatchIds: reveal, ErrorReason: reasonOf(st), ErrorMessage: st.Message()})
	}
	return stream.Send(&coorddv1.WatchManyResponse{WatchIds: reveal, Event: msg})
}

// errRecvEnded ends a WatchMany stream whose reader stopped.
var errRecvEnded = errors.New("api: WatchMany requests ended")

// readWatchMany hands the client's requests to mux until Recv fails or a
// request is malformed (or one too many).
func readWatchMany(stream coorddv1.ConfigService_WatchManyServer, mux *configcenter.WatchMux, subs *subscriptions) error {
	for {
		req, err := stream.Recv()
		var refused *MessageRefused
		if errors.As(err, &refused) {
			// This start alone is refused; the stream's other watches go on.
			start, _ := refused.Msg.(*coorddv1.WatchManyRequest)
			if start.GetStart() == nil {
				return err // only a start names anything to refuse
			}
			if err := mux.Refuse(start.GetStart().GetWatchId(), refused.Err); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case req.GetStop() != nil:
			subs.stop(req.GetStop().GetWatchId())
			err = mux.Stop(req.GetStop().GetWatchId())
		case req.GetStart() != nil:
			st := req.GetStart()
			if qerr := subs.start(st.GetWatchId()); qerr != nil {
				err = mux.Refuse(st.GetWatchId(), qerr) // this start alone
				break
			}
			start := mux.Start
			if st.GetRevealSecrets() { // the interceptor has let it: config.read-secret
				start = mux.StartRevealing
			}
			err = start(st.GetWatchId(), st.GetNamespaces(), st.GetFromRevision(), identityFrom(st.GetInstance(), st.GetLabels()))
		default:
			err = invalid("a WatchMany request needs start or stop")
		}
		if err != nil {
			return err
		}
	}
}

// watchManyMessage is the message of a batch: its event, or why its watch
// could not start.
func watchManyMessage(b configcenter.WatchBatch) *coorddv1.WatchManyResponse {
	if b.Err == nil {
		return &coorddv1.WatchManyResponse{WatchIds: b.IDs, Event: watchMessage(b.Event)}
	}
	st, _ := ToStatus(b.Err)
	return &coorddv1.WatchManyResponse{WatchIds: b.IDs, ErrorReason: reasonOf(st), ErrorMessage: st.Message()}
}

// reasonOf is the ErrorInfo reason of a status, if it has one.
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// author is what a release records as its author: the authenticated
// principal when there is one, with the free-text author the caller gave
// kept beside it ("payments (deploy-bot)"); else the free text alone.
func author(ctx context.Context, given string) string {
	p := PrincipalFrom(ctx).Name
	switch {
	case p == "":
		return given
	case given == "" || given == p:
		return p
	}
	return p + " (" + given + ")"
}
