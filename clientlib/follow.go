package clientlib

import (
	"context"
	"time"
)

// follow runs a server stream that resumes from a revision (Observe,
// WatchKV): it opens it from from, hands every message to deliver (which
// passes its events on, and fails only when ctx ends), and when the stream
// breaks reopens it (on any endpoint) after the last revision delivered,
// with jittered backoff, so nothing is skipped or repeated. It returns
// ctx's error, deliver's, or an error permanent says retrying cannot fix.
func follow[M interface{ GetRevision() int64 }](ctx context.Context, from int64,
	open func(ctx context.Context, from int64) (recv func() (M, error), err error),
	deliver func(M) error, permanent func(error) bool) error {
	backoff := 50 * time.Millisecond
	for {
		recv, err := open(ctx, from)
		for err == nil {
			var msg M
			if msg, err = recv(); err != nil {
				break
			}
			if err := deliver(msg); err != nil {
				return err
			}
			from = msg.GetRevision() + 1
			backoff = 50 * time.Millisecond
		}
		err = convert(ctx, err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if permanent(err) {
			return err
		}
		// Anything else (a member stopping, no quorum, a broken connection)
		// is retried: the resume point is kept.
		if !pause(ctx, jittered(backoff)) {
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
