package configcenter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// ErrSecretsUnavailable says a secret value cannot be sealed or opened on
// this member: it has no key file, or not the key that wrapped the
// namespace's data key. Nothing changed.
var ErrSecretsUnavailable = errkind.SecretsUnavailable.New("config: secret values are unavailable on this member")

// secrets seals and opens a Store's secret values: envelope encryption with
// one data key per namespace, kept wrapped by a key-encryption key at
// dek/<ns>, and a value sealed with its namespace and key as associated
// data.
//
// A namespace's data key is made by the first release that stores a secret
// and never changes (rotating the KEK rewraps it), so every sealed value a
// release record keeps opens for as long as the namespace exists.
type secrets struct {
	off     bool // tests only: store secret values in clear (a sabotage)
	mu      sync.Mutex
	wrapper keyring.Wrapper   // nil: no key file
	keys    map[string][]byte // namespace -> its data key, unwrapped
}

// SetKeys sets the key-encryption keys that wrap the namespaces' data keys
// (nil: none; secret values can then be neither written nor revealed). It
// may be called at any time, as when the key file is reloaded.
func (s *Store) SetKeys(w keyring.Wrapper) {
	s.secrets.mu.Lock()
	defer s.secrets.mu.Unlock()
	s.secrets.wrapper = w
	clear(s.secrets.keys) // unwrap again with the keys now in force
}

func (s *Store) dekKey(ns string) string { return s.root + "dek/" + names.Escape(ns) }
func (s *Store) dekPrefix() string       { return s.root + "dek/" }

// valueAAD binds a sealed value to its namespace and key.
func valueAAD(ns, key string) []byte { return []byte("coordd config value\x00" + ns + "\x00" + key) }

// dekAAD binds a wrapped data key to its namespace.
func dekAAD(ns string) []byte { return []byte("coordd config data key\x00" + ns) }

func (s *Store) wrapper() (keyring.Wrapper, error) {
	s.secrets.mu.Lock()
	defer s.secrets.mu.Unlock()
	if s.secrets.wrapper == nil {
		return nil, fmt.Errorf("%w: it was started without --secret-key-file", ErrSecretsUnavailable)
	}
	return s.secrets.wrapper, nil
}

// dataKey returns ns's data key, or nil if it has none yet.
func (s *Store) dataKey(ctx context.Context, ns string) ([]byte, error) {
	s.secrets.mu.Lock()
	key := s.secrets.keys[ns]
	s.secrets.mu.Unlock()
	if key != nil {
		return key, nil
	}
	w, err := s.wrapper()
	if err != nil {
		return nil, err
	}
	resp, err := s.cli.Get(ctx, s.dekKey(ns))
	if err != nil {
		return nil, fmt.Errorf("config: read the data key of %q: %w", ns, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var wrapped keyring.Wrapped
	if err := json.Unmarshal(resp.Kvs[0].Value, &wrapped); err != nil {
		return nil, fmt.Errorf("config: decode the data key of %q: %w", ns, err)
	}
	key, err = w.Unwrap(ctx, wrapped, dekAAD(ns))
	if err != nil {
		return nil, fmt.Errorf("%w: the data key of %q: %w", ErrSecretsUnavailable, ns, err)
	}
	s.secrets.mu.Lock()
	if s.secrets.keys == nil {
		s.secrets.keys = map[string][]byte{}
	}
	if s.secrets.wrapper == w {
		s.secrets.keys[ns] = key
	}
	s.secrets.mu.Unlock()
	return key, nil
}

// newDataKey makes ns a data key and the write that stores it, guarded by
// the key's absence.
func (s *Store) newDataKey(ctx context.Context, ns string) ([]byte, clientv3.Op, clientv3.Cmp, error) {
	w, err := s.wrapper()
	if err != nil {
		return nil, clientv3.Op{}, clientv3.Cmp{}, err
	}
	key := keyring.NewDataKey()
	wrapped, err := w.Wrap(ctx, key, dekAAD(ns))
	if err != nil {
		return nil, clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("%w: wrap a data key: %w", ErrSecretsUnavailable, err)
	}
	b, err := json.Marshal(wrapped)
	if err != nil {
		return nil, clientv3.Op{}, clientv3.Cmp{}, err
	}
	return key, clientv3.OpPut(s.dekKey(ns), string(b)), clientv3.Compare(clientv3.CreateRevision(s.dekKey(ns)), "=", 0), nil
}

// sealMutations seals the values of the secret mutations of a release
// planned on cur: those marked Secret, and every put of a key whose value
// is sealed now (a secret stays secret until it is deleted). Each put is
// sealed afresh, so it is a change even when the clear value is the one
// the secret has: were it "nothing changed", a writer without
// config.read-secret could test guesses of a secret by dry runs. Values
// already sealed (a rollback's, from a release record) are kept as they
// are. It returns the writes and guards that create the
// namespace's data key when this is its first secret, and the data key
// (nil if no value was sealed).
func (s *Store) sealMutations(ctx context.Context, cur nsState, ms []Mutation) (sealing, error) {
	need := false
	for _, m := range ms {
		if m.Secret && cur.gray.Running() && cur.gray.overrides(m.Key) {
			// The gray keeps its override of the key in clear, for every
			// reader of the gray, and a promotion would make it the secret.
			return sealing{}, fmt.Errorf("%w: key %q is overridden by gray release %d, which keeps its value in clear: abandon or promote the gray first", ErrInvalid, m.Key, cur.gray.Number)
		}
		if s.secrets.off {
			break
		}
		if !m.Delete && !keyring.IsSealed(m.Value) && (m.Secret || keyring.IsSealed(cur.Content[m.Key])) {
			need = true
			break
		}
	}
	if !need {
		return sealing{ms: ms}, nil
	}
	key, err := s.dataKey(ctx, cur.Namespace)
	if err != nil {
		return sealing{}, err
	}
	var res sealing
	if key == nil {
		var op clientv3.Op
		var cmp clientv3.Cmp
		if key, op, cmp, err = s.newDataKey(ctx, cur.Namespace); err != nil {
			return sealing{}, err
		}
		res.ops, res.cmps = []clientv3.Op{op}, []clientv3.Cmp{cmp}
	}
	out := make([]Mutation, len(ms))
	for i, m := range ms {
		out[i] = m
		old := cur.Content[m.Key]
		if m.Delete || keyring.IsSealed(m.Value) || (!m.Secret && !keyring.IsSealed(old)) {
			continue
		}
		if out[i].Value, err = keyring.Seal(key, valueAAD(cur.Namespace, m.Key), m.Value); err != nil {
			return sealing{}, err
		}
	}
	res.ms, res.key = out, key
	return res, nil
}

// sealing is what sealMutations returns.
type sealing struct {
	ms   []Mutation     // the mutations, secret values sealed
	ops  []clientv3.Op  // writes that create the namespace's data key
	cmps []clientv3.Cmp // their guard
	key  []byte         // the data key, if it was needed
}

// OpenValue returns a stored value in clear: a sealed value opened with its
// namespace's data key, any other value as it is. It fails with
// ErrSecretsUnavailable if the member cannot open it.
func (s *Store) OpenValue(ctx context.Context, ns, key, value string) (string, error) {
	if !keyring.IsSealed(value) {
		return value, nil
	}
	for try := 0; ; try++ {
		dk, err := s.dataKey(ctx, ns)
		if err != nil {
			return "", err
		}
		if dk == nil {
			return "", fmt.Errorf("%w: %q has a sealed value and no data key", ErrSecretsUnavailable, ns)
		}
		plain, err := keyring.Open(dk, valueAAD(ns, key), value)
		if err == nil {
			return plain, nil
		}
		if try > 0 || !errors.Is(err, keyring.ErrOpen) {
			return "", fmt.Errorf("%w: key %q of %q: %w", ErrSecretsUnavailable, key, ns, err)
		}
		// The data key kept here may be another cluster's (a restore):
		// read it again once.
		s.secrets.mu.Lock()
		delete(s.secrets.keys, ns)
		s.secrets.mu.Unlock()
	}
}

// openContent returns content with its sealed values opened, and the keys
// that were secret (nil if none). dk, when set, is the namespace's data key
// (one a release about to commit makes).
func (s *Store) openContent(ctx context.Context, ns string, content map[string]string, dk []byte) (map[string]string, map[string]bool, error) {
	var out map[string]string
	var secret map[string]bool
	for k, v := range content {
		if !keyring.IsSealed(v) {
			continue
		}
		if out == nil {
			out, secret = maps.Clone(content), map[string]bool{}
		}
		var plain string
		var err error
		if dk != nil {
			plain, err = keyring.Open(dk, valueAAD(ns, k), v)
		} else {
			plain, err = s.OpenValue(ctx, ns, k, v)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("validating %q against its schema needs its secret values in clear: %w", ns, err)
		}
		out[k], secret[k] = plain, true
	}
	if out == nil {
		return content, nil, nil
	}
	return out, secret, nil
}

// RewrapResult is what RewrapDataKeys did.
type RewrapResult struct {
	Primary   string         // the KEK that now wraps them
	Rewrapped int            // data keys rewrapped by this call
	ByKEK     map[string]int // data keys by the KEK that wraps them, after the call
}

// RewrapDataKeys rewraps every namespace's data key that the primary KEK
// does not wrap, each in a transaction that compares its revision (a
// concurrent rewrap is harmless). The data keys themselves do not change,
// so no value is sealed again and readers never stop. After it, KEKs that
// ByKEK no longer counts may be removed from every member's key file.
func (s *Store) RewrapDataKeys(ctx context.Context) (RewrapResult, error) {
	w, err := s.wrapper()
	if err != nil {
		return RewrapResult{}, err
	}
	res := RewrapResult{Primary: w.Primary(), ByKEK: map[string]int{}}
	resp, err := s.cli.Get(ctx, s.dekPrefix(), clientv3.WithPrefix())
	if err != nil {
		return res, fmt.Errorf("config: list data keys: %w", err)
	}
	for _, kv := range resp.Kvs {
		ns := names.Unescape(string(kv.Key[len(s.dekPrefix()):]))
		var wrapped keyring.Wrapped
		if err := json.Unmarshal(kv.Value, &wrapped); err != nil {
			return res, fmt.Errorf("config: decode the data key of %q: %w", ns, err)
		}
		if wrapped.KEK == w.Primary() {
			res.ByKEK[wrapped.KEK]++
			continue
		}
		key, err := w.Unwrap(ctx, wrapped, dekAAD(ns))
		if err != nil {
			return res, fmt.Errorf("%w: the data key of %q: %w", ErrSecretsUnavailable, ns, err)
		}
		again, err := w.Wrap(ctx, key, dekAAD(ns))
		if err != nil {
			return res, fmt.Errorf("%w: %w", ErrSecretsUnavailable, err)
		}
		b, err := json.Marshal(again)
		if err != nil {
			return res, err
		}
		t, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpPut(string(kv.Key), string(b))).Commit()
		if err != nil {
			return res, fmt.Errorf("config: rewrap the data key of %q: %w", ns, err)
		}
		if t.Succeeded {
			res.Rewrapped++
		}
		res.ByKEK[again.KEK]++ // a lost compare: another rewrap of it won
	}
	return res, nil
}

// HoldsSecrets reports whether a namespace has a secret value now.
func (s *Store) HoldsSecrets(ctx context.Context, ns string) (bool, error) {
	snap, err := s.Snapshot(ctx, ns, 0)
	if err != nil {
		return false, err
	}
	return hasSecrets(snap.Content), nil
}

// hasSecrets reports whether content holds a sealed value.
func hasSecrets(content map[string]string) bool {
	for _, v := range content {
		if keyring.IsSealed(v) {
			return true
		}
	}
	return false
}
