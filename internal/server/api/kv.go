package api

import (
	"context"

	"github.com/coordd/coordd/internal/kv"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// KVServer implements coorddv1.KVServiceServer over kv.Store: reads of the
// keys fenced writes wrote.
type KVServer struct {
	coorddv1.UnimplementedKVServiceServer
	store   *kv.Store
	stopped context.Context // done once the daemon stops
}

// NewKVServer returns a KVServer. Watches end with ErrStopping once stopped
// is done.
func NewKVServer(stopped context.Context, store *kv.Store) *KVServer {
	return &KVServer{store: store, stopped: stopped}
}

// GetKV implements KVService.
func (s *KVServer) GetKV(ctx context.Context, req *coorddv1.GetKVRequest) (*coorddv1.GetKVResponse, error) {
	e, rev, err := s.store.Get(ctx, req.GetKey(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	return &coorddv1.GetKVResponse{Kv: kvProto(e), Revision: rev}, nil
}

// ListKV implements KVService.
func (s *KVServer) ListKV(ctx context.Context, req *coorddv1.ListKVRequest) (*coorddv1.ListKVResponse, error) {
	p, err := s.store.List(ctx, req.GetPrefix(), req.GetPageToken(), int(req.GetPageSize()), req.GetRevision(), req.GetKeysOnly())
	if err != nil {
		return nil, err
	}
	out := &coorddv1.ListKVResponse{NextPageToken: p.Next, Revision: p.Revision}
	for _, e := range p.KVs {
		out.Kvs = append(out.Kvs, kvProto(e))
	}
	return out, nil
}

// WatchKV implements KVService.
func (s *KVServer) WatchKV(req *coorddv1.WatchKVRequest, stream coorddv1.KVService_WatchKVServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopped, func() { cancel(ErrStopping) })
	defer stop()
	err := s.store.Watch(ctx, req.GetPrefix(), req.GetFromRevision(), func(events []kv.Event, rev int64) error {
		msg := &coorddv1.WatchKVResponse{Revision: rev}
		for _, ev := range events {
			t := coorddv1.KVEventType_KV_EVENT_TYPE_PUT
			if ev.Deleted {
				t = coorddv1.KVEventType_KV_EVENT_TYPE_DELETE
			}
			msg.Events = append(msg.Events, &coorddv1.KVEvent{Type: t, Kv: kvProto(ev.KV)})
		}
		return stream.Send(msg)
	})
	return stoppingOr(ctx, err)
}

func kvProto(e kv.KeyValue) *coorddv1.KeyValue {
	return &coorddv1.KeyValue{Key: e.Key, Value: e.Value, CreateRevision: e.CreateRevision, ModRevision: e.ModRevision, Version: e.Version}
}
