package history

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
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

// prefixOf is the by-name prefix of e's events; "" if e has no name (a
// gap).
func (k keys) prefixOf(e *Event) string {
	switch {
	case e.Name == "":
		return ""
	case e.named != "":
		return e.named
	}
	return k.named(e.Kind, e.Name)
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
	// MinRevision, when set, makes List wait until the history has
	// recorded every event up to this etcd revision (events are recorded
	// within about 250 ms of their commit), for at most MaxRecordedWait
	// or until ctx ends. Past that it fails with ErrBehind; a revision
	// the cluster has not reached yet is ErrInvalid.
	MinRevision int64
}

// MaxRecordedWait bounds how long List waits for Query.MinRevision.
const MaxRecordedWait = 10 * time.Second

// ErrBehind says the history has not recorded up to the revision asked for
// within MaxRecordedWait (the recorder is slow, or none records: see
// coordd_history_* metrics). Asking again may succeed.
var ErrBehind = errkind.Unavailable.New("history: not recorded that far yet")

// maxScan bounds the events one List reads while it filters by owner or
// kind: a page may come back short (with a next page token) rather than
// read the whole history.
const maxScan = 10000

// maxBatchSpan bounds how much later than its first event a batch's last
// one is (events wait flushDelay at most to share a batch): a listing
// from a time starts reading this much earlier.
const maxBatchSpan = time.Minute

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
	sc := scan{q: q, prefix: s.keys.all(), skip: -1}
	if q.Name != "" {
		sc.prefix = s.keys.named(q.Kind, q.Name)
	}
	sc.from, sc.end = sc.prefix, clientv3.GetPrefixRangeEnd(sc.prefix)
	if !q.Since.IsZero() {
		sc.from = sc.prefix + timeKey(q.Since.Add(-maxBatchSpan))
	}
	if !q.Until.IsZero() {
		sc.end = sc.prefix + timeKey(q.Until)
	}
	if q.PageToken != "" {
		if err := sc.resume(q.PageToken); err != nil {
			return nil, "", err
		}
	}
	if q.MinRevision < 0 {
		return nil, "", fmt.Errorf("%w: min revision %d is negative", ErrInvalid, q.MinRevision)
	}
	if q.MinRevision > 0 {
		if err := s.awaitRecorded(ctx, q.MinRevision); err != nil {
			return nil, "", err
		}
	}
	return sc.run(ctx, s.cli)
}

// scan is one List: it reads the batches in [from, end), in key order or
// the reverse, and keeps the events q selects.
type scan struct {
	q            Query
	prefix       string
	from, end    string
	first        string // the batch the page token names ("": none)
	skip         int    // in that batch, the events up to (or from) this index were listed
	out          []Event
	scanned      int
	lastBatch    string
	lastIndex    int
	lastOfLatest bool // the last event listed was the range's last
}

// pageToken is a batch's key suffix and an index in it.
func pageToken(suffix string, i int) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%s.%d", suffix, i))
}

// resume starts the scan after the event that token names.
func (sc *scan) resume(token string) error {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	suffix, idx, ok := strings.Cut(string(raw), ".")
	i, aerr := strconv.Atoi(idx)
	if err != nil || !ok || aerr != nil || i < 0 || !validSuffix(suffix) {
		return fmt.Errorf("%w: page token %.40q is not one this listing returned", ErrInvalid, token)
	}
	sc.first, sc.skip = suffix, i
	if sc.q.NewestFirst {
		sc.end = min(sc.end, sc.prefix+suffix+"\x00")
	} else {
		sc.from = max(sc.from, sc.prefix+suffix)
	}
	return nil
}

// validSuffix reports whether s looks like a batch's key suffix.
func validSuffix(s string) bool {
	_, ok := suffixTime(s)
	return ok && len(s) == 16+1+16+1+4
}

func (sc *scan) run(ctx context.Context, cli *clientv3.Client) ([]Event, string, error) {
	for sc.from < sc.end {
		opts := []clientv3.OpOption{clientv3.WithRange(sc.end), clientv3.WithLimit(16)}
		if sc.q.NewestFirst {
			opts = append(opts, clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
		}
		resp, err := cli.Get(ctx, sc.from, opts...)
		if err != nil {
			return nil, "", fmt.Errorf("history: list: %w", err)
		}
		for k, kv := range resp.Kvs {
			if sc.batch(kv.Key, kv.Value, !resp.More && k == len(resp.Kvs)-1) {
				if sc.lastOfLatest {
					return sc.out, "", nil
				}
				return sc.out, pageToken(sc.lastBatch, sc.lastIndex), nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		if last := string(resp.Kvs[len(resp.Kvs)-1].Key); sc.q.NewestFirst {
			sc.end = last
		} else {
			sc.from = last + "\x00"
		}
	}
	return sc.out, "", nil
}

// batch goes over one batch's events; it reports whether the page is full
// (or the scan went far enough). final says the batch is the range's last.
func (sc *scan) batch(key, value []byte, final bool) bool {
	evs, err := decodeBatch(value)
	if err != nil {
		return false
	}
	suffix := strings.TrimPrefix(string(key), sc.prefix)
	for n := range evs {
		i := n
		if sc.q.NewestFirst {
			i = len(evs) - 1 - n
		}
		if suffix == sc.first && (sc.q.NewestFirst && i >= sc.skip || !sc.q.NewestFirst && i <= sc.skip) {
			continue // listed on an earlier page
		}
		sc.scanned++
		if e := &evs[i]; sc.selects(e) {
			sc.out = append(sc.out, *e)
		}
		if len(sc.out) == sc.q.Limit || sc.scanned >= maxScan {
			sc.lastBatch, sc.lastIndex, sc.lastOfLatest = suffix, i, final && n == len(evs)-1
			return true
		}
	}
	return false
}

// selects reports whether the scan keeps e (the key range did the rest).
func (sc *scan) selects(e *Event) bool {
	q := sc.q
	if (!q.Since.IsZero() && e.Time.Before(q.Since)) || (!q.Until.IsZero() && !e.Time.Before(q.Until)) {
		return false
	}
	if e.Type == Gap {
		return q.Owner == "" // a gap concerns every lock and election
	}
	return e.Kind == q.Kind && (q.Owner == "" || e.Owner == q.Owner)
}

// awaitRecorded waits until the cursor says every event up to rev is
// recorded (see Query.MinRevision): it reads the cursor, and then follows
// it with a watch from that read.
func (s *Store) awaitRecorded(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithTimeout(ctx, MaxRecordedWait)
	defer cancel()
	resp, err := s.cli.Get(wctx, s.keys.cursor())
	if err != nil {
		return fmt.Errorf("history: read the cursor: %w", err)
	}
	if rev > resp.Header.Revision {
		return fmt.Errorf("%w: min revision %d is beyond the cluster's revision %d", ErrInvalid, rev, resp.Header.Revision)
	}
	at := int64(0)
	if len(resp.Kvs) > 0 {
		at = recordedThrough(resp.Kvs[0].Value)
	}
	if at >= rev {
		return nil
	}
	for wr := range s.cli.Watch(wctx, s.keys.cursor(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("history: follow the cursor: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				if at = recordedThrough(ev.Kv.Value); at >= rev {
					return nil
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the history has recorded up to revision %d, not yet %d, after %s; ask again", ErrBehind, at, rev, MaxRecordedWait)
}

// recordedThrough is the revision up to which a stored cursor says every
// event is recorded (0 if it does not decode).
func recordedThrough(value []byte) int64 {
	var c cursor
	if json.Unmarshal(value, &c) != nil {
		return 0
	}
	if c.Seq > 0 {
		return c.Rev - 1 // Rev's events go on in the next batch
	}
	return c.Rev
}
