package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one safety violation a checker found.
type Violation struct {
	Checker string
	What    string
	// Known, when set, explains the violation by a known limitation
	// outside coordd (see KnownEarlyRevocation); it is reported, not
	// failed.
	Known string
}

func (v Violation) String() string {
	if v.Known != "" {
		return v.Checker + ": " + v.What + " [known: " + v.Known + "]"
	}
	return v.Checker + ": " + v.What
}

// KnownEarlyRevocation explains an overlap of holders' views that follows
// a pause of the etcd-leader member: on resuming, etcd's lessor revokes the
// leases whose expiry passed in its own view from before the pause, though
// the interim leader renewed them. etcd's guard against a stale leader
// (ensureLeadership, etcd issues #12528 and #15247) trusts a member whose
// raft ticks are recent, and a resumed process ticks at once. The holder's
// session then ends on the server before the SDK's local deadline; fenced
// writes still refuse the old holder.
const KnownEarlyRevocation = "etcd revoked the session early after its leader member was paused (etcd #15247: a resumed leader revokes by pre-pause expiry times)"

// earlyRevocationWindow is how soon after a member resumed an overlap is
// taken for KnownEarlyRevocation.
const earlyRevocationWindow = 3 * time.Second

// Write is one write of a fenced key as etcd applied it.
type Write struct {
	Revision int64
	Value    string // the token the writer wrote
}

// Check runs every checker over the records of kind and the applied writes
// of its fenced key, in revision order. resumed lists when paused members
// were resumed (Unix nanoseconds), to tell KnownEarlyRevocation apart.
func Check(kind string, recs []Record, writes []Write, resumed []int64, timeout time.Duration) []Violation {
	var own []Record
	for _, r := range recs {
		if r.Kind == kind {
			own = append(own, r)
		}
	}
	var out []Violation
	out = append(out, CheckLinearizable(kind, own, timeout)...)
	out = append(out, CheckWriteOrder(kind, own, writes)...)
	out = append(out, CheckViews(kind, own, resumed)...)
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
// election this is "never two leaders". An overlap whose earlier holder
// learnt from the server that its session or its grant was gone (not by
// its own release), with the later grant made within 3s after a member in
// resumed was resumed, is marked KnownEarlyRevocation. So is one whose
// earlier holder never heard (its view ended by its own release or
// deadline) but whose session the server is later found not to have: the
// SDK was renewing it, so the server revoked it early.
func CheckViews(kind string, recs []Record, resumed []int64) []Violation {
	var views []Record
	revoked := map[string]int64{} // sessions the server dropped, when the SDK learnt it
	for _, r := range recs {
		switch {
		case r.Op == OpView:
			views = append(views, r)
		case r.Op == OpSessionEnd && endedByServer(r.Err):
			revoked[r.Session] = r.Return
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
			v := Violation{Checker: "overlap-" + kind, What: fmt.Sprintf("%s held token %d until %s after %s's token %d began",
				prev.Worker, prev.Token, time.Duration(prev.Return-cur.Call).Round(time.Microsecond), cur.Worker, cur.Token)}
			at, dropped := revoked[prev.Session]
			told := endedByServer(prev.Err) || prev.Err == "" && dropped && at >= cur.Call && at-cur.Call <= int64(earlyRevocationWindow)
			if told && slices.ContainsFunc(resumed, func(r int64) bool {
				return r <= cur.Call && cur.Call-r <= int64(earlyRevocationWindow)
			}) {
				v.Known = KnownEarlyRevocation
			}
			out = append(out, v)
		}
	}
	return out
}

// endedByServer reports whether a view's end cause says the server ended
// it: the session gone, or the grant reported released (the matrix makes no
// outside releases, so that is an expiry too).
func endedByServer(cause string) bool {
	return strings.Contains(cause, "session not found") || strings.Contains(cause, "the server reports")
}
