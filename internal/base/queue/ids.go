package queue

import (
	"sync"

	"github.com/coordd/coordd/internal/base/names"
)

// IDs lets a member use again the request ids it made up for acquisitions
// (or campaigns) that named none, as REST and coordctl callers do: once
// such a grant is released on this member, the next call of the same
// session for the same name and mode that names no id gets the same one.
// An entry's key is made of its session and request id, and etcd's index
// keeps every key written until compaction: a key written again adds a
// version to one index entry, a new key adds an entry that every read of
// the queue walks. (The Go SDK does the same with its own ids.)
//
// Only ids this member made up are used again, never one a caller chose:
// a caller that chose an id may use it again itself. An id is handed out
// again only after its grant was released, so the call that gets it
// creates a new entry with a new token. It is a best-effort cache: a
// release on another member, a session's end, or a full map forgets ids.
// Safe for concurrent use; the zero value is ready.
type IDs struct {
	mu     sync.Mutex
	issued map[string]issuedID // by entry key
	free   map[idSlot]string
}

// idSlot is what an id is used again for.
type idSlot struct {
	session int64
	name    string
	read    bool
}

type issuedID struct {
	slot idSlot
	id   string
}

// maxIDs bounds each map; a full one is forgotten.
const maxIDs = 100_000

// Take returns an id for a call of session on name (read: a read grant)
// that named none: one released before (reused), or a new one (fresh
// asks for a new one). key maps an id to the entry key it makes, by which
// Released recognizes it.
//
// A reused id must start a new entry: if its key exists when the call
// writes, another call of the session named the id itself meanwhile, and
// the call must not join that one's acquisition: it takes a fresh id.
func (p *IDs) Take(session int64, name string, read, fresh bool, key func(id string) string) (id string, reused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := idSlot{session, name, read}
	id, reused = p.free[s]
	if reused && !fresh {
		delete(p.free, s)
	} else {
		id, reused = names.NewRequestID(), false
	}
	if p.issued == nil || len(p.issued) >= maxIDs {
		p.issued = make(map[string]issuedID)
	}
	p.issued[key(id)] = issuedID{s, id}
	return id, reused
}

// Released tells p that the entry at key is gone: released by a
// successful Release or Resign, or never written (a refused try-lock). If
// Take made up its id, the id may be used again.
func (p *IDs) Released(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	it, ok := p.issued[key]
	if !ok {
		return
	}
	delete(p.issued, key)
	if p.free == nil || len(p.free) >= maxIDs {
		p.free = make(map[idSlot]string)
	}
	p.free[it.slot] = it.id
}
