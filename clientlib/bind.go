package clientlib

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.yaml.in/yaml/v3"

	"github.com/coordd/coordd/internal/shared/configvalue"
)

// Format is how a bound namespace's values are written.
type Format int

// Formats.
const (
	// JSON values.
	JSON Format = iota + 1
	// YAML values (JSON is YAML too).
	YAML
)

// BindOption configures Bind.
type BindOption[T any] func(*bindOptions[T])

type bindOptions[T any] struct {
	strict   bool
	key      string
	defaults T
	validate func(T) error
	onChange func(prev, next T)
}

// BindKey decodes the whole value from one key holding a document,
// instead of one key per field.
func BindKey[T any](key string) BindOption[T] { return func(o *bindOptions[T]) { o.key = key } }

// BindStrict refuses releases with keys (or document fields) that T has no
// field for, catching misspelt keys.
func BindStrict[T any]() BindOption[T] { return func(o *bindOptions[T]) { o.strict = true } }

// BindDefaults is the value fields start from; keys present override it.
func BindDefaults[T any](v T) BindOption[T] { return func(o *bindOptions[T]) { o.defaults = v } }

// BindValidate rejects a decoded value: the release is refused, the last
// good value stays, and the rejection is reported (OnError, and to the
// server's applied-status).
func BindValidate[T any](fn func(T) error) BindOption[T] {
	return func(o *bindOptions[T]) { o.validate = fn }
}

// BindOnChange is called, on the subscription's callback goroutine, after
// every accepted change, with the previous and the new value.
func BindOnChange[T any](fn func(prev, next T)) BindOption[T] {
	return func(o *bindOptions[T]) { o.onChange = fn }
}

// Binding is a typed, hot-reloaded view of one namespace.
type Binding[T any] struct {
	ns      string
	format  Format
	opts    bindOptions[T]
	mu      sync.Mutex // serializes updates: Bind's first decode and the callback's
	current atomic.Pointer[bound[T]]
}

type bound[T any] struct {
	value    T
	release  int64
	revision int64   // of the snapshot it was decoded from
	cluster  string  // of the snapshot it was decoded from
	view     *nsView // the namespace state it was decoded from
}

// Bind decodes a namespace of sub into a T and keeps it current: with one
// key per field by default (field names as in encoding/json: use json
// tags, for YAML too), or one document in the key BindKey names. With JSON
// and one key per field, a value that is JSON text is that JSON value and
// any other text is a string (timeout=5s needs no quotes; to bind the
// string "3", store "3" with its quotes): the rule a namespace's schema
// reads values by. A document (BindKey) must be JSON or YAML. A release
// that does not decode or validate is rejected and the last good value
// stays. If the namespace's current content does not decode or validate,
// Bind starts from the last release the app accepted (also one from before
// a restart: with WithCacheFile, the cache file keeps it), reporting the
// rejection to OnError; with no such release, Bind fails.
func Bind[T any](sub *Subscription, ns string, format Format, opts ...BindOption[T]) (*Binding[T], error) {
	if format != JSON && format != YAML {
		return nil, fmt.Errorf("%w: unknown format %d", ErrInvalidArgument, format)
	}
	if !slices.Contains(sub.namespaces, ns) {
		return nil, fmt.Errorf("%w: the subscription does not follow %q", ErrInvalidArgument, ns)
	}
	b := &Binding[T]{ns: ns, format: format}
	for _, opt := range opts {
		opt(&b.opts)
	}
	// Register before decoding, so no release slips between the two; the
	// callback skips a state already decoded.
	unregister := sub.register(&callback{ns: ns, filter: func(string) bool { return true }, fn: func(ch ConfigUpdate) error {
		return b.update(ch.Snapshot)
	}})
	snap := sub.Snapshot()
	if err := b.update(snap); err != nil {
		// The newest release is bad: start from the last one the app
		// accepted (kept in the cache file across restarts), if any.
		good := sub.lastGood(ns)
		if good == nil || good == snap.spaces[ns] || b.update(&ConfigSnapshot{cluster: snap.cluster, spaces: map[string]*nsView{ns: good}}) != nil {
			unregister()
			return nil, err
		}
		sub.report(fmt.Errorf("%w; started from the last accepted release %d", err, good.release))
	}
	return b, nil
}

// Load returns the current value. It never blocks.
func (b *Binding[T]) Load() T { return b.current.Load().value }

// Release returns the release the current value was decoded from.
func (b *Binding[T]) Release() int64 { return b.current.Load().release }

// update decodes snap's namespace and, if it is good, publishes it. It
// never replaces a value with one from an older snapshot.
func (b *Binding[T]) update(snap *ConfigSnapshot) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur := b.current.Load(); cur != nil && (cur.view == snap.spaces[b.ns] || snap.cluster == cur.cluster && snap.revision < cur.revision) {
		return nil
	}
	v, err := b.decode(snap)
	if err == nil && b.opts.validate != nil {
		err = b.opts.validate(v)
	}
	if err != nil {
		return fmt.Errorf("coordd: release %d of %q rejected: %w", snap.Release(b.ns), b.ns, err)
	}
	prev := b.current.Swap(&bound[T]{value: v, release: snap.Release(b.ns), revision: snap.revision, cluster: snap.cluster, view: snap.spaces[b.ns]})
	if prev != nil && b.opts.onChange != nil {
		b.opts.onChange(prev.value, v)
	}
	return nil
}

func (b *Binding[T]) decode(snap *ConfigSnapshot) (T, error) {
	// Start from a deep copy of the defaults (through JSON), so decoding
	// never writes into maps or slices the defaults share.
	var v T
	if data, err := json.Marshal(b.opts.defaults); err == nil {
		_ = json.Unmarshal(data, &v)
	}
	if b.opts.key != "" {
		doc, ok := snap.Get(b.ns, b.opts.key)
		if !ok {
			return v, nil // nothing published yet: the defaults
		}
		tree, err := b.parse(b.opts.key, doc)
		if err != nil {
			return v, err
		}
		return v, intoJSON(tree, &v, b.opts.strict)
	}
	fields := map[string]any{}
	for _, k := range snap.Keys(b.ns) {
		val, _ := snap.Get(b.ns, k)
		tree, err := b.parse(k, val)
		if err != nil {
			return v, err
		}
		fields[k] = tree
	}
	return v, intoJSON(fields, &v, b.opts.strict)
}

// parse reads one value in the binding's format.
func (b *Binding[T]) parse(key, val string) (any, error) {
	var tree any
	var err error
	switch {
	case b.format == JSON && b.opts.key == "":
		// One key per field: configvalue's rule, as a schema reads it.
		err = json.Unmarshal(configvalue.JSON(val), &tree)
	case b.format == JSON:
		err = json.Unmarshal([]byte(val), &tree) // a whole document
	default:
		err = yaml.Unmarshal([]byte(val), &tree)
	}
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", key, err)
	}
	return tree, nil
}

// intoJSON decodes a parsed tree into v through JSON, so field names follow
// encoding/json for every format; strict refuses unknown fields.
func intoJSON(tree any, v any, strict bool) error {
	data, err := json.Marshal(tree)
	if err != nil {
		return fmt.Errorf("not representable as JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	return dec.Decode(v)
}
