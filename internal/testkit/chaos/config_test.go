package chaos_test

import (
	"testing"

	"github.com/coordd/coordd/internal/testkit/chaos"
)

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
		// The same in the gated namespace, by its own checker.
		var gated []chaos.Record
		for _, r := range recs {
			switch r.Op {
			case chaos.OpSeen:
				r.Op = chaos.OpSeenApproved
			case chaos.OpPublish:
				r.Op = chaos.OpPublishApproved
			}
			gated = append(gated, r)
		}
		if v := chaos.CheckConfig(gated); len(v) == 0 || v[0].Checker != "config-approved" {
			t.Errorf("%s in the gated namespace: %v", name, v)
		}
	}
}
