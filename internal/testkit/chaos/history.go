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

	"github.com/coordd/coordd/internal/histcheck"
)

// The history's types are fencing/histcheck's.
type (
	// Record is histcheck.Record: one operation of one worker.
	Record = histcheck.Record
	// Violation is histcheck.Violation.
	Violation = histcheck.Violation
	// Write is histcheck.Write: one write of a fenced key as etcd applied it.
	Write = histcheck.Write
)

// Kinds, ops and results, as fencing/histcheck names them.
const (
	KindLock      = histcheck.KindLock
	KindElection  = histcheck.KindElection
	OpAcquire     = histcheck.OpAcquire
	OpPut         = histcheck.OpPut
	OpView        = histcheck.OpView
	OpSessionEnd  = histcheck.OpSessionEnd
	ResultOK      = histcheck.ResultOK
	ResultStale   = histcheck.ResultStale
	ResultUnknown = histcheck.ResultUnknown
)

// Check runs fencing/histcheck's checkers over the records of kind and the
// applied writes of its fenced key.
func Check(kind string, recs []Record, writes []Write, timeout time.Duration) []Violation {
	return histcheck.Check(kind, recs, writes, timeout)
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
	rec.Worker = r.w
	if rec.Kind == "" {
		rec.Kind = r.k
	}
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
