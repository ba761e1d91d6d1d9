package api

import (
	"context"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// A stream follows grants only for the principal that opened it, only
// while it is registered; a holder's remove drops an end that is queued
// already, so the holder is not told of its own release.
func TestAStreamFollowsOnlyItsPrincipalsGrants(t *testing.T) {
	cli, locks, hw := watchesOnEtcd(t)
	ctx := t.Context()

	as := func(name string) context.Context {
		return context.WithValue(ctx, principalKey{}, auth.Principal{Name: name})
	}
	streams := NewKeepAliveStreams()
	id, unregister := streams.register(as("alice"), hw)
	sess := session.ID(0x1234)
	grant := func(name string) *coorddv1.Holding {
		key, err := locks.EntryKey(name, sess, "r1")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Put(ctx, key, "v")
		if err != nil {
			t.Fatal(err)
		}
		return &coorddv1.Holding{Kind: coorddv1.Holding_KIND_LOCK, Name: name, Token: resp.Header.Revision, RequestId: "r1", Revision: resp.Header.Revision}
	}
	release := func(h *coorddv1.Holding) {
		key, _ := locks.EntryKey(h.GetName(), sess, "r1")
		if _, err := cli.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}

	if streams.follow(as("bob"), id, sess, grant("bobs")) {
		t.Error("bob's grant is followed on alice's stream")
	}
	mine := grant("alices")
	if !streams.follow(as("alice"), id, sess, mine) {
		t.Fatal("alice's grant is not followed on her stream")
	}
	release(mine)
	select {
	case <-hw.Ready():
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("the release of a followed grant was not reported within 10s")
	}
	// Its end is queued; the holder's remove (as a Release naming the
	// stream does, had it come first) drops it.
	streams.unfollow(as("alice"), id, sess, mine)
	if got := hw.Take(); len(got) != 0 {
		t.Errorf("ended %v after the holder's remove; want nothing", got)
	}
	unregister()
	if streams.follow(as("alice"), id, sess, grant("after")) {
		t.Error("a grant is followed on a stream that is no longer registered")
	}
	var none *KeepAliveStreams
	if none.follow(as("alice"), id, sess, mine) {
		t.Error("a nil registry follows a grant")
	}
}
