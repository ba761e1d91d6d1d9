package api

import (
	"context"
	"math/rand/v2"
	"sync"

	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// KeepAliveStreamHeader is the header metadata key with which a shared
// KeepAliveStream tells its client its id on this member, for the
// keepalive_stream fields of Acquire, TryAcquire, Campaign, Release and
// Resign.
const KeepAliveStreamHeader = "coordd-keepalive-stream"

// KeepAliveStreams are the shared keep-alive streams this member serves,
// by id, so that a grant or leadership made on this member is followed on
// its holder's stream from the moment it is made, instead of after the
// client names it on the stream (one message each way less per grant, and
// no window in which the grant is not followed), and so that the holder's
// own Release or Resign stops following it before it commits (the holder
// is not told of its own release).
//
// Guarantees: a stream follows a grant only for the principal that opened
// it; a grant followed is reported ended exactly as one the client named
// (holdingWatches). Non-guarantees: a stream id is known only on the
// member that serves the stream; a request that names it on another member
// is not followed there (followed is false, and the client names the grant
// itself).
type KeepAliveStreams struct {
	mu   sync.Mutex
	byID map[uint64]*followingStream
}

// followingStream is one registered stream: its watches and the
// principal that opened it.
type followingStream struct {
	principal string
	w         *holdingWatches
}

// NewKeepAliveStreams returns an empty registry.
func NewKeepAliveStreams() *KeepAliveStreams {
	return &KeepAliveStreams{byID: map[uint64]*followingStream{}}
}

// Len is how many streams are registered.
func (k *KeepAliveStreams) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.byID)
}

// register adds a stream and returns its id (never 0) and how to take it
// off again. A nil registry registers nothing and returns 0.
func (k *KeepAliveStreams) register(ctx context.Context, w *holdingWatches) (uint64, func()) {
	if k == nil {
		return 0, func() {}
	}
	fs := &followingStream{principal: PrincipalFrom(ctx).Name, w: w}
	k.mu.Lock()
	defer k.mu.Unlock()
	id := rand.Uint64()
	for id == 0 || k.byID[id] != nil {
		id = rand.Uint64()
	}
	k.byID[id] = fs
	return id, func() {
		k.mu.Lock()
		delete(k.byID, id)
		k.mu.Unlock()
	}
}

// stream returns the stream id that the caller of ctx opened, or nil.
func (k *KeepAliveStreams) stream(ctx context.Context, id uint64) *followingStream {
	if k == nil || id == 0 {
		return nil
	}
	k.mu.Lock()
	fs := k.byID[id]
	k.mu.Unlock()
	if fs == nil || fs.principal != PrincipalFrom(ctx).Name {
		return nil
	}
	return fs
}

// follow has stream id follow h, a holding of session sess just granted,
// and reports whether it does. It never fails the call that made the
// grant: a stream that is gone, another principal's, or a watch that
// cannot start (the read it may need fails or outlasts ctx, the call's)
// is only "not followed", and the client names h itself.
func (k *KeepAliveStreams) follow(ctx context.Context, id uint64, sess session.ID, h *coorddv1.Holding) bool {
	fs := k.stream(ctx, id)
	if fs == nil {
		return false
	}
	watched, err := fs.w.add(ctx, sess, h)
	return err == nil && watched
}

// unfollow has stream id stop following h (its holder gives it up) before
// the release is committed, so the stream does not report it. Should the
// release then fail, the stream no longer follows h: a holder that keeps
// it names it on the stream again (the Go SDK gives h up before it sends
// the release, whatever its outcome).
func (k *KeepAliveStreams) unfollow(ctx context.Context, id uint64, sess session.ID, h *coorddv1.Holding) {
	if fs := k.stream(ctx, id); fs != nil {
		fs.w.remove(sess, h)
	}
}
