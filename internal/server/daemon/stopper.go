package daemon

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/go-multierror"
)

// stopper is the one owner of everything a daemon must stop: each step
// of Start registers what undoes it as soon as it has built it (a
// listener, etcd, a manager, the background goroutines, the servers), and
// stopAll undoes them all in reverse order. A normal Stop and a start
// that failed half-way take the same path: whatever was built is stopped,
// and nothing that was not.
type stopper struct {
	mu    sync.Mutex
	steps []stopStep
}

// stopStep is one registered undo, named for the errors it reports.
type stopStep struct {
	what string
	stop func(ctx context.Context) error
}

// onStop registers stop, which undoes what; stopAll runs it before every
// step registered earlier.
func (s *stopper) onStop(what string, stop func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, stopStep{what: what, stop: stop})
}

// stopAll runs every registered step once, the last registered first,
// and returns their errors, each naming its step. ctx bounds the steps
// that wait (the servers' graceful stop); every step runs even after it
// ends. A second call runs only steps registered since the first.
func (s *stopper) stopAll(ctx context.Context) error {
	s.mu.Lock()
	steps := s.steps
	s.steps = nil
	s.mu.Unlock()
	var errs *multierror.Error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].stop(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("stopping %s: %w", steps[i].what, err))
		}
	}
	return errs.ErrorOrNil()
}

// done makes a step of a func that cannot fail.
func done(f func()) func(context.Context) error {
	return func(context.Context) error {
		f()
		return nil
	}
}
