package api

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/coordd/coordd/internal/session"
)

// PageTokenKeyBytes is the size of the key that seals ListSessions' page
// tokens.
const PageTokenKeyBytes = 32

// pageSealer turns the id of the last session a ListSessions page read
// into a page token that does not reveal it: that session may be another
// principal's, which the caller may not see. Every member seals with the
// same key (kept in etcd), so a next page may be asked of any member.
type pageSealer struct{ aead cipher.AEAD }

func newPageSealer(key []byte) (*pageSealer, error) {
	if len(key) != PageTokenKeyBytes {
		return nil, fmt.Errorf("page token key: %d bytes, want %d", len(key), PageTokenKeyBytes)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &pageSealer{aead: aead}, nil
}

var (
	pageTokenContext     = []byte("coordd ListSessions page token")
	lockPageTokenContext = []byte("coordd DescribeLock page token")
)

func (p *pageSealer) seal(id session.ID) string { return p.sealFor(pageTokenContext, uint64(id)) }

func (p *pageSealer) open(token string) (session.ID, error) {
	v, err := p.openFor(pageTokenContext, token)
	return session.ID(v), err
}

// sealFor seals v for one use (purpose): a token sealed for one opens
// for no other.
func (p *pageSealer) sealFor(purpose []byte, v uint64) string {
	nonce := make([]byte, p.aead.NonceSize())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails
	plain := binary.BigEndian.AppendUint64(nil, v)
	return base64.RawURLEncoding.EncodeToString(p.aead.Seal(nonce, nonce, plain, purpose))
}

func (p *pageSealer) openFor(purpose []byte, token string) (uint64, error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < p.aead.NonceSize() {
		return 0, errors.New("malformed")
	}
	plain, err := p.aead.Open(nil, b[:p.aead.NonceSize()], b[p.aead.NonceSize():], purpose)
	if err != nil || len(plain) != 8 {
		return 0, errors.New("not sealed by this cluster")
	}
	return binary.BigEndian.Uint64(plain), nil
}
