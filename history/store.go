package history

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/names"
)

// keys are the history's etcd keys under one root.
type keys struct{ base string } // "<root>timeline/"

func (k keys) cursor() string { return k.base + "cursor" }
func (k keys) writer() string { return k.base + "writer" }
func (k keys) all() string    { return k.base + "t/" }
func (k keys) named(kind Kind, name string) string {
	return k.base + "n/" + string(kind) + "/" + names.Escape(name) + "/"
}

// twin is the by-name key of the event whose t/ key is key; "" if the
// event has no name (a gap).
func (k keys) twin(e *Event, suffix string) string {
	if e.Name == "" {
		return ""
	}
	return k.named(e.Kind, e.Name) + suffix
}

// Store reads the history. It is safe for concurrent use.
type Store struct {
	cli  *clientv3.Client
	keys keys
}

// NewStore reads the history kept under root+"timeline/".
func NewStore(cli *clientv3.Client, root string) *Store {
	return &Store{cli: cli, keys: keys{base: root + "timeline/"}}
}

// Query selects events.
type Query struct {
	Kind Kind   // required
	Name string // one lock or election; empty: every one of Kind
	// Owner, when set, keeps only events of sessions with this owner.
	Owner string
	// Since and Until bound the events' times (Until excluded); zero is
	// unbounded.
	Since, Until time.Time
	// Limit is the most events to return: 1-1000, 100 when zero.
	Limit int
	// PageToken continues a listing where the last page ended.
	PageToken string
	// NewestFirst lists the newest events first.
	NewestFirst bool
}

// maxScan bounds the keys one List reads while it filters by owner or
// kind: a page may come back short (with a next page token) rather than
// read the whole history.
const maxScan = 10000

// List returns the events that q selects, oldest first (or newest first),
// and the token of the next page ("" after the last). The read is
// linearizable. It fails with ErrInvalid for a malformed query.
func (s *Store) List(ctx context.Context, q Query) ([]Event, string, error) {
	if err := checkName(q.Kind, q.Name); err != nil {
		return nil, "", err
	}
	if q.Limit == 0 {
		q.Limit = 100
	}
	if q.Limit < 1 || q.Limit > 1000 {
		return nil, "", fmt.Errorf("%w: page size %d is not between 1 and 1000", ErrInvalid, q.Limit)
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return nil, "", fmt.Errorf("%w: until (%s) is not after since (%s)", ErrInvalid, q.Until.Format(time.RFC3339), q.Since.Format(time.RFC3339))
	}
	prefix := s.keys.all()
	if q.Name != "" {
		prefix = s.keys.named(q.Kind, q.Name)
	}
	from, end := prefix+timeKey(q.Since), clientv3.GetPrefixRangeEnd(prefix)
	if !q.Until.IsZero() {
		end = prefix + timeKey(q.Until)
	}
	if q.PageToken != "" {
		last, err := base64.RawURLEncoding.DecodeString(q.PageToken)
		if err != nil || !validSuffix(string(last)) {
			return nil, "", fmt.Errorf("%w: page token %.40q is not one this listing returned", ErrInvalid, q.PageToken)
		}
		if q.NewestFirst {
			end = min(end, prefix+string(last))
		} else {
			from = max(from, prefix+string(last)+"\x00")
		}
	}
	return s.scan(ctx, q, prefix, from, end)
}

// validSuffix reports whether s looks like an event's key suffix.
func validSuffix(s string) bool {
	_, ok := suffixTime(s)
	return ok && len(s) == 16+1+16+1+4
}

// scan reads [from, end) in pages and keeps the events q selects.
func (s *Store) scan(ctx context.Context, q Query, prefix, from, end string) ([]Event, string, error) {
	var out []Event
	scanned := 0
	for from < end {
		batch := min(max(q.Limit*2, 64), 1000)
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(batch))}
		key := from
		if q.NewestFirst {
			opts = append(opts, clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, "", fmt.Errorf("history: list: %w", err)
		}
		for _, kv := range resp.Kvs {
			scanned++
			var e Event
			if json.Unmarshal(kv.Value, &e) == nil && selects(q, &e) {
				out = append(out, e)
			}
			last := strings.TrimPrefix(string(kv.Key), prefix)
			if len(out) == q.Limit || scanned >= maxScan {
				if !resp.More && kv == resp.Kvs[len(resp.Kvs)-1] {
					return out, "", nil
				}
				return out, base64.RawURLEncoding.EncodeToString([]byte(last)), nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		lastKey := string(resp.Kvs[len(resp.Kvs)-1].Key)
		if q.NewestFirst {
			end = lastKey
		} else {
			from = lastKey + "\x00"
		}
	}
	return out, "", nil
}

// selects reports whether q keeps e (the key range has done the rest).
func selects(q Query, e *Event) bool {
	if e.Type == Gap {
		return q.Owner == "" // a gap concerns every lock and election
	}
	if e.Kind != q.Kind {
		return false
	}
	return q.Owner == "" || e.Owner == q.Owner
}

// Count returns how many events the history holds (a serializable read).
func (s *Store) Count(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, s.keys.all(), clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
	if err != nil {
		return 0, fmt.Errorf("history: count: %w", err)
	}
	return resp.Count, nil
}
