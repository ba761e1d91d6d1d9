package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

func TestLocksThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	a, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second), clientlib.WithOwner("compactor"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	l, err := a.Lock(ctx, "orders/compaction", clientlib.WithMetadata("nightly run"))
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if l.Token() <= 0 || l.Context().Err() != nil {
		t.Fatalf("lock token %d, context %v", l.Token(), l.Context().Err())
	}
	if _, err := b.TryLock(ctx, "orders/compaction"); !errors.Is(err, clientlib.ErrLockHeld) {
		t.Fatalf("TryLock of a held lock = %v, want ErrLockHeld", err)
	}
	st, err := c.Admin().DescribeLock(ctx, "orders/compaction")
	if err != nil || len(st.Holders) != 1 || st.Holders[0].SessionID != a.ID() || st.Holders[0].Owner != "compactor" || st.Holders[0].Metadata != "nightly run" || st.Holders[0].Token != l.Token() || st.Holders[0].Granted.IsZero() {
		t.Fatalf("DescribeLock = %+v, %v", st, err)
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Lock: "orders/compaction", Token: l.Token()}); err != nil {
		t.Fatalf("ValidateFence: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), clientlib.ErrLockReleased) {
		t.Fatalf("lock context cause after Release = %v", context.Cause(l.Context()))
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost closed after a clean Release")
	default:
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Lock: "orders/compaction", Token: l.Token()}); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("ValidateFence after release = %v, want ErrStaleToken", err)
	}

	var seen fencing.Token
	err = clientlib.RunLocked(ctx, b, "orders/compaction", func(ctx context.Context, l *clientlib.Lock) error {
		token := l.Token()
		seen = token
		_, err := c.Admin().FencedPut(ctx, clientlib.Fence{Lock: "orders/compaction", Token: token}, "orders/last-compaction", []byte("done"))
		return err
	})
	if err != nil || seen <= l.Token() {
		t.Fatalf("RunLocked = %v, token %d (previous %d)", err, seen, l.Token())
	}
	if _, err := c.Admin().FencedPut(ctx, clientlib.Fence{Lock: "orders/compaction", Token: seen}, "orders/last-compaction", []byte("late")); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("FencedPut after RunLocked returned = %v, want ErrStaleToken", err)
	}
	if _, err := a.Lock(ctx, "pool", clientlib.WithLimit(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, "pool", clientlib.WithLimit(3)); !errors.Is(err, clientlib.ErrLimitMismatch) {
		t.Fatalf("TryLock with another limit = %v, want ErrLimitMismatch", err)
	}
}

// Mutual exclusion under contention through the SDK: clients on separate
// connections and sessions take one lock in turn and write to a resource
// protected by fencing.Guard. No write is accepted out of token order and
// no two holders overlap.
func TestLockMutualExclusionThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	const clients, rounds = 6, 10
	var (
		guard            fencing.Guard
		inside, overlaps atomic.Int32
		accepted         atomic.Int32
		wg               sync.WaitGroup
	)
	for i := range clients {
		c := newClient(t, d.GRPCAddr())
		s, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				err := clientlib.RunLocked(t.Context(), s, "shared", func(_ context.Context, l *clientlib.Lock) error {
					token := l.Token()
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					defer inside.Add(-1)
					return guard.Do("shared", token, func() error { accepted.Add(1); return nil })
				})
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 || accepted.Load() != clients*rounds {
		t.Fatalf("overlaps %d, accepted writes %d of %d", overlaps.Load(), accepted.Load(), clients*rounds)
	}
}

// Expiry: the holder's keep-alives stop (no release). Its lock context is
// cancelled before anyone else can get the lock; the waiter gets it only
// after the old session's TTL; the old holder's late writes are rejected by
// the guard and by fenced puts.
func TestLockExpiryFencesTheOldHolder(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	proxy := tcpproxy.Start(t, d.GRPCAddr())
	holderClient := newClient(t, proxy.Addr())
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()

	hs, err := holderClient.NewSession(ctx, clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	old, err := hs.Lock(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	var guard fencing.Guard
	if err := guard.Check("db", old.Token()); err != nil {
		t.Fatal(err)
	}
	ws, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	frozenAt := time.Now()

	var holderLostAt time.Time
	lostSeen := make(chan struct{})
	go func() {
		<-old.Context().Done()
		holderLostAt = time.Now()
		close(lostSeen)
	}()
	next, err := ws.Lock(ctx, "db")
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	grantedAt := time.Now()
	<-lostSeen
	if !holderLostAt.Before(grantedAt) {
		t.Fatalf("old holder's context ended %s after the new grant", holderLostAt.Sub(grantedAt))
	}
	select {
	case <-old.Lost():
	default:
		t.Fatal("Lost not closed for a lock whose session expired")
	}
	if waited := grantedAt.Sub(frozenAt); waited < 2*time.Second {
		t.Fatalf("waiter got the lock %s after the holder went silent, before its TTL could run out", waited)
	}
	t.Logf("holder context ended %s before the next grant; grant %s after the cut", grantedAt.Sub(holderLostAt).Round(time.Millisecond), grantedAt.Sub(frozenAt).Round(time.Millisecond))

	if err := guard.Check("db", next.Token()); err != nil {
		t.Fatalf("new holder rejected: %v", err)
	}
	if err := guard.Check("db", old.Token()); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("old holder's late write through the guard = %v, want ErrStale", err)
	}
	if _, err := c.Admin().FencedPut(ctx, clientlib.Fence{Lock: "db", Token: old.Token()}, "db/owner", []byte("old")); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("old holder's late fenced put = %v, want ErrStaleToken", err)
	}
	proxy.Thaw()
}

func TestLocksOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	s1, s2 := restSession(t, base), restSession(t, base)

	r := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"reports/daily","sessionId":%q,"metadata":"curl"}`, s1))
	if r.status != 200 {
		t.Fatalf("acquire = %d %v", r.status, r.body)
	}
	token, ok := r.body["grant"].(map[string]any)["token"].(string)
	if !ok || token == "" {
		t.Fatalf("token is not a JSON string: %v", r.body)
	}
	if r := call(t, "GET", base+"/v1/locks/reports/daily", ""); r.status != 200 || len(r.body["holders"].([]any)) != 1 {
		t.Fatalf("describe = %d %v", r.status, r.body)
	}
	if r := call(t, "GET", base+"/v1/locks?prefix=reports/", ""); r.status != 200 || len(r.body["names"].([]any)) != 1 {
		t.Fatalf("list = %d %v", r.status, r.body)
	}
	if r := call(t, "POST", base+"/v1/kv:fencedPut", fmt.Sprintf(`{"lock":"reports/daily","token":%q,"key":"reports/owner","value":"czE="}`, token)); r.status != 200 {
		t.Fatalf("fenced put = %d %v", r.status, r.body)
	}

	bad := []struct {
		name, method, path, body string
		status                   int
		reason                   string
	}{
		{"try on held", "POST", "/v1/locks:tryAcquire", fmt.Sprintf(`{"name":"reports/daily","sessionId":%q}`, s2), 409, "LOCK_HELD"},
		{"wait runs out", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"reports/daily","sessionId":%q,"wait":"0.2s"}`, s2), 504, "DEADLINE_EXCEEDED"},
		{"bad name", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"a b","sessionId":%q}`, s2), 400, "INVALID_ARGUMENT"},
		{"empty name", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"sessionId":%q}`, s2), 400, "INVALID_ARGUMENT"},
		{"unknown session", "POST", "/v1/locks:acquire", `{"name":"x","sessionId":"00000000000000ff"}`, 404, "SESSION_NOT_FOUND"},
		{"malformed session", "POST", "/v1/locks:acquire", `{"name":"x","sessionId":"zz"}`, 400, "INVALID_ARGUMENT"},
		{"negative wait", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"x","sessionId":%q,"wait":"-1s"}`, s2), 400, "INVALID_ARGUMENT"},
		{"huge lock delay", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"x","sessionId":%q,"lockDelay":"1h"}`, s2), 400, "INVALID_ARGUMENT"},
		{"huge limit", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"x","sessionId":%q,"limit":5000}`, s2), 400, "INVALID_ARGUMENT"},
		{"limit mismatch", "POST", "/v1/locks:tryAcquire", fmt.Sprintf(`{"name":"reports/daily","sessionId":%q,"limit":2}`, s2), 400, "LIMIT_MISMATCH"},
		{"oversized metadata", "POST", "/v1/locks:acquire", fmt.Sprintf(`{"name":"x","sessionId":%q,"metadata":%q}`, s2, strings.Repeat("m", 2000)), 400, "VALUE_TOO_LARGE"},
		{"release stale", "POST", "/v1/locks:release", `{"name":"reports/daily","token":"1"}`, 400, "NOT_HOLDER"},
		{"release token zero", "POST", "/v1/locks:release", `{"name":"reports/daily","token":"0"}`, 400, "INVALID_ARGUMENT"},
		{"token not a number", "POST", "/v1/locks:release", `{"name":"reports/daily","token":"abc"}`, 400, "INVALID_ARGUMENT"},
		{"stale fence", "POST", "/v1/locks:validateFence", `{"name":"reports/daily","token":"1"}`, 409, "STALE_TOKEN"},
		{"stale fenced put", "POST", "/v1/kv:fencedPut", `{"lock":"reports/daily","token":"1","key":"reports/owner","value":"eA=="}`, 409, "STALE_TOKEN"},
		{"fenced put no key", "POST", "/v1/kv:fencedPut", fmt.Sprintf(`{"lock":"reports/daily","token":%q}`, token), 400, "INVALID_ARGUMENT"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, tt.method, base+tt.path, tt.body)
			if r.status != tt.status || reason(r) != tt.reason {
				t.Fatalf("%s %s = %d %q (%v), want %d %q", tt.method, tt.path, r.status, reason(r), message(r), tt.status, tt.reason)
			}
		})
	}
	r = call(t, "GET", base+"/v1/locks/reports/daily", "")
	if holders := r.body["holders"].([]any); len(holders) != 1 || holders[0].(map[string]any)["token"] != token || len(r.body["waiters"].([]any)) != 0 {
		t.Fatalf("bad requests changed the lock: %v", r.body)
	}
	// The holder's own release names its session: at once.
	if r := call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":"reports/daily","token":%q,"sessionId":%q}`, token, s1)); r.status != 200 {
		t.Fatalf("release = %d %v", r.status, r.body)
	}
	if r := call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":"reports/daily","token":%q}`, token)); r.status != 400 || reason(r) != "NOT_HOLDER" {
		t.Fatalf("second release = %d %v", r.status, r.body)
	}
}

// Waiters and observers share the member's watch: however many lock
// waiters, waiting candidates and election observers a member serves, it
// opens no etcd watch for them (etcd's own gauge of open watchers does not
// move), and a release still reaches the next waiter, a resignation every
// observer.
func TestWaitersAndObserversOpenNoWatchOfTheirOwn(t *testing.T) {
	// Not parallel: etcd counts watchers process-wide, over every member
	// the tests run.
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	const waiters = 20
	var sessions []*clientlib.Session
	for range 2*waiters + 2 {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	held, err := sessions[0].Lock(ctx, "shared-watch/l")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := sessions[1].Campaign(ctx, "shared-watch/e", "first")
	if err != nil {
		t.Fatal(err)
	}
	before := etcdWatchers(t)
	granted := make(chan *clientlib.Lock, waiters)
	for i := range waiters {
		go func() {
			if l, err := sessions[2+i].Lock(ctx, "shared-watch/l"); err == nil {
				granted <- l
			}
		}()
		go func() { _, _ = sessions[2+waiters+i].Campaign(ctx, "shared-watch/e", "next") }()
	}
	observers := make([]*clientlib.Observer, waiters)
	for i := range observers {
		observers[i] = c.Observe(ctx, "shared-watch/e")
		select {
		case ev := <-observers[i].Events():
			if ev.Leader.Value != "first" {
				t.Fatalf("observer %d's first event %+v, want the first leader", i, ev)
			}
		case <-time.After(wait.Bound(10 * time.Second)):
			t.Fatalf("observer %d: no first event within 10s", i)
		}
	}
	admin := c.Admin()
	wait.For(t, "every waiter and candidate queued", func() bool {
		dl, err := admin.DescribeLock(ctx, "shared-watch/l")
		if err != nil || len(dl.Waiters) != waiters {
			return false
		}
		cs, err := c.Candidates(ctx, "shared-watch/e") // behind the leader
		return err == nil && len(cs) == waiters
	})
	if after := etcdWatchers(t); after > before {
		t.Fatalf("etcd watchers went from %v to %v with %d lock waiters, %d candidates and %d observers; want no new ones", before, after, waiters, waiters, waiters)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-granted:
		if l.Token() <= held.Token() {
			t.Fatalf("next grant's token %d, want > %d", l.Token(), held.Token())
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("no waiter was granted the lock within 10s of its release")
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the next candidate leads", func() bool {
		ld, err := c.Leader(ctx, "shared-watch/e")
		return err == nil && ld.Value == "next"
	})
	for i, o := range observers {
		var seen []clientlib.ElectionEventType
		for len(seen) < 2 {
			select {
			case ev := <-o.Events():
				seen = append(seen, ev.Type)
			case <-time.After(wait.Bound(10 * time.Second)):
				t.Fatalf("observer %d saw %v after the resignation, want RESIGNED then ELECTED", i, seen)
			}
		}
		if seen[0] != clientlib.ElectionResigned || seen[1] != clientlib.ElectionElected {
			t.Fatalf("observer %d saw %v after the resignation, want RESIGNED then ELECTED", i, seen)
		}
	}
}

// etcdWatchers is etcd's gauge of open watchers in this process.
func etcdWatchers(t *testing.T) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("etcd_debugging_mvcc_watcher_total is not registered")
	return 0
}

// TestWatchLock: a lock's watchers (SDK and REST) see every grant, wait
// and release without polling, and open no etcd watch of their own.
func TestWatchLock(t *testing.T) {
	// Not parallel: etcd counts watchers process-wide, over every member
	// the tests run.
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	a, err := c.NewSession(ctx, clientlib.WithOwner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSession(ctx, clientlib.WithOwner("bob"))
	if err != nil {
		t.Fatal(err)
	}
	before := etcdWatchers(t)
	states := make(chan clientlib.LockState, 64)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Admin().WatchLock(wctx, "watched/l", func(st clientlib.LockState) error { states <- st; return nil })
	}()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchLock ended with %v, want context.Canceled", err)
		}
	}()
	// next waits for a state that says, in owners, who holds and who waits.
	next := func(want string) clientlib.LockState {
		t.Helper()
		timeout := time.After(wait.Bound(10 * time.Second))
		for {
			select {
			case st := <-states:
				var got []string
				for _, h := range st.Holders {
					got = append(got, "holds:"+h.Owner)
				}
				for _, w := range st.Waiters {
					got = append(got, "waits:"+w.Owner)
				}
				if strings.Join(got, " ") == want {
					return st
				}
			case <-timeout:
				t.Fatalf("no lock state %q within 10s", want)
			}
		}
	}
	next("")
	l, err := a.Lock(ctx, "watched/l")
	if err != nil {
		t.Fatal(err)
	}
	if st := next("holds:alice"); st.Holders[0].Token != l.Token() {
		t.Fatalf("watched holder token %v, want %v", st.Holders[0].Token, l.Token())
	}
	got := make(chan *clientlib.Lock, 1)
	go func() {
		if l, err := b.Lock(ctx, "watched/l"); err == nil {
			got <- l
		}
	}()
	next("holds:alice waits:bob")
	if after := etcdWatchers(t); after > before {
		t.Fatalf("etcd watchers went from %v to %v with a lock watched; want no new ones", before, after)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next("holds:bob")
	lb := <-got

	// REST: the same stream as JSON lines.
	rctx, rcancel := context.WithTimeout(ctx, wait.Bound(10*time.Second))
	defer rcancel()
	req, _ := http.NewRequestWithContext(rctx, "GET", "http://"+d.HTTPAddr()+"/v1/locks:watch?name=watched/l", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewScanner(resp.Body)
	line := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("REST lock watch ended: %v", lines.Err())
		}
		var m struct {
			Result struct {
				Lock map[string]any `json:"lock"`
			} `json:"result"`
		}
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", lines.Text(), err)
		}
		return m.Result.Lock
	}
	if first := line(); fmt.Sprint(first["holders"]) == "[]" || first["name"] != "watched/l" {
		t.Fatalf("first REST lock line: %v", first)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next("")
	// Lines from before the release (bob still holding, at a later
	// revision of the lock's keys) may come first; then one with no holder.
	for {
		after := line()
		holders, _ := after["holders"].([]any)
		if len(holders) == 0 {
			break
		}
		if !strings.Contains(fmt.Sprint(holders), "owner:bob") {
			t.Fatalf("REST lock line after the release: %v", after)
		}
	}
}

// A session that takes and releases one lock again and again uses one
// request id, so one waiter key, for it (etcd's index grows by a version
// of that key, not by a dead key per acquisition that every read of the
// queue walks until compaction). Each acquisition is still a new grant
// with a new token; held at once (a semaphore), or in another mode, or
// after a release that failed, acquisitions get ids of their own.
func TestReleasedRequestIDsAreUsedAgain(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	holderID := func(name string, token fencing.Token) string {
		t.Helper()
		st, err := c.Admin().DescribeLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range st.Holders {
			if h.Token == token {
				return h.RequestID
			}
		}
		t.Fatalf("token %d does not hold %q: %+v", token, name, st)
		return ""
	}
	l, err := s.Lock(ctx, "ids/x")
	if err != nil {
		t.Fatal(err)
	}
	first, firstToken := holderID("ids/x", l.Token()), l.Token()
	for range 5 {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if l, err = s.Lock(ctx, "ids/x"); err != nil {
			t.Fatal(err)
		}
		if id := holderID("ids/x", l.Token()); id != first {
			t.Fatalf("acquisition after a release: request id %q, want the released one %q", id, first)
		}
	}
	if l.Token() <= firstToken {
		t.Fatalf("token %d after %d, want a new, larger one", l.Token(), firstToken)
	}
	if err := c.Admin().ValidateFence(ctx, clientlib.Fence{Lock: "ids/x", Token: firstToken}); !errors.Is(err, clientlib.ErrStaleToken) {
		t.Fatalf("the first grant's token after its release: %v, want ErrStaleToken", err)
	}
	// Released from outside: the SDK's Release does not release it, and
	// the id is not used again.
	// Forced: the holder is not asked (asked, it would release the grant
	// itself, and its id would be free again).
	if err := c.Admin().Release(ctx, "ids/x", l.Token(), clientlib.Force()); err != nil {
		t.Fatal(err)
	}
	// (ErrNotHolder, or nil if the SDK was told of the release first.)
	if err := l.Release(ctx); err != nil && !errors.Is(err, clientlib.ErrNotHolder) {
		t.Fatalf("Release of a grant released from outside: %v, want ErrNotHolder or nil", err)
	}
	l, err = s.Lock(ctx, "ids/x")
	if err != nil {
		t.Fatal(err)
	}
	if id := holderID("ids/x", l.Token()); id == first {
		t.Fatalf("acquisition after a failed release used its request id %q again", id)
	}
	// Two grants of a semaphore held at once, and a read grant after a
	// write grant, have ids of their own.
	a, err := s.Lock(ctx, "ids/sem", clientlib.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a, err = s.Lock(ctx, "ids/sem", clientlib.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Lock(ctx, "ids/sem", clientlib.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	if ia, ib := holderID("ids/sem", a.Token()), holderID("ids/sem", b.Token()); ia == ib {
		t.Fatalf("two grants held at once share request id %q", ia)
	}
	w, err := s.Lock(ctx, "ids/rw")
	if err != nil {
		t.Fatal(err)
	}
	wid := holderID("ids/rw", w.Token())
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := s.RLock(ctx, "ids/rw")
	if err != nil {
		t.Fatal(err)
	}
	if id := holderID("ids/rw", r.Token()); id == wid {
		t.Fatalf("a read grant used the released write grant's request id %q", id)
	}
}

// A Release (or Resign) that failed can be repeated: the first call ends
// the holder's context, the grant stays with the session on the server,
// and the next call releases it. (Before, the second call returned nil
// and did nothing, leaving the lock to the session's end: a worker whose
// release met a member's graceful stop then blocked everyone behind it.)
func TestAFailedReleaseCanBeRepeated(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	proxy := tcpproxy.Start(t, d.GRPCAddr())
	holder := newClient(t, proxy.Addr())
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	s, err := holder.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "again/x")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := s.Campaign(ctx, "again/e", "v")
	if err != nil {
		t.Fatal(err)
	}
	// The holder's member out of reach: nothing it sends arrives.
	proxy.Down()
	brief := func() context.Context {
		bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return bctx
	}
	if err := l.Release(brief()); err == nil {
		t.Fatal("Release through a dead proxy succeeded; the test needs it to fail")
	}
	if err := lead.Resign(brief()); err == nil {
		t.Fatal("Resign through a dead proxy succeeded; the test needs it to fail")
	}
	if l.Context().Err() == nil || lead.Context().Err() == nil {
		t.Fatal("the lock's or the leadership's context lives on after Release or Resign")
	}
	if _, err := other.TryLock(ctx, "again/x"); !errors.Is(err, clientlib.ErrLockHeld) {
		t.Fatalf("TryLock after the failed release: %v, want ErrLockHeld (the server still holds it)", err)
	}
	if ld, err := c.Leader(ctx, "again/e"); err != nil || ld.Term != lead.Term() {
		t.Fatalf("leader after the failed resign: %+v, %v; want term %d still", ld, err, lead.Term())
	}
	proxy.Up()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatalf("Resign again: %v", err)
	}
	if _, err := other.TryLock(ctx, "again/x"); err != nil {
		t.Fatalf("TryLock after the repeated release: %v, want the lock", err)
	}
	if _, err := c.Leader(ctx, "again/e"); !errors.Is(err, clientlib.ErrNoLeader) {
		t.Fatalf("leader after the repeated resign: %v, want ErrNoLeader", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after a successful one: %v, want nil", err)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatalf("Resign after a successful one: %v, want nil", err)
	}
}

// A REST caller that names no request id gets one the server picks; after
// its release (by token, as curl would) the same session's next
// acquisition of the lock gets the same id again, with a new token. An id
// the caller chose is never handed to anyone else, and a release of
// another session's grant frees nothing for this one.
func TestServerPickedRequestIDsAreUsedAgainOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	s1, s2 := restSession(t, base), restSession(t, base)
	acquire := func(session, extra string) (requestID, token string) {
		t.Helper()
		r := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"rest/ids","sessionId":%q%s}`, session, extra))
		if r.status != 200 {
			t.Fatalf("acquire = %d %v", r.status, r.body)
		}
		g := r.body["grant"].(map[string]any)
		return g["requestId"].(string), g["token"].(string)
	}
	release := func(token string) {
		t.Helper()
		// By token alone: a release from outside, whose holder (a REST
		// client, no stream) cannot answer: it ends at the bound given.
		if r := call(t, "POST", base+"/v1/locks:release", fmt.Sprintf(`{"name":"rest/ids","token":%q,"revokeWait":"0.05s"}`, token)); r.status != 200 {
			t.Fatalf("release = %d %v", r.status, r.body)
		}
	}
	first, t1 := acquire(s1, "")
	release(t1)
	again, t2 := acquire(s1, "")
	if again != first || t2 == t1 {
		t.Fatalf("after a release: request id %q token %s, want the picked id %q again with a new token (was %s)", again, t2, first, t1)
	}
	release(t2)
	// Another session gets an id of its own.
	other, t3 := acquire(s2, "")
	if other == first {
		t.Fatalf("session 2 got session 1's released id %q", other)
	}
	release(t3)
	// An id the caller chose is not the server's to use again.
	chosen, t4 := acquire(s1, `,"requestId":"mine-1"`)
	if chosen != "mine-1" {
		t.Fatalf("chosen id came back as %q", chosen)
	}
	release(t4)
	picked, t5 := acquire(s1, "")
	if picked == "mine-1" {
		t.Fatalf("the server handed out the caller's own id %q", picked)
	}
	release(t5)
	// The caller now names the id the server picked for it (its own to
	// reuse): a later call of the session that names none must not join
	// that acquisition, though the server would have picked that id again.
	_, t6 := acquire(s1, fmt.Sprintf(`,"requestId":%q`, picked))
	r := call(t, "POST", base+"/v1/locks:tryAcquire", fmt.Sprintf(`{"name":"rest/ids","sessionId":%q}`, s1))
	if r.status != 409 || reason(r) != "LOCK_HELD" {
		t.Fatalf("try-lock naming no id while the session holds the lock under the picked id: %d %v, want 409 LOCK_HELD (not the holder's grant, token %s)", r.status, r.body, t6)
	}
	release(t6)
}
