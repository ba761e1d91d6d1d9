package daemon_test

import (
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/testkit/wait"
)

// A crowded lock is described in pages, through the SDK and over REST:
// each page lists the queue in order after the one before, every page
// carries the holder and waiter counts, and a page token is opaque (it
// does not show the token of the entry it continues after: a caller may
// not be allowed to see tokens). Bad page sizes and tokens are refused
// with INVALID_ARGUMENT.
func TestACrowdedLockIsDescribedInPages(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()
	holder, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Lock(ctx, "crowd"); err != nil {
		t.Fatal(err)
	}
	const n = 45
	s, err := c.NewSession(ctx, clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		go func() { _, _ = s.Lock(ctx, "crowd", clientlib.WithRequestID(fmt.Sprintf("w%d", i))) }()
	}
	admin := c.Admin()
	wait.For(t, "the crowd to queue", func() bool {
		st, err := admin.DescribeLockPage(ctx, "crowd", clientlib.LockPage{Size: 1})
		return err == nil && st.WaiterCount == n
	})

	var sdkTokens []int64
	for p := (clientlib.LockPage{Size: 10}); ; {
		st, err := admin.DescribeLockPage(ctx, "crowd", p)
		if err != nil {
			t.Fatal(err)
		}
		if st.HolderCount != 1 || st.WaiterCount != n || len(st.Holders)+len(st.Waiters) > 10 {
			t.Fatalf("a page: %d holding, %d waiting, %d listed; want 1, %d, at most 10", st.HolderCount, st.WaiterCount, len(st.Holders)+len(st.Waiters), n)
		}
		for _, e := range append(st.Holders, st.Waiters...) {
			sdkTokens = append(sdkTokens, int64(e.Token))
		}
		if st.NextPageToken == "" {
			break
		}
		if slices.ContainsFunc(st.Waiters, func(e clientlib.LockEntry) bool { return st.NextPageToken == e.Token.String() }) {
			t.Fatalf("the page token %q is an entry's token in the clear", st.NextPageToken)
		}
		p.Token = st.NextPageToken
	}
	if len(sdkTokens) != n+1 || !slices.IsSorted(sdkTokens) {
		t.Fatalf("paged %d entries (%v); want %d in queue order", len(sdkTokens), sdkTokens, n+1)
	}

	base := "http://" + d.HTTPAddr() + "/v1/locks/crowd"
	r := call(t, "GET", base+"?pageSize=20", "")
	if r.status != 200 || len(r.body["waiters"].([]any)) != 19 || fmt.Sprint(r.body["waiterCount"]) != fmt.Sprint(n) || r.body["nextPageToken"] == "" {
		t.Fatalf("GET %s?pageSize=20 = %d %v; want the holder, 19 waiters, the counts and a next page", base, r.status, r.body)
	}
	r = call(t, "GET", base+"?pageSize=20&pageToken="+url.QueryEscape(r.body["nextPageToken"].(string)), "")
	if r.status != 200 || len(r.body["waiters"].([]any)) != 20 || r.body["holders"] != nil && len(r.body["holders"].([]any)) != 0 {
		t.Fatalf("the second page = %d %v; want 20 waiters and no holder", r.status, r.body)
	}
	for _, bad := range []string{"pageSize=1001", "pageSize=-1", "pageToken=12", "pageToken=not-a-token"} {
		if r := call(t, "GET", base+"?"+bad, ""); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
			t.Errorf("GET %s?%s = %d %v; want 400 INVALID_ARGUMENT", base, bad, r.status, r.body)
		}
	}
}
