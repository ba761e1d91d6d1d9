package configcenter

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-multierror"

	"github.com/coordd/coordd/internal/base/errkind"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrInvalid: a malformed argument (namespace, key, revision, schema);
	// nothing changed.
	ErrInvalid = errkind.Invalid.New("config: invalid argument")
	// ErrTooLarge: a value or release over its limit; nothing changed.
	ErrTooLarge = errkind.TooLarge.New("config: too large")
	// ErrValidation: the namespace's content would not match its JSON
	// Schema; nothing changed.
	ErrValidation = errkind.ValidationFailed.New("config: validation failed")
	// ErrRevisionMismatch: a compare-and-set found the namespace changed
	// after the expected revision; nothing changed.
	ErrRevisionMismatch = errkind.RevisionMismatch.New("config: revision mismatch")
	// ErrKeyNotFound: the key does not exist.
	ErrKeyNotFound = errkind.KeyNotFound.New("config: key not found")
	// ErrReleaseNotFound: the release does not exist, or is older than the
	// history kept.
	ErrReleaseNotFound = errkind.ReleaseNotFound.New("config: release not found")
	// ErrCompacted: a read at a revision etcd has compacted away.
	ErrCompacted = errkind.Compacted.New("config: revision compacted")
	// ErrBehind: the watch cache could not reach a revision a caller has
	// already seen (this member lags); retry, possibly on another member.
	ErrBehind = errkind.Unavailable.New("config: this member is behind the requested revision")
	// ErrStopped: the watch cache stopped (the daemon is shutting down);
	// subscribers and readers get it once Cache.Run has returned.
	ErrStopped = errkind.Unavailable.New("config: the watch cache stopped")
)

// Problem is one thing wrong with a write.
type Problem struct {
	Key     string // the key it concerns; empty for the whole write
	Message string
}

func (p *Problem) Error() string {
	if p.Key == "" {
		return p.Message
	}
	return fmt.Sprintf("key %q: %s", p.Key, p.Message)
}

// ValidationError lists every problem found in a write, so a caller can
// fix them all at once. It matches ErrInvalid, ErrTooLarge or
// ErrValidation (schema violations) with errors.Is.
type ValidationError struct {
	kind     error
	problems []*Problem
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.problems))
	for i, p := range e.problems {
		msgs[i] = p.Error()
	}
	return fmt.Sprintf("%v: %d problem(s): %s", e.kind, len(msgs), strings.Join(msgs, "; "))
}

// Unwrap returns the error's kind.
func (e *ValidationError) Unwrap() error { return e.kind }

// Problems returns every problem found.
func (e *ValidationError) Problems() []Problem {
	out := make([]Problem, len(e.problems))
	for i, p := range e.problems {
		out[i] = *p
	}
	return out
}

// FieldViolations returns the problems as (field, description) pairs, the
// shape of google.rpc.BadRequest.
func (e *ValidationError) FieldViolations() [][2]string {
	out := make([][2]string, len(e.problems))
	for i, p := range e.problems {
		out[i] = [2]string{p.Key, p.Message}
	}
	return out
}

// problems turns collected problems into a ValidationError of kind
// ErrInvalid (ErrTooLarge if tooLarge), or nil if there are none.
func problems(errs *multierror.Error, tooLarge bool) error {
	return problemsOf(errs, map[bool]error{false: ErrInvalid, true: ErrTooLarge}[tooLarge])
}

func problemsOf(errs *multierror.Error, kind error) error {
	if errs.ErrorOrNil() == nil {
		return nil
	}
	v := &ValidationError{kind: kind}
	for _, err := range errs.Errors {
		if len(v.problems) == MaxProblems {
			v.problems = append(v.problems, &Problem{Message: fmt.Sprintf("and %d more problems (only the first %d are reported)", len(errs.Errors)-MaxProblems, MaxProblems)})
			break
		}
		var p *Problem
		if !errors.As(err, &p) {
			p = &Problem{Message: err.Error()}
		}
		if len(p.Message) > maxProblemBytes {
			p = &Problem{Key: p.Key, Message: strings.ToValidUTF8(p.Message[:maxProblemBytes], "") + "..."}
		}
		v.problems = append(v.problems, p)
	}
	return v
}
