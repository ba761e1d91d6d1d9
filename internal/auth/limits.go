package auth

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits are token buckets on calls that change something: one per
// principal (authenticated callers only: without identities every caller
// would share one bucket), and one per config namespace on releases (the
// guard against release storms, whoever publishes). A zero rate is off.
type Limits struct {
	PerPrincipal      rate.Limit // calls per second that change something
	PrincipalBurst    int
	PublishPerSpace   rate.Limit // config releases per second and namespace
	PublishSpaceBurst int

	mu         sync.Mutex
	principals map[string]*rate.Limiter
	spaces     map[string]*rate.Limiter
}

// limitersCap bounds each map of buckets; a full map starts over (every
// bucket full again), which errs on the side of letting calls through.
const limitersCap = 50_000

// Limited is the refusal of a call over its rate.
type Limited struct {
	What       string        // "principal payments" or "namespace shop/web"
	RetryAfter time.Duration // when a call would be let through again
}

func (l *Limited) Error() string {
	return fmt.Sprintf("rate limit: %s is over its rate; retry in %s", l.What, l.RetryAfter.Round(time.Millisecond))
}

// Allow takes a token from p's bucket for a call that writes (the caller
// says which do: Mutates, and creating or closing a session), and from
// each namespace's publish bucket for a config write; it returns nil, or
// the refusal with its retry hint (taking nothing).
func (l *Limits) Allow(p Principal, a Action, writes bool, namespaces []string) *Limited {
	if l == nil || !writes {
		return nil
	}
	now := time.Now()
	var rs []*rate.Reservation
	refuse := func(what string, r *rate.Reservation) *Limited {
		d := r.DelayFrom(now)
		for _, taken := range rs {
			taken.CancelAt(now)
		}
		r.CancelAt(now)
		return &Limited{What: what, RetryAfter: d}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.PerPrincipal > 0 && !p.IsAnonymous() {
		r := bucket(&l.principals, p.Name, l.PerPrincipal, l.PrincipalBurst).ReserveN(now, 1)
		if !r.OK() || r.DelayFrom(now) > 0 {
			return refuse("principal "+p.Name, r)
		}
		rs = append(rs, r)
	}
	if l.PublishPerSpace > 0 && a == ConfigWrite {
		for _, ns := range namespaces {
			r := bucket(&l.spaces, ns, l.PublishPerSpace, l.PublishSpaceBurst).ReserveN(now, 1)
			if !r.OK() || r.DelayFrom(now) > 0 {
				return refuse("namespace "+ns, r)
			}
			rs = append(rs, r)
		}
	}
	return nil
}

func bucket(m *map[string]*rate.Limiter, key string, r rate.Limit, burst int) *rate.Limiter {
	if *m == nil || len(*m) >= limitersCap {
		*m = map[string]*rate.Limiter{}
	}
	lim, ok := (*m)[key]
	if !ok {
		lim = rate.NewLimiter(r, max(burst, 1))
		(*m)[key] = lim
	}
	return lim
}
