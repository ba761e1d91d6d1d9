package api

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	"github.com/coordd/coordd/internal/base/errkind"
)

// PerPrincipal bounds how many of one resource each authenticated
// principal may hold on this member at once (streams, or config
// subscriptions): each costs the member memory for as long as it lives,
// so one principal could otherwise exhaust a member for everyone. Calls
// without a principal (no authentication configured) are not counted:
// they would all share one bound. The zero value, or Max 0, bounds
// nothing.
type PerPrincipal struct {
	Max int
	// What names the resource and Flag the option that sets Max, for the
	// refusal ("streams", "--max-streams-per-principal").
	What, Flag string
	// Refused, when set, is called once for every refusal (a metric).
	Refused func()

	mu sync.Mutex
	n  map[string]int
}

// take counts k more of the resource for ctx's principal and returns the
// function that gives them back, or fails with errkind.QuotaExceeded (and
// counts nothing) when they would pass Max.
func (q *PerPrincipal) take(ctx context.Context, k int) (release func(), err error) {
	p := PrincipalFrom(ctx)
	if q == nil || q.Max <= 0 || p.IsAnonymous() || k <= 0 {
		return func() {}, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if have := q.n[p.Name]; have+k > q.Max {
		if q.Refused != nil {
			q.Refused()
		}
		return nil, errkind.QuotaExceeded.New(fmt.Sprintf("principal %s has %d %s open on this member, the most it may (%s %d); close some first", p.Name, have, q.What, q.Flag, q.Max))
	}
	if q.n == nil {
		q.n = map[string]int{}
	}
	q.n[p.Name] += k
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.n[p.Name] -= k; q.n[p.Name] <= 0 {
				delete(q.n, p.Name)
			}
		})
	}, nil
}

// Held returns how many of the resource principal holds now.
func (q *PerPrincipal) Held(principal string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n[principal]
}

// StreamQuota counts every stream an authenticated principal opens on this
// member (lock and election watches, observes, config watches and
// WatchMany, keep-alive and call streams, follows) against q, and refuses
// one past q.Max with QUOTA_EXCEEDED (ResourceExhausted) before its
// handler runs. It must run after authentication.
func StreamQuota(q *PerPrincipal) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, err := q.take(ss.Context(), 1)
		if err != nil {
			return err
		}
		defer release()
		return handler(srv, ss)
	}
}

// subscriptions counts one WatchMany stream's live watches against a
// principal's quota of subscriptions: a watch counts from its start until
// the client stops it or the stream ends (one that fails on the server's
// side stays counted until then).
type subscriptions struct {
	ctx  context.Context
	q    *PerPrincipal
	live map[int64]func()
}

func (s *subscriptions) start(id int64) error {
	if _, ok := s.live[id]; ok {
		return nil // a restart of a live watch: counted already
	}
	release, err := s.q.take(s.ctx, 1)
	if err != nil {
		return err
	}
	if s.live == nil {
		s.live = map[int64]func(){}
	}
	s.live[id] = release
	return nil
}

func (s *subscriptions) stop(id int64) {
	if release, ok := s.live[id]; ok {
		release()
		delete(s.live, id)
	}
}

func (s *subscriptions) close() {
	for id := range s.live {
		s.stop(id)
	}
}
