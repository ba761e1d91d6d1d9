package histcheck_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/histcheck"
)

// A clean history: two holders one after the other, each writing its
// token; a late write of the first is refused.
func cleanHistory() ([]histcheck.Record, []histcheck.Write) {
	rec := func(worker, op string, token int64, result string, call, ret int64) histcheck.Record {
		return histcheck.Record{Worker: worker, Kind: histcheck.KindLock, Op: op, Token: token, Result: result, Call: call, Return: ret}
	}
	recs := []histcheck.Record{
		rec("a", histcheck.OpAcquire, 10, "", 0, 10),
		rec("b", histcheck.OpAcquire, 12, "", 5, 40), // waited behind a
		rec("a", histcheck.OpPut, 10, histcheck.ResultOK, 11, 15),
		rec("a", histcheck.OpPut, 10, histcheck.ResultUnknown, 16, 20),
		rec("a", histcheck.OpView, 10, "", 10, 30),
		rec("b", histcheck.OpPut, 12, histcheck.ResultOK, 41, 45),
		rec("a", histcheck.OpPut, 10, histcheck.ResultStale, 46, 50), // a paused holder, too late
		rec("b", histcheck.OpView, 12, "", 40, 60),
	}
	writes := []histcheck.Write{{Revision: 100, Value: "10"}, {Revision: 101, Value: "10"}, {Revision: 105, Value: "12"}}
	return recs, writes
}

func TestCheckersPassACleanHistory(t *testing.T) {
	recs, writes := cleanHistory()
	if v := histcheck.Check(histcheck.KindLock, recs, writes, 10*time.Second); len(v) != 0 {
		t.Fatalf("violations in a clean history: %v", v)
	}
}

// Each checker catches the violation its mechanism prevents.
func TestCheckersCatchViolations(t *testing.T) {
	for _, tt := range []struct {
		name    string
		change  func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write)
		checker string
	}{
		{"a late write accepted with an older token (no fencing)", func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write) {
			recs[6].Result = histcheck.ResultOK
			return recs, append(writes, histcheck.Write{Revision: 106, Value: "10"})
		}, "linearizable-lock"},
		{"the applied history goes back to an older token", func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write) {
			return recs, append(writes, histcheck.Write{Revision: 106, Value: "10"})
		}, "write-order-lock"},
		{"a write with a token nobody was granted", func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write) {
			return recs, append(writes, histcheck.Write{Revision: 106, Value: "99"})
		}, "write-order-lock"},
		{"grants going backwards", func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write) {
			return append(recs, histcheck.Record{Worker: "c", Kind: histcheck.KindLock, Op: histcheck.OpAcquire, Token: 11, Call: 61, Return: 62}), writes
		}, "linearizable-lock"},
		{"two holders at once in their own views (a client trusting its grant too long)", func(recs []histcheck.Record, writes []histcheck.Write) ([]histcheck.Record, []histcheck.Write) {
			recs[4].Return = 42
			return recs, writes
		}, "overlap-lock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			recs, writes := tt.change(cleanHistory())
			vs := histcheck.Check(histcheck.KindLock, recs, writes, 10*time.Second)
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
	if vs := histcheck.Check(histcheck.KindLock, recs, writes, 10*time.Second); len(vs) != 1 {
		t.Fatalf("violations %v, want one overlap", vs)
	}
}
