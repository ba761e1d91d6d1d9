package chaos_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testkit/chaos"
)

// A clean history: two holders one after the other, each writing its
// token; a late write of the first is refused.
func cleanHistory() ([]chaos.Record, []chaos.Write) {
	rec := func(worker, op string, token int64, result string, call, ret int64) chaos.Record {
		return chaos.Record{Worker: worker, Kind: chaos.KindLock, Op: op, Token: token, Result: result, Call: call, Return: ret}
	}
	recs := []chaos.Record{
		rec("a", chaos.OpAcquire, 10, "", 0, 10),
		rec("b", chaos.OpAcquire, 12, "", 5, 40), // waited behind a
		rec("a", chaos.OpPut, 10, chaos.ResultOK, 11, 15),
		rec("a", chaos.OpPut, 10, chaos.ResultUnknown, 16, 20),
		rec("a", chaos.OpView, 10, "", 10, 30),
		rec("b", chaos.OpPut, 12, chaos.ResultOK, 41, 45),
		rec("a", chaos.OpPut, 10, chaos.ResultStale, 46, 50), // a paused holder, too late
		rec("b", chaos.OpView, 12, "", 40, 60),
	}
	writes := []chaos.Write{{Revision: 100, Value: "10"}, {Revision: 101, Value: "10"}, {Revision: 105, Value: "12"}}
	return recs, writes
}

func TestCheckersPassACleanHistory(t *testing.T) {
	recs, writes := cleanHistory()
	if v := chaos.Check(chaos.KindLock, recs, writes, 10*time.Second); len(v) != 0 {
		t.Fatalf("violations in a clean history: %v", v)
	}
}

// Each checker catches the violation its mechanism prevents.
func TestCheckersCatchViolations(t *testing.T) {
	for _, tt := range []struct {
		name    string
		change  func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write)
		checker string
	}{
		{"a late write accepted with an older token (no fencing)", func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write) {
			recs[6].Result = chaos.ResultOK
			return recs, append(writes, chaos.Write{Revision: 106, Value: "10"})
		}, "linearizable-lock"},
		{"the applied history goes back to an older token", func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write) {
			return recs, append(writes, chaos.Write{Revision: 106, Value: "10"})
		}, "write-order-lock"},
		{"a write with a token nobody was granted", func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write) {
			return recs, append(writes, chaos.Write{Revision: 106, Value: "99"})
		}, "write-order-lock"},
		{"grants going backwards", func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write) {
			return append(recs, chaos.Record{Worker: "c", Kind: chaos.KindLock, Op: chaos.OpAcquire, Token: 11, Call: 61, Return: 62}), writes
		}, "linearizable-lock"},
		{"two holders at once in their own views (a client trusting its grant too long)", func(recs []chaos.Record, writes []chaos.Write) ([]chaos.Record, []chaos.Write) {
			recs[4].Return = 42
			return recs, writes
		}, "overlap-lock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			recs, writes := tt.change(cleanHistory())
			vs := chaos.Check(chaos.KindLock, recs, writes, 10*time.Second)
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
	if vs := chaos.Check(chaos.KindLock, recs, writes, 10*time.Second); len(vs) != 1 {
		t.Fatalf("violations %v, want one overlap", vs)
	}
}

func TestConfigCheckerCatchesGapsAndHalves(t *testing.T) {
	seen := func(worker string, release int64, ab string, at int64) chaos.Record {
		return chaos.Record{Worker: worker, Kind: chaos.KindSubscriber, Op: chaos.OpSeen, Token: release, Result: ab, Call: at, Return: at}
	}
	pub := chaos.Record{Worker: "p", Op: chaos.OpPublish, Token: 3, Result: chaos.ResultOK}
	good := []chaos.Record{pub, seen("s", 1, "1,1", 1), seen("s", 3, "3,3", 2)}
	if v := chaos.CheckConfig(good); len(v) != 0 {
		t.Fatalf("a clean sequence: %v", v)
	}
	for name, recs := range map[string][]chaos.Record{
		"older after newer": {pub, seen("s", 3, "3,3", 1), seen("s", 2, "2,2", 2)},
		"half a release":    {pub, seen("s", 2, "2,1", 1)},
		"never published":   {pub, seen("s", 9, "9,9", 1)},
	} {
		if v := chaos.CheckConfig(recs); len(v) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}
