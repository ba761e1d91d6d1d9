package history

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/base/names"
	"github.com/coordd/coordd/internal/base/revoke"
)

// ErrInvalid is returned by Store.List for a malformed query (a bad name,
// kind, page token or range); nothing was read.
var ErrInvalid = errkind.Invalid.New("history: invalid argument")

// Kind is what an event is about.
type Kind string

// Kinds.
const (
	Lock     Kind = "lock"
	Election Kind = "election"
)

// Type is what happened.
type Type string

// Types. A grant of a lock is GRANTED, of an election ELECTED; every grant
// is followed, once it ends, by exactly one of the ends.
const (
	Granted Type = "GRANTED" // a lock was granted (Token)
	Elected Type = "ELECTED" // a candidate came to lead (Token is the term)
	// Released: the holder released the lock (or an operator did for it).
	Released Type = "RELEASED"
	// Resigned: the leader resigned.
	Resigned Type = "RESIGNED"
	// Expired: the holder's session was not renewed within its TTL and
	// coordd ended it (Reason names the member that did).
	Expired Type = "EXPIRED"
	// SessionClosed: the holder's session was closed, or its etcd lease
	// ended without coordd ending it first.
	SessionClosed Type = "SESSION_CLOSED"
	// Removed: a leader's candidacy was deleted without a resignation
	// (its campaign abandoned, or a resignation when etcd was full).
	Removed Type = "REMOVED"
	// Gap: the recorder could not see revisions FromRevision..Revision
	// (etcd had compacted them); events in them are missing.
	Gap Type = "GAP"
)

// Event is one entry of the history.
type Event struct {
	Kind Kind   `json:"kind,omitempty"`
	Name string `json:"name,omitempty"`
	Type Type   `json:"type"`
	// Token is the grant's fencing token, or the leadership's term.
	Token     int64  `json:"token,omitempty"`
	Session   string `json:"session,omitempty"` // 16 hex digits
	Owner     string `json:"owner,omitempty"`
	Principal string `json:"principal,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Read      bool   `json:"read,omitempty"` // a shared (read) grant
	// Reason says why a grant ended, in words.
	Reason string `json:"reason,omitempty"`
	// Revision is the etcd revision of the event.
	Revision int64 `json:"revision"`
	// FromRevision is the first revision a Gap missed.
	FromRevision int64     `json:"from_revision,omitempty"`
	Time         time.Time `json:"time"`
	// HandedFrom is, on a grant, the token (term) whose end in the same
	// revision let it in: a hand-off. 0 when the lock was free.
	HandedFrom int64 `json:"handed_from,omitempty"`
	// Waited is, on a grant, how long its entry queued first.
	Waited time.Duration `json:"waited,omitempty"`
	// Held is, on an end, how long the grant lasted.
	Held time.Duration `json:"held,omitempty"`
	// Revocation is, on an end from outside (a release or resignation
	// that did not come from the holder), how the holder was told:
	// acknowledged, bound or forced (package revoke).
	Revocation revoke.Outcome `json:"revocation,omitempty"`
	// RevokeWaited is how long such an end waited for the holder, from
	// when the recorder saw the request.
	RevokeWaited time.Duration `json:"revoke_waited,omitempty"`

	seq   int    // the event's place within its revision
	named string // its lock's or election's n/ prefix (keys.named), when derived
}

// suffix is the event's key below t/ and n/<kind>/<name>/: time, revision
// and place, so that keys sort in time order.
func (e *Event) suffix() string {
	return fmt.Sprintf("%016x-%016x-%04x", uint64(e.Time.UnixNano()), uint64(e.Revision), e.seq)
}

// timeKey is the smallest suffix at or after t.
func timeKey(t time.Time) string {
	if t.IsZero() || t.UnixNano() < 0 {
		return ""
	}
	return fmt.Sprintf("%016x", uint64(t.UnixNano()))
}

// suffixTime is the time a suffix starts with.
func suffixTime(s string) (time.Time, bool) {
	head, _, _ := strings.Cut(s, "-")
	n, err := strconv.ParseUint(head, 16, 64)
	if err != nil || len(head) != 16 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(n)), true
}

func (k Kind) valid() bool { return k == Lock || k == Election }

func checkName(k Kind, name string) error {
	if !k.valid() {
		return fmt.Errorf("%w: kind %q is neither %q nor %q", ErrInvalid, k, Lock, Election)
	}
	if name == "" {
		return nil
	}
	if err := names.Check(string(k)+" name", name); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return nil
}
