package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/hashicorp/go-multierror"
	"go.yaml.in/yaml/v3"
)

// Tokens maps bearer tokens, by their SHA-256 hash, to principals. The
// file stores only hashes:
//
//	tokens:
//	  - principal: payments
//	    groups: [services]
//	    sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
//
// (the hash of a token: printf %s "$TOKEN" | sha256sum). Tokens should be
// long and random (32 bytes from a CSPRNG, e.g. openssl rand -hex 32): the
// hash is not salted, which is sound only for tokens nobody can guess.
type Tokens struct {
	byHash map[[sha256.Size]byte]Principal
}

type tokenFile struct {
	Tokens []struct {
		Principal string   `yaml:"principal"`
		Groups    []string `yaml:"groups"`
		SHA256    string   `yaml:"sha256"`
	} `yaml:"tokens"`
}

// ParseTokens parses and validates a token file; any problem refuses the
// whole file, every problem listed.
func ParseTokens(data []byte) (*Tokens, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f tokenFile
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // empty: no tokens, below
		return nil, fmt.Errorf("token file: %w", err)
	}
	var errs *multierror.Error
	t := &Tokens{byHash: map[[sha256.Size]byte]Principal{}}
	for i, e := range f.Tokens {
		at := fmt.Sprintf("token %d", i+1)
		if e.Principal == "" || strings.ContainsAny(e.Principal, " \t\n") {
			errs = multierror.Append(errs, fmt.Errorf("%s: principal %q: want a name without spaces", at, e.Principal))
		}
		h, err := hex.DecodeString(strings.ToLower(strings.TrimSpace(e.SHA256)))
		if err != nil || len(h) != sha256.Size {
			errs = multierror.Append(errs, fmt.Errorf("%s (%s): sha256 must be 64 hex digits, the SHA-256 of the token (printf %%s \"$TOKEN\" | sha256sum)", at, e.Principal))
			continue
		}
		key := [sha256.Size]byte(h)
		if prev, dup := t.byHash[key]; dup {
			errs = multierror.Append(errs, fmt.Errorf("%s (%s): the same token as %s's", at, e.Principal, prev.Name))
			continue
		}
		t.byHash[key] = Principal{Name: e.Principal, Groups: e.Groups}
	}
	if len(f.Tokens) == 0 {
		errs = multierror.Append(errs, errors.New("no tokens"))
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	return t, nil
}

// Lookup returns the principal a token belongs to.
func (t *Tokens) Lookup(token string) (Principal, bool) {
	if t == nil || token == "" {
		return Principal{}, false
	}
	p, ok := t.byHash[sha256.Sum256([]byte(token))]
	return p, ok
}

// HashToken returns the hex SHA-256 of token, as a token file stores it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}
