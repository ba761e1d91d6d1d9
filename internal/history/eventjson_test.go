package history

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// appendJSON must read back as encoding/json's encoding of the same event
// does, whatever its strings hold.
func TestEventJSONMatchesEncodingJSON(t *testing.T) {
	pieces := []string{"", "a", "lock/x", `"`, `\`, "\n", "\r\t", "\x00", "\x1f", "\x7f", "é", "日本", "\u2028", "\xff", "\xc3", "a\xe2\x82", "<&>", "😀"}
	rng := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		s := ""
		for range rng.IntN(4) {
			s += pieces[rng.IntN(len(pieces))]
		}
		return s
	}
	num := func() int64 {
		switch rng.IntN(3) {
		case 0:
			return 0
		case 1:
			return rng.Int64N(1000)
		}
		return -rng.Int64()
	}
	for i := range 5000 {
		e := Event{Kind: Kind(str()), Name: str(), Type: Type(str()), Token: num(), Session: str(), Owner: str(),
			Principal: str(), Hostname: str(), RequestID: str(), Read: rng.IntN(2) == 0, Reason: str(),
			Revision: num(), FromRevision: num(), Time: time.Unix(rng.Int64N(1<<33), rng.Int64N(1e9)).In(time.FixedZone("z", int(num()%50000))),
			HandedFrom: num(), Waited: time.Duration(num()), Held: time.Duration(num())}
		if i%7 == 0 {
			e.Time = e.Time.UTC()
		}
		ours := e.appendJSON(nil)
		theirs, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		var a, b Event
		if err := json.Unmarshal(ours, &a); err != nil {
			t.Fatalf("%s does not decode: %v", ours, err)
		}
		if err := json.Unmarshal(theirs, &b); err != nil {
			t.Fatal(err)
		}
		if !a.Time.Equal(b.Time) {
			t.Fatalf("time %v, want %v (%s)", a.Time, b.Time, ours)
		}
		a.Time, b.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("decoded\n %+v\nwant\n %+v\nfrom %s\n and %s", a, b, ours, theirs)
		}
	}
}
