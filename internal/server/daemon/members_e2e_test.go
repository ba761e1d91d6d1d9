package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// lockLoad cycles one lock from several SDK clients until stopped and
// records every grant's token and every failure.
type lockLoad struct {
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	last    fencing.Token
	grants  int
	fails   []string
	reorder []string // a token not above the one before
}

func startLockLoad(t *testing.T, workers int, endpoints ...string) *lockLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	l := &lockLoad{stop: cancel}
	for i := range workers {
		c := newClient(t, endpoints...)
		s, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				lk, err := s.Lock(ctx, "load")
				if err != nil {
					if ctx.Err() == nil {
						l.fail(fmt.Sprintf("worker %d: lock: %v", i, err))
					}
					continue
				}
				l.mu.Lock()
				if lk.Token() <= l.last {
					l.reorder = append(l.reorder, fmt.Sprintf("token %d after %d", lk.Token(), l.last))
				}
				l.last = lk.Token()
				l.grants++
				l.mu.Unlock()
				uctx, cancel := context.WithTimeout(context.Background(), wait.Bound(5*time.Second))
				if err := lk.Release(uctx); err != nil {
					l.fail(fmt.Sprintf("worker %d: release: %v", i, err))
				}
				cancel()
			}
		}()
	}
	return l
}

func (l *lockLoad) fail(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fails = append(l.fails, time.Now().Format("15:04:05.000")+" "+s)
}

func (l *lockLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grants
}

// finish stops the load and fails the test on any failed grant or token
// out of order.
func (l *lockLoad) finish(t *testing.T) {
	t.Helper()
	l.stop()
	l.wg.Wait()
	if len(l.fails) > 0 || len(l.reorder) > 0 {
		t.Fatalf("under load: %d failed calls %v; tokens out of order: %v", len(l.fails), l.fails, l.reorder)
	}
	t.Logf("%d lock grants, none failed, tokens strictly increasing", l.grants)
}

// Growing a one-member install to three and shrinking it back to two,
// under lock traffic: each member joins as a learner (the quorum does not
// change until it is promoted), so no lock grant fails; removing a follower
// costs nothing either. Bad membership changes are refused with nothing
// changed. Adding voters directly would fail grants: a second voter that
// has not started yet leaves the first without a quorum.
func TestGrowAndShrinkUnderLoad(t *testing.T) {
	t.Parallel()
	first := testConfig(t)
	d1 := start(t, first)
	admin := newClient(t, d1.GRPCAddr()).Admin()
	// Each change may wait for etcd's 5 s check that the leader has been
	// connected to every voting member (see cluster.PromoteMember).
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(time.Minute))
	defer cancel()
	load := startLockLoad(t, 2, d1.GRPCAddr())
	wait.Within(t, 5*time.Second, "the load to run", func() bool { return load.count() > 20 })

	// grow adds and starts a member, and checks it is a learner until
	// promoted.
	grow := func(name string) *daemon.Daemon {
		t.Helper()
		cfg := testConfig(t)
		cfg.Name = name
		cfg.ListenPeerURLs = []string{freeport.URL(t)}
		// On two CPUs under the race detector a two-voter cluster may
		// elect a leader again just after a promotion: a member change
		// that found no leader changed nothing, and is asked again, as
		// its error says.
		var added clientlib.AddedMember
		wait.Within(t, 20*time.Second, "the member to be added", func() bool {
			var err error
			added, err = admin.AddMember(ctx, name, cfg.ListenPeerURLs...)
			if err != nil && !errors.Is(err, clientlib.ErrUnavailable) {
				t.Fatalf("add %s: %v", name, err)
			}
			return err == nil
		})
		if !added.Member.Learner || added.InitialClusterState != "existing" || !strings.Contains(added.InitialCluster, name+"="+cfg.ListenPeerURLs[0]) {
			t.Fatalf("add %s = %+v; want a learner and how to start it", name, added)
		}
		cfg.InitialCluster, cfg.InitialClusterState = added.InitialCluster, added.InitialClusterState
		d := start(t, cfg)
		code, body := get(t, "http://"+d.HTTPAddr()+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "learner") {
			t.Fatalf("a learner's /readyz = %d %q; want 503 naming the learner", code, body)
		}
		return d
	}
	promote := func(name string, d *daemon.Daemon) {
		t.Helper()
		m, err := admin.PromoteMember(ctx, name)
		if err != nil || m.Learner {
			t.Fatalf("promote %s: %+v, %v", name, m, err)
		}
		wait.Within(t, 5*time.Second, name+" to be ready once promoted", func() bool {
			code, _ := get(t, "http://"+d.HTTPAddr()+"/readyz")
			return code == http.StatusOK
		})
	}

	d2 := grow("n2")
	// One voter and a learner: the voter is the last voting member.
	if _, err := admin.RemoveMember(ctx, "n1"); !errors.Is(err, clientlib.ErrMemberChangeRefused) || !strings.Contains(err.Error(), "last voting member") {
		t.Fatalf("removing the last voting member: %v; want ErrMemberChangeRefused", err)
	}
	if _, err := admin.AddMember(ctx, "n9", freeport.URL(t)); !errors.Is(err, clientlib.ErrMemberChangeRefused) {
		t.Fatalf("a second learner: %v; want ErrMemberChangeRefused", err)
	}
	promote("n2", d2)
	d3 := grow("n3")
	// Two voters and a learner: the leader may not go.
	ms, leader, err := admin.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leaderName := ""
	for _, m := range ms {
		if m.ID == leader {
			leaderName = m.Name
		}
	}
	if _, err := admin.RemoveMember(ctx, leaderName); !errors.Is(err, clientlib.ErrMemberChangeRefused) || !strings.Contains(err.Error(), "learner n3 is unpromoted") {
		t.Fatalf("removing leader %q while a learner is unpromoted: %v; want ErrMemberChangeRefused", leaderName, err)
	}
	promote("n3", d3)

	// Bad input, nothing changed.
	if _, err := admin.RemoveMember(ctx, "nope"); !errors.Is(err, clientlib.ErrMemberNotFound) {
		t.Fatalf("removing an unknown member: %v; want ErrMemberNotFound", err)
	}
	if _, err := admin.AddMember(ctx, "n2", freeport.URL(t)); !errors.Is(err, clientlib.ErrMemberChangeRefused) {
		t.Fatalf("adding a name in use: %v; want ErrMemberChangeRefused", err)
	}
	if _, err := admin.AddMember(ctx, "n4", "not a url"); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Fatalf("adding a bad peer URL: %v; want ErrInvalidArgument", err)
	}
	if _, err := admin.PromoteMember(ctx, "n2"); !errors.Is(err, clientlib.ErrMemberChangeRefused) {
		t.Fatalf("promoting a voter: %v; want ErrMemberChangeRefused", err)
	}
	base := "http://" + d1.HTTPAddr()
	if r := call(t, "DELETE", base+"/v1/cluster/members/nope", ""); r.status != http.StatusNotFound || reason(r) != "MEMBER_NOT_FOUND" {
		t.Fatalf("REST removal of an unknown member: %d %v", r.status, r.body)
	}
	if r := call(t, "POST", base+"/v1/cluster/members", `{"name":"n2","peerUrls":["http://127.0.0.1:1"]}`); r.status != http.StatusBadRequest || reason(r) != "MEMBER_CHANGE_REFUSED" {
		t.Fatalf("REST add of a name in use: %d %v", r.status, r.body)
	}
	if r := call(t, "GET", base+"/v1/cluster/members", ""); r.status != http.StatusOK || len(r.body["members"].([]any)) != 3 {
		t.Fatalf("REST member list: %d %v", r.status, r.body)
	}

	// Every member shows every member's health, fresh.
	for _, d := range []*daemon.Daemon{d1, d2, d3} {
		c := newClient(t, d.GRPCAddr()).Admin()
		wait.Within(t, 10*time.Second, "every member's health report", func() bool {
			ms, _, err := c.Members(ctx)
			if err != nil || len(ms) != 3 {
				return false
			}
			for _, m := range ms {
				if m.Learner || m.Health == nil || m.Health.Stale || m.Health.RaftTerm == 0 || m.Health.AppliedIndex == 0 || m.Health.DBSize == 0 || m.Health.EtcdVersion == "" {
					return false
				}
			}
			return true
		})
	}

	// Shrink: remove a follower; its coordd stops for good.
	victim, victimD := "n3", d3
	if ms, leader, _ := admin.Members(ctx); leader != "" {
		for _, m := range ms {
			if m.ID == leader && m.Name == "n3" {
				victim, victimD = "n2", d2
			}
		}
	}
	if _, err := admin.RemoveMember(ctx, victim); err != nil {
		t.Fatalf("remove %s: %v", victim, err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
	defer cancel()
	if err := victimD.Wait(wctx); !errors.Is(err, daemon.ErrMemberRemoved) {
		t.Fatalf("the removed member's daemon: Wait = %v; want ErrMemberRemoved", err)
	}
	// The removed member's daemon stops serving.
	wait.Within(t, 15*time.Second, "the removed member's daemon to stop serving", func() bool {
		resp, err := httpClient.Get("http://" + victimD.HTTPAddr() + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err != nil
	})
	before := load.count()
	wait.Within(t, 5*time.Second, "the load to go on after the removal", func() bool { return load.count() > before+20 })
	load.finish(t)
	if ms, _, err := admin.Members(ctx); err != nil || len(ms) != 2 {
		t.Fatalf("members after the removal: %+v, %v", ms, err)
	}
}
