package fencing

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// Token is a fencing token: the etcd revision at which a lock was granted.
// Tokens of one lock name strictly increase from grant to grant; grants
// of different names may share a token (coordd commits concurrent changes
// of different locks in one etcd transaction), so a token names a grant
// only together with its lock's name. Zero is never a valid token.
type Token int64

// String formats the token in decimal, the form used in JSON and headers.
func (t Token) String() string { return strconv.FormatInt(int64(t), 10) }

// MarshalText writes the token in decimal, so JSON carries it as a string
// (an int64 does not survive JavaScript), as coordd's REST API does.
func (t Token) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a token written in decimal; see Parse.
func (t *Token) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// Parse reads a token written in decimal. It rejects zero and negatives.
func Parse(s string) (Token, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%w: %q is not a fencing token (a positive decimal integer)", ErrInvalid, s)
	}
	return Token(v), nil
}

var (
	// ErrStale is returned by Guard.Check (and Middleware answers 409) when
	// a token is lower than one the resource has already accepted: its
	// holder has lost the lock.
	ErrStale = errors.New("fencing: stale token")
	// ErrInvalid is returned by Parse and Guard.Check for malformed or
	// non-positive tokens.
	ErrInvalid = errors.New("fencing: invalid token")
)

// Guard remembers, per resource, the highest token it has accepted, and
// rejects lower ones. The zero value is ready to use. It is safe for
// concurrent use; resources are checked independently.
type Guard struct {
	mu        sync.Mutex
	resources map[string]*resource
}

type resource struct {
	mu      sync.Mutex // held across Do's write
	highest Token
}

func (g *Guard) resource(name string) *resource {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resources == nil {
		g.resources = map[string]*resource{}
	}
	r := g.resources[name]
	if r == nil {
		r = &resource{}
		g.resources[name] = r
	}
	return r
}

// Check accepts t for the named resource if t is at least the highest
// token accepted for it so far, and records t. Equal tokens are accepted:
// one grant may write many times. Between Check and the write it protects,
// another request may Check a higher token; when that matters, use Do.
func (g *Guard) Check(name string, t Token) error {
	return g.Do(name, t, func() error { return nil })
}

// Do runs write if t is accepted for the named resource, with the check and
// the write in one critical section of that resource, so no lower token can
// be accepted, and no other write to it run, in between. The token is
// recorded only if write succeeds. It returns ErrStale or ErrInvalid without
// calling write.
func (g *Guard) Do(name string, t Token, write func() error) error {
	if t <= 0 {
		return fmt.Errorf("%w: %d", ErrInvalid, t)
	}
	r := g.resource(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t < r.highest {
		return fmt.Errorf("%w: token %d for %q is below %d, already accepted", ErrStale, t, name, r.highest)
	}
	if err := write(); err != nil {
		return err
	}
	r.highest = t
	return nil
}

// Highest returns the highest token accepted for the named resource, or
// zero.
func (g *Guard) Highest(name string) Token {
	r := g.resource(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.highest
}

// Header is the HTTP header that carries a fencing token.
const Header = "Coordd-Fence-Token"

// SetHeader puts t into r's Coordd-Fence-Token header.
func SetHeader(r *http.Request, t Token) { r.Header.Set(Header, t.String()) }

// FromRequest reads the token from r's Coordd-Fence-Token header.
func FromRequest(r *http.Request) (Token, error) {
	v := r.Header.Get(Header)
	if v == "" {
		return 0, fmt.Errorf("%w: no %s header", ErrInvalid, Header)
	}
	return Parse(v)
}

// Middleware protects next with g: a request whose Coordd-Fence-Token is
// missing or malformed gets 400, one whose token is stale for the resource
// resourceOf names gets 409 Conflict; both are refused before next runs.
// Requests that pass are served one at a time per resource (Guard.Do), so a
// lower token can never be accepted while a higher one is being served.
func Middleware(g *Guard, resourceOf func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := FromRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = g.Do(resourceOf(r), t, func() error {
			next.ServeHTTP(w, r)
			return nil
		})
		if errors.Is(err, ErrStale) {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	})
}
