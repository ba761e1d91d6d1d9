package history_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/fencing/history"
)

// A clean history: two holders one after the other, each writing its
// token; a late write of the first is refused.
func cleanHistory() ([]history.Record, []history.Write) {
	rec := func(worker, op string, token int64, result string, call, ret int64) history.Record {
		return history.Record{Worker: worker, Kind: history.KindLock, Op: op, Token: token, Result: result, Call: call, Return: ret}
	}
	recs := []history.Record{
		rec("a", history.OpAcquire, 10, "", 0, 10),
		rec("b", history.OpAcquire, 12, "", 5, 40), // waited behind a
		rec("a", history.OpPut, 10, history.ResultOK, 11, 15),
		rec("a", history.OpPut, 10, history.ResultUnknown, 16, 20),
		rec("a", history.OpView, 10, "", 10, 30),
		rec("b", history.OpPut, 12, history.ResultOK, 41, 45),
		rec("a", history.OpPut, 10, history.ResultStale, 46, 50), // a paused holder, too late
		rec("b", history.OpView, 12, "", 40, 60),
	}
	writes := []history.Write{{Revision: 100, Value: "10"}, {Revision: 101, Value: "10"}, {Revision: 105, Value: "12"}}
	return recs, writes
}

func TestCheckersPassACleanHistory(t *testing.T) {
	recs, writes := cleanHistory()
	if v := history.Check(history.KindLock, recs, writes, 10*time.Second); len(v) != 0 {
		t.Fatalf("violations in a clean history: %v", v)
	}
}

// Each checker catches the violation its mechanism prevents.
func TestCheckersCatchViolations(t *testing.T) {
	for _, tt := range []struct {
		name    string
		change  func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write)
		checker string
	}{
		{"a late write accepted with an older token (no fencing)", func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write) {
			recs[6].Result = history.ResultOK
			return recs, append(writes, history.Write{Revision: 106, Value: "10"})
		}, "linearizable-lock"},
		{"the applied history goes back to an older token", func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write) {
			return recs, append(writes, history.Write{Revision: 106, Value: "10"})
		}, "write-order-lock"},
		{"a write with a token nobody was granted", func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write) {
			return recs, append(writes, history.Write{Revision: 106, Value: "99"})
		}, "write-order-lock"},
		{"grants going backwards", func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write) {
			return append(recs, history.Record{Worker: "c", Kind: history.KindLock, Op: history.OpAcquire, Token: 11, Call: 61, Return: 62}), writes
		}, "linearizable-lock"},
		{"two holders at once in their own views (a client trusting its grant too long)", func(recs []history.Record, writes []history.Write) ([]history.Record, []history.Write) {
			recs[4].Return = 42
			return recs, writes
		}, "overlap-lock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			recs, writes := tt.change(cleanHistory())
			vs := history.Check(history.KindLock, recs, writes, 10*time.Second)
			found := false
			for _, v := range vs {
				found = found || v.Checker == tt.checker
			}
			if !found {
				t.Fatalf("%s did not report it; violations: %v", tt.checker, vs)
			}
			if !strings.Contains(vs[0].String(), vs[0].Checker) {
				t.Fatalf("violation %q does not name its checker", vs[0])
			}
		})
	}
}

// An overlap is a violation whatever ended the earlier holder's view:
// after a paused etcd leader resumed too (once excused as etcd's early
// revocation; the session clock removed the cause).
func TestOverlapAfterAPausedLeaderIsAViolation(t *testing.T) {
	recs, writes := cleanHistory()
	recs[4].Return, recs[4].Err = 42, "coordd: session not found (the server no longer has it)"
	if vs := history.Check(history.KindLock, recs, writes, 10*time.Second); len(vs) != 1 {
		t.Fatalf("violations %v, want one overlap", vs)
	}
}
