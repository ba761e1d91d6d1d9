package daemon_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/api"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// reqID is a request id made of a name ('/' is not allowed in ids).
func reqID(name string) string { return "r-" + strings.ReplaceAll(name, "/", ".") }

// A grant or leadership whose request names the holder's keep-alive
// stream is followed there from the moment it is made: its end from
// outside is reported on the stream although the stream never named it,
// and the holder's own release or resignation that names the stream is
// not reported to it. A stream the member does not serve follows nothing.
func TestGrantsAreFollowedOnTheStreamTheyName(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	ctx := t.Context()
	c := newClient(t, d.GRPCAddr())
	sess, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	conn := dialRaw(t, d.GRPCAddr())
	locks, elections := coorddv1.NewLockServiceClient(conn), coorddv1.NewElectionServiceClient(conn)
	st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := st.Header()
	if err != nil {
		t.Fatal(err)
	}
	v := md.Get(api.KeepAliveStreamHeader)
	if len(v) != 1 {
		t.Fatalf("stream header %v: no %s", md, api.KeepAliveStreamHeader)
	}
	id, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil || id == 0 {
		t.Fatalf("stream id %q: %v", v[0], err)
	}
	// The stream's reports of ended holdings; the receiver ends with the
	// test's context.
	reports := make(chan []*coorddv1.Holding, 16)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			if len(resp.GetEnded()) > 0 {
				reports <- resp.GetEnded()
			}
		}
	}()
	ended := func(t *testing.T) []*coorddv1.Holding {
		t.Helper()
		select {
		case got := <-reports:
			return got
		case <-time.After(toldWithin):
			t.Fatalf("no holding reported ended within %s", toldWithin)
			return nil
		}
	}
	acquire := func(t *testing.T, name string, stream uint64) *coorddv1.LockGrant {
		t.Helper()
		resp, err := locks.Acquire(ctx, &coorddv1.AcquireRequest{Name: name, SessionId: sess.ID(), RequestId: reqID(name), KeepaliveStream: stream})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetGrant()
	}
	reportsOnly := func(t *testing.T, got []*coorddv1.Holding, kind coorddv1.Holding_Kind, name string, token int64) {
		t.Helper()
		if len(got) != 1 || got[0].GetKind() != kind || got[0].GetName() != name || got[0].GetToken() != token {
			t.Fatalf("reported ended: %v; want only %s %q token %d", got, kind, name, token)
		}
	}

	// Released from outside (no session or stream named): reported.
	g := acquire(t, "follow/outside", id)
	if !g.GetFollowed() {
		t.Fatal("a grant that names the caller's stream is not followed")
	}
	if _, err := locks.Release(ctx, &coorddv1.ReleaseRequest{Name: "follow/outside", Token: g.GetToken()}); err != nil {
		t.Fatal(err)
	}
	reportsOnly(t, ended(t), coorddv1.Holding_KIND_LOCK, "follow/outside", g.GetToken())

	// Released by its holder naming the stream: not reported. The next
	// report is of a sentinel released from outside after it.
	own := acquire(t, "follow/own", id)
	if _, err := locks.Release(ctx, &coorddv1.ReleaseRequest{Name: "follow/own", Token: own.GetToken(), SessionId: sess.ID(), RequestId: reqID("follow/own"), KeepaliveStream: id}); err != nil {
		t.Fatal(err)
	}
	try, err := locks.TryAcquire(ctx, &coorddv1.TryAcquireRequest{Name: "follow/sentinel", SessionId: sess.ID(), RequestId: "r-s", KeepaliveStream: id})
	if err != nil || !try.GetGrant().GetFollowed() {
		t.Fatalf("TryAcquire naming the stream: %v, %v; want a followed grant", try, err)
	}
	if _, err := locks.Release(ctx, &coorddv1.ReleaseRequest{Name: "follow/sentinel", Token: try.GetGrant().GetToken()}); err != nil {
		t.Fatal(err)
	}
	reportsOnly(t, ended(t), coorddv1.Holding_KIND_LOCK, "follow/sentinel", try.GetGrant().GetToken())

	// A stream this member does not serve follows nothing.
	if g := acquire(t, "follow/unknown", id+1); g.GetFollowed() {
		t.Error("a grant naming a stream the member does not serve is reported followed")
	}
	if g := acquire(t, "follow/none", 0); g.GetFollowed() {
		t.Error("a grant naming no stream is reported followed")
	}

	// Leaderships alike.
	campaign := func(t *testing.T, name string) *coorddv1.Leadership {
		t.Helper()
		resp, err := elections.Campaign(ctx, &coorddv1.CampaignRequest{Name: name, SessionId: sess.ID(), Value: "v", RequestId: reqID(name), KeepaliveStream: id})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetLeadership().GetFollowed() {
			t.Fatal("a leadership that names the caller's stream is not followed")
		}
		return resp.GetLeadership()
	}
	lead := campaign(t, "follow/own-election")
	if _, err := elections.Resign(ctx, &coorddv1.ResignRequest{Name: "follow/own-election", Term: lead.GetTerm(), SessionId: sess.ID(), RequestId: reqID("follow/own-election"), KeepaliveStream: id}); err != nil {
		t.Fatal(err)
	}
	lead = campaign(t, "follow/election")
	if _, err := elections.Resign(ctx, &coorddv1.ResignRequest{Name: "follow/election", Term: lead.GetTerm()}); err != nil {
		t.Fatal(err)
	}
	reportsOnly(t, ended(t), coorddv1.Holding_KIND_ELECTION, "follow/election", lead.GetTerm())
}
