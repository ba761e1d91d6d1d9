// Package histcheck records what clients of a lock or an election saw
// (grants with their tokens, fenced writes and how they ended, each
// holder's own view of its grant) and checks such a history for the
// violations fencing exists to prevent: porcupine for linearizability of
// grants and fenced writes, the order of the writes the resource applied,
// and overlaps of the holders' views (two holders, two leaders).
//
// The fault matrix (internal/testkit/chaos) checks its workers' histories
// with it, and coordctl verify a live cluster's.
//
// A history that passes is evidence, not proof: the checks see only the
// operations recorded, and an overlap of views is measured on the shared
// clock, so clocks that disagree by more than the overlap hide it.
package histcheck

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kinds of holdings.
const (
	KindLock     = "lock"
	KindElection = "election"
)

// Ops a client records.
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

// Record is one operation of one client (a worker). Times are Unix
// nanoseconds on a clock every client of the history shares (one host's
// wall clock, or one process's).
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

// Violation is one safety violation a checker found.
type Violation struct {
	Checker string
	What    string
}

func (v Violation) String() string { return v.Checker + ": " + v.What }

// Write is one write of a fenced key as etcd applied it.
type Write struct {
	Revision int64
	Value    string // the token the writer wrote
}

// Check runs every checker over the records of kind and the applied writes
// of its fenced key, in revision order.
func Check(kind string, recs []Record, writes []Write, timeout time.Duration) []Violation {
	var own []Record
	for _, r := range recs {
		if r.Kind == kind {
			own = append(own, r)
		}
	}
	var out []Violation
	out = append(out, CheckLinearizable(kind, own, timeout)...)
	out = append(out, CheckWriteOrder(kind, own, writes)...)
	out = append(out, CheckViews(kind, own)...)
	return out
}

// grantState is the model's state: the latest grant and the token of the
// latest accepted write.
type grantState struct{ granted, written int64 }

type grantInput struct {
	op    string
	token int64
}

// grantModel is the lock (or election) as its clients see it: grants carry
// strictly increasing tokens, and a fenced write is accepted only with the
// token of a grant already made and not older than the last accepted
// write's. A refused write changes nothing and is always possible (the
// grant may have ended unseen: an expiry is nobody's operation), and a
// write with no answer may or may not have happened.
var grantModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{grantState{}} },
	Step: func(state, input, output any) []any {
		s, in, res := state.(grantState), input.(grantInput), output.(string)
		switch {
		case in.op == OpAcquire:
			if in.token > s.granted {
				return []any{grantState{granted: in.token, written: s.written}}
			}
			return nil
		case res == ResultStale:
			return []any{s}
		}
		next := []any{}
		if res == ResultUnknown {
			next = append(next, s)
		}
		if in.token >= s.written && in.token <= s.granted {
			next = append(next, grantState{granted: s.granted, written: in.token})
		}
		return next
	},
	Equal: func(a, b any) bool { return a.(grantState) == b.(grantState) },
	DescribeOperation: func(input, output any) string {
		in := input.(grantInput)
		return fmt.Sprintf("%s(%d) -> %v", in.op, in.token, output)
	},
}

// CheckLinearizable checks with porcupine that the grants and fenced writes
// of recs have a linearization under grantModel. Failed acquisitions are
// left out (they changed nothing a client saw); a write with no answer may
// take effect any time after its call.
func CheckLinearizable(kind string, recs []Record, timeout time.Duration) []Violation {
	var ops []porcupine.Operation
	for _, r := range recs {
		switch {
		case r.Op == OpAcquire && r.Token > 0:
			ops = append(ops, porcupine.Operation{Input: grantInput{OpAcquire, r.Token}, Call: r.Call, Output: ResultOK, Return: r.Return})
		case r.Op == OpPut:
			ret := r.Return
			if r.Result == ResultUnknown {
				ret = math.MaxInt64
			}
			ops = append(ops, porcupine.Operation{Input: grantInput{OpPut, r.Token}, Call: r.Call, Output: r.Result, Return: ret})
		}
	}
	switch porcupine.CheckOperationsTimeout(grantModel.ToModel(), ops, timeout) {
	case porcupine.Illegal:
		return []Violation{{Checker: "linearizable-" + kind, What: fmt.Sprintf("the %d grants and fenced writes have no linearization: a write was accepted with a token that did not hold, or grants went backwards", len(ops))}}
	case porcupine.Unknown:
		return []Violation{{Checker: "linearizable-" + kind, What: fmt.Sprintf("porcupine gave up after %s on %d operations: inconclusive", timeout, len(ops))}}
	}
	return nil
}

// CheckWriteOrder checks the fenced key's applied writes: in revision order
// their tokens never go backwards, and each was a granted token.
func CheckWriteOrder(kind string, recs []Record, writes []Write) []Violation {
	granted := map[int64]bool{}
	for _, r := range recs {
		if r.Op == OpAcquire && r.Token > 0 {
			granted[r.Token] = true
		}
	}
	var out []Violation
	highest := int64(0)
	for _, w := range writes {
		tok, err := strconv.ParseInt(w.Value, 10, 64)
		if err != nil {
			out = append(out, Violation{Checker: "write-order-" + kind, What: fmt.Sprintf("revision %d: value %q is no token", w.Revision, w.Value)})
			continue
		}
		if tok < highest {
			out = append(out, Violation{Checker: "write-order-" + kind, What: fmt.Sprintf("revision %d: accepted a write with token %d after one with token %d", w.Revision, tok, highest)})
		}
		if !granted[tok] {
			out = append(out, Violation{Checker: "write-order-" + kind, What: fmt.Sprintf("revision %d: token %d was never granted to a worker", w.Revision, tok)})
		}
		highest = max(highest, tok)
	}
	return out
}

// CheckViews checks that no two grants were held at once in their holders'
// own (SDK) view: each view ends before the next one begins. For an
// election this is "never two leaders".
func CheckViews(kind string, recs []Record) []Violation {
	var views []Record
	for _, r := range recs {
		if r.Op == OpView {
			views = append(views, r)
		}
	}
	slices.SortFunc(views, func(a, b Record) int { return cmp.Compare(a.Token, b.Token) })
	var prev Record
	var out []Violation
	for i := 1; i < len(views); i++ {
		// prev: the earlier view that ended last.
		if i == 1 || views[i-1].Return > prev.Return {
			prev = views[i-1]
		}
		cur := views[i]
		if cur.Call < prev.Return {
			out = append(out, Violation{Checker: "overlap-" + kind, What: fmt.Sprintf("%s held token %d until %s after %s's token %d began",
				prev.Worker, prev.Token, time.Duration(prev.Return-cur.Call).Round(time.Microsecond), cur.Worker, cur.Token)})
		}
	}
	return out
}
