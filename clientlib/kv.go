package clientlib

import (
	"context"
	"errors"
	"time"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// KV reads coordd's fenced key-value store: what FencedPut and
// FencedDelete (Lock.Put, Leadership.Put, ...) wrote. Writes are fenced
// and go through those calls only.
func (c *Client) KV() *KV { return &KV{c: c} }

// KV is the client's view of coordd's fenced KV; see Client.KV.
type KV struct{ c *Client }

// KeyValue is one key of coordd's KV.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64 // when it was (last) created
	ModRevision    int64 // its last write
	Version        int64 // writes since it was created
}

func keyValueFrom(p *coorddv1.KeyValue) KeyValue {
	return KeyValue{Key: p.GetKey(), Value: p.GetValue(), CreateRevision: p.GetCreateRevision(), ModRevision: p.GetModRevision(), Version: p.GetVersion()}
}

// readAttempt bounds one attempt of a read: a member that lost its etcd
// leader is left for another after it (reads are retried while coordd or
// etcd is unavailable, until ctx ends).
const readAttempt = 5 * time.Second

// Get reads key: the latest value (linearizable), or with rev > 0 the value
// at that revision (ErrCompacted if it is older than etcd's history). A
// key that does not exist is ErrKeyNotFound. It also returns the revision
// the read saw.
func (k *KV) Get(ctx context.Context, key string, rev int64) (KeyValue, int64, error) {
	var resp *coorddv1.GetKVResponse
	_, err := k.c.retry(ctx, readAttempt, func(ctx context.Context) (err error) {
		resp, err = k.c.kv.GetKV(ctx, &coorddv1.GetKVRequest{Key: key, Revision: rev})
		return err
	})
	if err != nil {
		return KeyValue{}, 0, err
	}
	return keyValueFrom(resp.GetKv()), resp.GetRevision(), nil
}

// KVPage is one page of List.
type KVPage struct {
	KVs      []KeyValue
	Next     string // pass to List for the next page; "" on the last
	Revision int64  // the revision the page was read at
}

// ListOptions bound a List.
type ListOptions struct {
	PageSize  int    // 1-1000; 100 when zero
	PageToken string // the previous page's Next
	// Revision reads at that revision (0: the latest). Pass the first
	// page's Revision to read the next pages from the same snapshot.
	Revision int64
	KeysOnly bool // leave values out
}

// List reads one page of the keys under prefix, in key order.
func (k *KV) List(ctx context.Context, prefix string, o ListOptions) (KVPage, error) {
	var resp *coorddv1.ListKVResponse
	_, err := k.c.retry(ctx, readAttempt, func(ctx context.Context) (err error) {
		resp, err = k.c.kv.ListKV(ctx, &coorddv1.ListKVRequest{Prefix: prefix, PageSize: int32(o.PageSize), PageToken: o.PageToken, Revision: o.Revision, KeysOnly: o.KeysOnly})
		return err
	})
	if err != nil {
		return KVPage{}, err
	}
	p := KVPage{Next: resp.GetNextPageToken(), Revision: resp.GetRevision()}
	for _, kv := range resp.GetKvs() {
		p.KVs = append(p.KVs, keyValueFrom(kv))
	}
	return p, nil
}

// KVEvent is one change of a watched key: a put (KV is the new state) or
// a delete (KV has the key and the delete's ModRevision).
type KVEvent struct {
	Deleted bool
	KV      KeyValue
}

// KVWatch follows the keys under a prefix; see KV.Watch.
type KVWatch struct {
	events chan KVEvent
	err    error // why Events was closed; set before closing
}

// Events delivers the changes in revision order. It is closed when the
// watch ends; Err then says why.
func (w *KVWatch) Events() <-chan KVEvent { return w.events }

// Err returns why Events was closed: ctx's error, ErrCompacted (the
// resume point fell out of etcd's history: List again and watch from the
// list's Revision + 1), or ErrInvalidArgument. Call it after Events is
// closed.
func (w *KVWatch) Err() error { return w.err }

// Watch follows the changes of the keys under prefix from revision from
// (0: those after now) until ctx ends. When the connection breaks it
// reconnects (to any endpoint) and resumes after the last revision it
// delivered, so nothing is skipped or repeated. Events wait for the
// reader.
func (k *KV) Watch(ctx context.Context, prefix string, from int64) *KVWatch {
	w := &KVWatch{events: make(chan KVEvent)}
	go func() {
		defer close(w.events)
		w.err = k.watch(ctx, prefix, from, w.events)
	}()
	return w
}

func (k *KV) watch(ctx context.Context, prefix string, from int64, out chan<- KVEvent) error {
	open := func(ctx context.Context, from int64) (func() (*coorddv1.WatchKVResponse, error), error) {
		st, err := k.c.kv.WatchKV(ctx, &coorddv1.WatchKVRequest{Prefix: prefix, FromRevision: from})
		if err != nil {
			return nil, err
		}
		return st.Recv, nil
	}
	deliver := func(msg *coorddv1.WatchKVResponse) error {
		for _, ev := range msg.GetEvents() {
			e := KVEvent{Deleted: ev.GetType() == coorddv1.KVEventType_KV_EVENT_TYPE_DELETE, KV: keyValueFrom(ev.GetKv())}
			select {
			case out <- e:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	return follow(ctx, from, open, deliver, func(err error) bool {
		return errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrCompacted) || errors.Is(err, ErrPermissionDenied)
	})
}
