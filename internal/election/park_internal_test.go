package election

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/queue"
)

// A parked campaign whose first read has not come back yet must not take
// the end of an earlier candidacy of its key (the same session and request
// id: a session campaigning again under the id of the leadership it just
// handed over), which the election's watch may still deliver, for its own;
// nor an earlier seat of its key for its election. It takes the changes
// after the campaign read its candidacy. (Seen as "the candidate's session
// ended while it waited" after a Transfer in TestTheOldHolderKnowsFirst.)
func TestAParkedCampaignIgnoresChangesOlderThanItsCandidacy(t *testing.T) {
	m := &Manager{root: "/e/"}
	key, seatKey := m.queue("x")+"s/r/0", m.seats("x")+"s/r"
	const readAt = 100
	var outcomes []error
	var terms []int64
	park := func() (*seatWatch, *parkedSeat) {
		p := newParkedSeat(key, seatKey, readAt, nil, func(term, _ int64, err error) {
			terms, outcomes = append(terms, term), append(outcomes, err)
		})
		w := &seatWatch{m: m, name: "x", wake: make(chan struct{}, 1), byEntry: map[string]*parkedSeat{key: p},
			bySeat: map[string]*parkedSeat{seatKey: p}, asking: map[*parkedSeat]bool{}}
		return w, p
	}
	ev := func(typ mvccpb.Event_EventType, k string, created, mod int64) *clientv3.Event {
		return &clientv3.Event{Type: typ, Kv: &mvccpb.KeyValue{Key: []byte(k), CreateRevision: created, ModRevision: mod}}
	}

	w, _ := park()
	w.apply([]*clientv3.Event{ev(mvccpb.PUT, seatKey, 90, 90), ev(mvccpb.DELETE, key, 0, 95)})
	if len(outcomes) != 0 {
		t.Fatalf("changes older than the candidacy ended the parked campaign: terms %v, errors %v", terms, outcomes)
	}

	w.apply([]*clientv3.Event{ev(mvccpb.DELETE, key, 0, 101)})
	if len(outcomes) != 1 || !errors.Is(outcomes[0], queue.ErrEntryGone) {
		t.Fatalf("the candidacy's own end: %v; want ErrEntryGone", outcomes)
	}
	w, _ = park()
	outcomes, terms = nil, nil
	w.apply([]*clientv3.Event{ev(mvccpb.PUT, seatKey, 102, 102)})
	if len(outcomes) != 1 || outcomes[0] != nil || terms[0] != 102 {
		t.Fatalf("its own seat: terms %v, errors %v; want term 102", terms, outcomes)
	}
}
