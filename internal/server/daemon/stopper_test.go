package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// The stopper undoes steps last first, runs every step even after one
// fails, names the failing step, and runs a step only once.
func TestTheStopperUndoesStepsLastFirst(t *testing.T) {
	t.Parallel()
	var s stopper
	var ran []string
	step := func(name string, err error) {
		s.onStop(name, func(context.Context) error {
			ran = append(ran, name)
			return err
		})
	}
	step("listener", nil)
	step("etcd", errors.New("etcd would not close"))
	step("servers", nil)
	err := s.stopAll(t.Context())
	if want := []string{"servers", "etcd", "listener"}; !slices.Equal(ran, want) {
		t.Fatalf("steps ran in the order %v, want %v", ran, want)
	}
	if err == nil || !strings.Contains(err.Error(), "stopping etcd: etcd would not close") {
		t.Fatalf("stopAll = %v, want the etcd step's error, named", err)
	}
	ran = nil
	step("late", nil)
	if err := s.stopAll(t.Context()); err != nil || !slices.Equal(ran, []string{"late"}) {
		t.Fatalf("a second stopAll ran %v (%v), want only the step registered since the first", ran, err)
	}
}
