package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Kinds of holdings the workers take.
const (
	KindLock     = "lock"
	KindElection = "election"
)

// Ops a worker records.
const (
	// OpAcquire is a Lock or Campaign call: Token is the grant (0 when it
	// failed).
	OpAcquire = "acquire"
	// OpPut is a fenced write of Token; Result says how it ended.
	OpPut = "put"
	// OpView is the holder's own view of one grant: from when the grant
	// was received (Call) to when the SDK stopped calling it held
	// (Return): its release, the end of its context (Err says why), or
	// the session's local deadline, whichever came first.
	OpView = "view"
	// OpSessionEnd is the end of a worker's session, as its SDK saw it
	// (Return; Err is the cause: the server no longer had it, it expired
	// locally, or it was closed).
	OpSessionEnd = "session-end"
)

// Results of a put.
const (
	ResultOK      = "ok"
	ResultStale   = "stale"   // refused: the token no longer holds
	ResultUnknown = "unknown" // no answer: it may or may not have been applied
)

// Record is one operation of one worker, written as a JSON line when it
// ends. Times are Unix nanoseconds on the host's wall clock, which every
// process of a run shares.
type Record struct {
	Worker  string `json:"worker"`
	Kind    string `json:"kind"`
	Session string `json:"session,omitempty"`
	Op      string `json:"op"`
	Token   int64  `json:"token,omitempty"`
	Result  string `json:"result,omitempty"`
	Err     string `json:"err,omitempty"`
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
}

// recorder appends records to a worker's history file, one line each,
// flushed at once so that a kill -9 loses at most the line being written.
type recorder struct {
	mu sync.Mutex
	f  *os.File
	w  string
	k  string
}

func newRecorder(path, worker, kind string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f, w: worker, k: kind}, nil
}

func (r *recorder) add(rec Record) {
	rec.Worker, rec.Kind = r.w, r.k
	line, _ := json.Marshal(rec) // plain fields: cannot fail
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(line, '\n')) // a lost line only weakens the checks
}

func (r *recorder) close() error { return r.f.Close() }

// ReadHistory reads every worker's history file in dir (*.jsonl), skipping
// a torn last line (a worker killed while writing), sorted by Call.
func ReadHistory(dir string) ([]Record, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r Record
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				out = append(out, r)
			}
		}
		_ = f.Close() // read-only
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Call < out[j].Call })
	return out, nil
}

func now() int64 { return time.Now().UnixNano() }
