package grantwatch

import (
	"context"
	"sync"
)

// Entry is one incarnation of a watched entry: its key and its create
// revision (a grant's token, a term). A key is written again when a
// session acquires a lock again with the request id of a released
// acquisition, and each incarnation's end is reported on its own.
type Entry struct {
	Key   string
	Token int64
}

// Set is the entries one holder watches, with a report of type R for
// each (what the holder is told when that entry ends). Ends are queued
// until Take and signalled on Ready; an entry is reported at most once,
// and one removed before its end is taken is not reported at all.
// coordd's keep-alive streams each keep one: the entries their client
// names, and the grants made on the stream's member that follow it.
// Safe for concurrent use.
type Set[R any] struct {
	w     *Watcher
	ready chan struct{} // signalled when ended grows

	smu    sync.Mutex
	stops  map[Entry]func() // guarded by smu
	closed bool             // Close ran; guarded by smu

	mu       sync.Mutex
	ended    []R
	keys     []Entry // of ended, to forget their watches
	revoking []R     // entries asked to let go (a revocation mark), not yet taken
}

// NewSet returns an empty set watched through w.
func NewSet[R any](w *Watcher) *Set[R] {
	return &Set[R]{w: w, stops: make(map[Entry]func()), ready: make(chan struct{}, 1)}
}

// Ready is signalled (it holds at most one signal) when an end or a
// revocation is queued.
func (s *Set[R]) Ready() <-chan struct{} { return s.ready }

// Add starts watching e unless it is watched already, and reports whether
// it is watched now (false once Close ran). aliveAt, when not 0, is a
// revision at which e is known to have been alive (see WatchFrom). An
// entry that has already ended is reported at once.
func (s *Set[R]) Add(ctx context.Context, e Entry, aliveAt int64, report R) (bool, error) {
	// smu is held until the watch is stored: an end reported at once (or
	// right after the watch starts) is then taken only after that, and
	// forgets it (Take), instead of leaving it behind.
	s.smu.Lock()
	defer s.smu.Unlock()
	if _, watched := s.stops[e]; watched || s.closed {
		return !s.closed, nil
	}
	stop, err := s.w.WatchRevocable(ctx, e.Key, e.Token, aliveAt, func() {
		s.mu.Lock()
		s.ended = append(s.ended, report)
		s.keys = append(s.keys, e)
		s.mu.Unlock()
		s.signal()
	}, func() {
		s.mu.Lock()
		s.revoking = append(s.revoking, report)
		s.mu.Unlock()
		s.signal()
	})
	if err != nil {
		return false, err
	}
	s.stops[e] = stop
	return true, nil
}

func (s *Set[R]) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// TakeRevoking returns the reports of the entries whose revocation was
// asked for (a revocation mark, see MarkKey) since the last call: their
// holders are to let go. Each entry is in it at most once, before its
// end (if Take reports that).
func (s *Set[R]) TakeRevoking() []R {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.revoking
	s.revoking = nil
	return r
}

// Remove stops watching e and drops its end if that is queued already:
// its holder gives it up and needs no report.
func (s *Set[R]) Remove(e Entry) {
	s.smu.Lock()
	stop := s.stops[e]
	delete(s.stops, e)
	s.smu.Unlock()
	if stop != nil {
		stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(s.keys); i++ {
		if s.keys[i] == e {
			s.keys = append(s.keys[:i], s.keys[i+1:]...)
			s.ended = append(s.ended[:i], s.ended[i+1:]...)
			i--
		}
	}
}

// Take returns the reports of the entries that ended since the last call
// and forgets their watches, so that adding one again watches it anew.
func (s *Set[R]) Take() []R {
	s.mu.Lock()
	ended, keys := s.ended, s.keys
	s.ended, s.keys = nil, nil
	s.mu.Unlock()
	s.smu.Lock()
	for _, k := range keys {
		delete(s.stops, k)
	}
	s.smu.Unlock()
	return ended
}

// Close stops every watch; later Adds watch nothing.
func (s *Set[R]) Close() {
	s.smu.Lock()
	s.closed = true
	stops := s.stops
	s.stops = nil
	s.smu.Unlock()
	for _, stop := range stops {
		stop()
	}
}
