package election

import (
	"context"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/queue"
)

// waitSeat waits until the seat seatKey is created (its create revision,
// the term, and the revision at which it was seen), the candidacy key is
// deleted (queue.ErrEntryGone) or ctx ends. It follows the election
// through the member's shared watch, and reads etcd once at the start and
// after the watch restarts. Whenever it sees the seat free after a change,
// it asks this member to give the seat (kick): a session's end frees the
// seat with nobody to choose the successor. onSeat, if set, is called with
// every other seat it sees created, and with the seat each read finds (so
// it must not mind being called twice for one seat).
func (m *Manager) waitSeat(ctx context.Context, name, key, seatKey string, onSeat func(*mvccpb.KeyValue)) (term, rev int64, err error) {
	feed, _ := m.dels.Subscribe(m.prefix(name), true)
	defer feed.Stop()
	seats, q := m.seats(name), m.queue(name)
	var free bool
	var seen int64 // the revision the last read reflects
	check := func() (bool, error) {
		resp, err := m.cli.Txn(ctx).Then(clientv3.OpGet(seatKey), clientv3.OpGet(key, clientv3.WithKeysOnly()), m.seatsOp(name)).Commit()
		if err != nil {
			return false, fmt.Errorf("election: campaign %q: %w", name, err)
		}
		seen = resp.Header.Revision
		if kv := first(resp.Responses[0].GetResponseRange().Kvs); kv != nil {
			term, rev = kv.CreateRevision, seen
			return true, nil
		}
		if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
			return true, queue.ErrEntryGone
		}
		seat := first(resp.Responses[2].GetResponseRange().Kvs)
		free = seat == nil
		switch {
		case free:
			m.kick(name)
		case onSeat != nil:
			onSeat(seat) // it may have been created before the feed began
		}
		return false, nil
	}
	// Subscribed before the read: every change after it comes through
	// the feed.
	if done, err := check(); done || err != nil {
		return term, rev, err
	}
	for {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-feed.Ready():
		}
		evs, restarted := feed.Take()
		if restarted != 0 {
			if done, err := check(); done || err != nil {
				return term, rev, err
			}
			continue
		}
		changed := false
		for _, ev := range evs {
			if ev.Kv.ModRevision <= seen {
				continue // the read reflects it
			}
			k := string(ev.Kv.Key)
			switch {
			case k == seatKey && ev.Type == mvccpb.PUT:
				return ev.Kv.CreateRevision, ev.Kv.ModRevision, nil
			case k == key && ev.Type == mvccpb.DELETE:
				return 0, 0, queue.ErrEntryGone
			case strings.HasPrefix(k, seats):
				free, changed = ev.Type == mvccpb.DELETE, true
				if onSeat != nil && ev.IsCreate() {
					onSeat(ev.Kv)
				}
			case strings.HasPrefix(k, q) && ev.Type == mvccpb.DELETE:
				changed = true // a promotion may have failed on it
			}
		}
		if free && changed {
			m.kick(name)
		}
	}
}
