// Package kv reads coordd's fenced key-value store: the keys that
// lock.Manager's FencedPut and FencedDelete write under a lock's token or
// a leadership term, stored under "<root>kv/". It never writes: every
// write is fenced, and goes through the lock package.
//
// Guarantees: Get and List read linearizably, or at a given revision;
// pages of one List at one revision form one snapshot. Watch delivers
// every change under its prefix after its start revision, in revision
// order, each once.
//
// Non-guarantee: a value is what the last fenced write left; by the time a
// reader acts on it, a newer holder may have written.
package kv

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed key, prefix, page token or bound.
	ErrInvalid = errkind.Invalid.New("kv: invalid argument")
	// ErrKeyNotFound: Get found no such key.
	ErrKeyNotFound = errkind.KeyNotFound.New("kv: key not found")
	// ErrCompacted: the revision asked for is older than etcd's history.
	ErrCompacted = errkind.Compacted.New("kv: revision compacted")
	// ErrUnavailable: the watch ended because this member lost etcd (no
	// leader, a stop); resume from the last revision received + 1.
	ErrUnavailable = errkind.Unavailable.New("kv: watch interrupted")
)

// Limits.
const (
	MaxKeyBytes     = 512
	MaxPageSize     = 1000
	DefaultPageSize = 100
)

// CheckKey validates a key: 1-MaxKeyBytes bytes of UTF-8 without control
// characters.
func CheckKey(key string) error {
	if key == "" {
		return errors.New("key is required")
	}
	return checkText("key", key)
}

// checkPrefix validates a prefix: as a key, but it may be empty.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return checkText("prefix", prefix)
}

func checkText(what, s string) error {
	if len(s) > MaxKeyBytes {
		return fmt.Errorf("%s is %d bytes, at most %d are allowed", what, len(s), MaxKeyBytes)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("%s contains a control character", what)
	}
	return nil
}

// KeyValue is one key.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
	Version        int64
}

// Event is one change: a put (KV is the new state) or a delete (KV has the
// key and the delete's ModRevision).
type Event struct {
	Deleted bool
	KV      KeyValue
}

// Store reads the KV under root+"kv/".
type Store struct {
	cli    *clientv3.Client
	prefix string
}

// NewStore returns a Store for the KV that FencedPut writes under
// root+"kv/".
func NewStore(cli *clientv3.Client, root string) *Store {
	return &Store{cli: cli, prefix: root + "kv/"}
}

// Get reads key at rev (0: the latest, linearizably) and returns it with
// the revision of the read.
func (s *Store) Get(ctx context.Context, key string, rev int64) (KeyValue, int64, error) {
	if err := CheckKey(key); err != nil {
		return KeyValue{}, 0, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if rev < 0 {
		return KeyValue{}, 0, fmt.Errorf("%w: revision %d is negative", ErrInvalid, rev)
	}
	resp, err := s.cli.Get(ctx, s.prefix+key, clientv3.WithRev(rev))
	if err != nil {
		return KeyValue{}, 0, s.readErr(err, rev)
	}
	if len(resp.Kvs) == 0 {
		return KeyValue{}, resp.Header.Revision, fmt.Errorf("%w: %q", ErrKeyNotFound, key)
	}
	return s.fromKV(resp.Kvs[0]), resp.Header.Revision, nil
}

// Page is one page of a List.
type Page struct {
	KVs []KeyValue
	// Next fetches the next page (with the same Revision); "" on the last.
	Next     string
	Revision int64
}

// List reads up to size keys under prefix in key order, after the page
// token after ("" for the first page), at rev (0: the latest).
func (s *Store) List(ctx context.Context, prefix, after string, size int, rev int64, keysOnly bool) (Page, error) {
	if err := checkPrefix(prefix); err != nil {
		return Page{}, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if size == 0 {
		size = DefaultPageSize
	}
	if size < 0 || size > MaxPageSize {
		return Page{}, fmt.Errorf("%w: page size %d is not 1-%d", ErrInvalid, size, MaxPageSize)
	}
	if rev < 0 {
		return Page{}, fmt.Errorf("%w: revision %d is negative", ErrInvalid, rev)
	}
	from := s.prefix + prefix
	if after != "" {
		last, err := base64.RawURLEncoding.DecodeString(after)
		if err != nil || !strings.HasPrefix(string(last), prefix) {
			return Page{}, fmt.Errorf("%w: page token %q is not one this prefix's list gave", ErrInvalid, after)
		}
		from = s.prefix + string(last) + "\x00"
	}
	opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.prefix + prefix)), clientv3.WithLimit(int64(size)), clientv3.WithRev(rev)}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := s.cli.Get(ctx, from, opts...)
	if err != nil {
		return Page{}, s.readErr(err, rev)
	}
	p := Page{Revision: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		p.KVs = append(p.KVs, s.fromKV(kv))
	}
	if resp.More && len(p.KVs) > 0 {
		p.Next = base64.RawURLEncoding.EncodeToString([]byte(p.KVs[len(p.KVs)-1].Key))
	}
	return p, nil
}

// Watch calls fn with the changes under prefix from revision from (0:
// after the current revision) in revision order, a batch per etcd
// revision or more, until ctx ends (ctx's error), fn fails (its error),
// from is compacted (ErrCompacted), or the member loses etcd
// (ErrUnavailable). Its first call has no events and says from which
// revision on changes follow (start - 1): the watch is established.
func (s *Store) Watch(ctx context.Context, prefix string, from int64, fn func(events []Event, revision int64) error) error {
	if err := checkPrefix(prefix); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if from < 0 {
		return fmt.Errorf("%w: revision %d is negative", ErrInvalid, from)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	if from > 0 {
		opts = append(opts, clientv3.WithRev(from))
	}
	for wr := range s.cli.Watch(wctx, s.prefix+prefix, opts...) {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w: revision %d is older than etcd's history (compacted at %d); list again and watch from the list's revision + 1", ErrCompacted, from, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %s", ErrUnavailable, err.Error())
		}
		if wr.Created {
			start := wr.Header.Revision
			if from > 0 {
				start = from - 1
			}
			if err := fn(nil, start); err != nil {
				return err
			}
			continue
		}
		if len(wr.Events) == 0 {
			continue
		}
		evs := make([]Event, len(wr.Events))
		for i, ev := range wr.Events {
			evs[i] = Event{Deleted: ev.Type == mvccpb.DELETE, KV: s.fromKV(ev.Kv)}
		}
		if err := fn(evs, wr.Events[len(wr.Events)-1].Kv.ModRevision); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: the watch ended", ErrUnavailable)
}

func (s *Store) fromKV(kv *mvccpb.KeyValue) KeyValue {
	return KeyValue{
		Key: strings.TrimPrefix(string(kv.Key), s.prefix), Value: kv.Value,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version,
	}
}

// readErr classifies a failed read at rev.
func (s *Store) readErr(err error, rev int64) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("%w: revision %d is older than etcd's history", ErrCompacted, rev)
	}
	if errors.Is(err, rpctypes.ErrFutureRev) {
		return fmt.Errorf("%w: revision %d is newer than etcd's", ErrInvalid, rev)
	}
	return fmt.Errorf("kv: read: %w", err)
}
