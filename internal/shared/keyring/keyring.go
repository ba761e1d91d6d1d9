// Package keyring holds coordd's envelope encryption of secret config
// values: key-encryption keys (KEKs) read from a file given to the daemon,
// data keys (one per namespace) wrapped by a KEK, and values sealed by a
// data key with AES-256-GCM.
//
// Guarantees:
//   - A sealed value names no key and carries no clear text: it is
//     SealedPrefix followed by base64 of a random 96-bit nonce and the
//     AES-256-GCM ciphertext with its tag.
//   - A sealed value opens only under the data key and the associated data
//     (namespace and key) it was sealed with: moved to another key or
//     namespace, or altered, it fails to open (ErrOpen).
//   - A wrapped data key names the KEK that wrapped it and opens only with
//     that KEK and the namespace it was wrapped for.
//
// Non-guarantees: nothing here keeps clear text out of memory; the key
// file's protection is the operator's (Load refuses a file that others
// may read).
package keyring

import (
	"bufio"
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// SealedPrefix starts every sealed value, and no clear value may start
// with it.
const SealedPrefix = "coordd:secret:v1:"

// KeyBytes is the length of every key: AES-256.
const KeyBytes = 32

// Errors.
var (
	// ErrUnknownKey: a data key was wrapped by a KEK this ring does not
	// hold.
	ErrUnknownKey = errors.New("keyring: unknown key-encryption key")
	// ErrOpen: a sealed value or wrapped key did not open (wrong key,
	// wrong namespace or key, or altered).
	ErrOpen = errors.New("keyring: does not open with this key")
)

// Wrapped is a data key encrypted by a KEK.
type Wrapped struct {
	KEK string `json:"kek"` // the id of the KEK that wrapped it
	Key []byte `json:"key"` // nonce and ciphertext
}

// Wrapper wraps and unwraps data keys. Ring implements it with keys from a
// file; an external KMS plugs in by implementing it too (Wrap calls the
// KMS's encrypt with its current key, Unwrap its decrypt with the key
// named in Wrapped.KEK). aad binds the wrapped key to its namespace.
type Wrapper interface {
	// Primary is the id of the KEK Wrap uses.
	Primary() string
	Wrap(ctx context.Context, dataKey, aad []byte) (Wrapped, error)
	Unwrap(ctx context.Context, w Wrapped, aad []byte) ([]byte, error)
}

// Ring is a set of KEKs, one of them primary. It is immutable.
type Ring struct {
	keys    map[string][]byte
	order   []string
	primary string
}

var keyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Parse reads a key file: one KEK per line as "<id> <base64 of 32 bytes>",
// blank lines and lines starting with # ignored. The first key is the
// primary: it wraps new data keys; the others only unwrap.
func Parse(data []byte) (*Ring, error) {
	r := &Ring{keys: map[string][]byte{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !keyID.MatchString(f[0]) {
			return nil, fmt.Errorf("keyring: line %d: want \"<id> <base64 key>\", the id 1-64 of [A-Za-z0-9._-]", n)
		}
		k, err := base64.StdEncoding.DecodeString(f[1])
		if err != nil || len(k) != KeyBytes {
			return nil, fmt.Errorf("keyring: line %d: key %q is not %d bytes of base64 (make one with `coordd keygen`)", n, f[0], KeyBytes)
		}
		if _, dup := r.keys[f[0]]; dup {
			return nil, fmt.Errorf("keyring: line %d: key %q is listed twice", n, f[0])
		}
		r.keys[f[0]] = k
		r.order = append(r.order, f[0])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	if len(r.order) == 0 {
		return nil, errors.New("keyring: no key in the file")
	}
	r.primary = r.order[0]
	return r, nil
}

// Load reads a key file (see Parse). It refuses a file that others may
// read or write, or its group write (group read is allowed: a Kubernetes
// Secret mounted for a pod's fsGroup is mode 0440).
func Load(path string) (*Ring, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	if fi.Mode().Perm()&0o027 != 0 {
		return nil, fmt.Errorf("keyring: %s may be read or written by others, or written by its group (mode %04o): chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	r, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// NewKeyLine returns a fresh key as a line of a key file.
func NewKeyLine(id string) (string, error) {
	if !keyID.MatchString(id) {
		return "", fmt.Errorf("keyring: key id %q: 1-64 of [A-Za-z0-9._-]", id)
	}
	return id + " " + base64.StdEncoding.EncodeToString(NewDataKey()) + "\n", nil
}

// Key returns the raw key named id, for sealing values with it directly
// (as a config export does with a transfer key).
func (r *Ring) Key(id string) ([]byte, error) {
	k, ok := r.keys[id]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKey, id)
	}
	return k, nil
}

// IDs lists the ring's KEK ids, the primary first.
func (r *Ring) IDs() []string { return append([]string(nil), r.order...) }

// Primary implements Wrapper.
func (r *Ring) Primary() string { return r.primary }

// Wrap implements Wrapper: it encrypts dataKey with the primary KEK.
func (r *Ring) Wrap(_ context.Context, dataKey, aad []byte) (Wrapped, error) {
	ct, err := seal(r.keys[r.primary], aad, dataKey)
	if err != nil {
		return Wrapped{}, err
	}
	return Wrapped{KEK: r.primary, Key: ct}, nil
}

// Unwrap implements Wrapper.
func (r *Ring) Unwrap(_ context.Context, w Wrapped, aad []byte) ([]byte, error) {
	k, ok := r.keys[w.KEK]
	if !ok {
		return nil, fmt.Errorf("%w %q: add it to the key file of every member", ErrUnknownKey, w.KEK)
	}
	return open(k, aad, w.Key)
}

// NewDataKey returns a random key.
func NewDataKey() []byte {
	k := make([]byte, KeyBytes)
	_, _ = rand.Read(k) // never fails (crypto/rand panics instead)
	return k
}

// IsSealed says whether a stored value is sealed.
func IsSealed(v string) bool { return strings.HasPrefix(v, SealedPrefix) }

// Seal encrypts text with dataKey, bound to aad.
func Seal(dataKey, aad []byte, text string) (string, error) {
	ct, err := seal(dataKey, aad, []byte(text))
	if err != nil {
		return "", err
	}
	return SealedPrefix + base64.RawStdEncoding.EncodeToString(ct), nil
}

// Open decrypts a sealed value with dataKey and aad.
func Open(dataKey, aad []byte, sealed string) (string, error) {
	if !IsSealed(sealed) {
		return "", fmt.Errorf("%w: not a sealed value", ErrOpen)
	}
	ct, err := base64.RawStdEncoding.DecodeString(sealed[len(SealedPrefix):])
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrOpen, err)
	}
	pt, err := open(dataKey, aad, ct)
	if err != nil {
		return "", err
	}
	return string(pt), nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("keyring: %w", err)
	}
	return cipher.NewGCM(b)
}

func seal(key, aad, pt []byte) ([]byte, error) {
	g, err := gcm(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, g.NonceSize(), g.NonceSize()+len(pt)+g.Overhead())
	_, _ = rand.Read(nonce)
	return g.Seal(nonce, nonce, pt, aad), nil
}

func open(key, aad, ct []byte) ([]byte, error) {
	g, err := gcm(key)
	if err != nil {
		return nil, err
	}
	if len(ct) < g.NonceSize()+g.Overhead() {
		return nil, ErrOpen
	}
	pt, err := g.Open(nil, ct[:g.NonceSize()], ct[g.NonceSize():], aad)
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
}
