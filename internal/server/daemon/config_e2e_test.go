package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

func TestConfigOverHTTP(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()

	// Watch as newline-delimited JSON.
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(wctx, "GET", base+"/v1/config:watch?namespaces=payments/prod", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	next := func() map[string]any {
		t.Helper()
		for lines.Scan() {
			var m map[string]any
			if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
				t.Fatalf("line %q: %v", lines.Text(), err)
			}
			r := m["result"].(map[string]any)
			if r["type"] != "WATCH_EVENT_TYPE_BOOKMARK" {
				return r
			}
		}
		t.Fatalf("watch stream ended: %v", lines.Err())
		return nil
	}
	if first := next(); first["type"] != "WATCH_EVENT_TYPE_SNAPSHOT" {
		t.Fatalf("first watch line = %v", first)
	}

	r := call(t, "POST", base+"/v1/config:publish", `{"namespace":"payments/prod","author":"ana","message":"initial",
		"mutations":[{"key":"db.url","value":"\"postgres://db\""},{"key":"timeout","value":"\"5s\""}]}`)
	if r.status != 200 {
		t.Fatalf("publish = %d %v", r.status, r.body)
	}
	rel := r.body["release"].(map[string]any)
	if rel["number"] != "1" || len(rel["changes"].([]any)) != 2 {
		t.Fatalf("release = %v", rel)
	}
	change := next()
	if change["type"] != "WATCH_EVENT_TYPE_CHANGE" || change["release"].(map[string]any)["number"] != "1" || len(change["release"].(map[string]any)["changes"].([]any)) != 2 {
		t.Fatalf("watched change = %v", change)
	}
	rev := rel["revision"].(string)

	r = call(t, "POST", base+"/v1/config:put", `{"namespace":"payments/prod","key":"timeout","value":"\"10s\"","expectedRevision":"`+rev+`"}`)
	if r.status != 200 {
		t.Fatalf("put = %d %v", r.status, r.body)
	}
	if c := next(); c["release"].(map[string]any)["changes"].([]any)[0].(map[string]any)["oldValue"] != `"5s"` {
		t.Fatalf("watched put = %v", c)
	}
	r = call(t, "GET", base+"/v1/config:snapshot?namespace=payments/prod", "")
	snap := r.body["snapshot"].(map[string]any)
	if r.status != 200 || snap["release"] != "2" || len(snap["entries"].([]any)) != 2 {
		t.Fatalf("snapshot = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:get?namespace=payments/prod&key=timeout&revision="+rev, "")
	if r.status != 200 || r.body["value"] != `"5s"` {
		t.Fatalf("get at release 1 = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:poll?namespace=payments/prod&afterRevision="+snap["changedRevision"].(string)+"&wait=0.1s", "")
	if r.status != 200 || r.body["modified"] == true {
		t.Fatalf("poll without a change = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:poll?namespace=payments/prod&afterRevision="+rev+"&wait=10s", "")
	if r.status != 200 || r.body["modified"] != true {
		t.Fatalf("poll after release 1 = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:releases?namespace=payments/prod", "")
	if r.status != 200 || len(r.body["releases"].([]any)) != 2 {
		t.Fatalf("releases = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:diff?namespace=payments/prod&fromRelease=1&toRelease=2", "")
	if r.status != 200 || len(r.body["changes"].([]any)) != 1 {
		t.Fatalf("diff = %d %v", r.status, r.body)
	}
	r = call(t, "POST", base+"/v1/config:rollback", `{"namespace":"payments/prod","toRelease":"1","author":"bo"}`)
	if r.status != 200 || r.body["release"].(map[string]any)["rollbackOf"] != "1" {
		t.Fatalf("rollback = %d %v", r.status, r.body)
	}
	if c := next(); c["release"].(map[string]any)["number"] != "3" {
		t.Fatalf("watched rollback = %v", c)
	}
	r = call(t, "POST", base+"/v1/config:setSchema", `{"namespace":"payments/prod","schema":"{\"type\":\"object\",\"properties\":{\"timeout\":{\"type\":\"string\"},\"retries\":{\"type\":\"integer\"}}}"}`)
	if r.status != 200 {
		t.Fatalf("setSchema = %d %v", r.status, r.body)
	}
	r = call(t, "GET", base+"/v1/config:namespaces?prefix=payments/", "")
	if r.status != 200 || len(r.body["namespaces"].([]any)) != 1 {
		t.Fatalf("namespaces = %d %v", r.status, r.body)
	}
	before := call(t, "GET", base+"/v1/config:snapshot?namespace=payments/prod", "").body["snapshot"].(map[string]any)["release"]

	for _, tc := range []struct {
		path, body string
		status     int
		reason     string
		violations int
	}{
		{"/v1/config:put", `{"namespace":"a//b","key":"k","value":"v"}`, 400, "INVALID_ARGUMENT", 0},
		{"/v1/config:put", `{"namespace":"payments/prod","key":"bad key","value":"v"}`, 400, "INVALID_ARGUMENT", 1},
		{"/v1/config:put", `{"namespace":"payments/prod","key":"big","value":"` + strings.Repeat("x", 256<<10+1) + `"}`, 400, "VALUE_TOO_LARGE", 1},
		{"/v1/config:publish", `{"namespace":"payments/prod","mutations":[{"key":"retries","value":"\"three\""},{"key":"timeout","value":"5"}]}`, 400, "VALIDATION_FAILED", 2},
		{"/v1/config:put", `{"namespace":"payments/prod","key":"timeout","value":"\"1s\"","expectedRevision":"` + rev + `"}`, 400, "REVISION_MISMATCH", 0},
		{"/v1/config:delete", `{"namespace":"payments/prod","key":"nope"}`, 404, "KEY_NOT_FOUND", 0},
		{"/v1/config:rollback", `{"namespace":"payments/prod","toRelease":"99"}`, 404, "RELEASE_NOT_FOUND", 0},
		{"/v1/config:setSchema", `{"namespace":"payments/prod","schema":"{\"type\":\"object\",\"required\":[\"retries\"]}"}`, 400, "VALIDATION_FAILED", 1},
	} {
		r := call(t, "POST", base+tc.path, tc.body)
		if r.status != tc.status || reason(r) != tc.reason || violations(r) != tc.violations {
			t.Errorf("POST %s %.80s = %d %s (%d violations), want %d %s (%d): %v", tc.path, tc.body, r.status, reason(r), violations(r), tc.status, tc.reason, tc.violations, r.body)
		}
	}
	if after := call(t, "GET", base+"/v1/config:snapshot?namespace=payments/prod", "").body["snapshot"].(map[string]any)["release"]; after != before {
		t.Fatalf("bad writes changed the namespace: release %v -> %v", before, after)
	}
	// A compacted revision is 410 Gone.
	cur := call(t, "GET", base+"/v1/config:snapshot?namespace=payments/prod", "").body["snapshot"].(map[string]any)["revision"].(string)
	compact(t, cfg.EtcdClientURL, cur)
	if r := call(t, "GET", base+"/v1/config:snapshot?namespace=payments/prod&revision="+rev, ""); r.status != 410 || reason(r) != "COMPACTED" {
		t.Fatalf("snapshot at a compacted revision = %d %v", r.status, r.body)
	}
}

func violations(r httpResult) int {
	e, _ := r.body["error"].(map[string]any)
	details, _ := e["details"].([]any)
	for _, d := range details {
		if m, ok := d.(map[string]any); ok && m["@type"] == "type.googleapis.com/google.rpc.BadRequest" {
			return len(m["fieldViolations"].([]any))
		}
	}
	return 0
}

// compact compacts the etcd at url up to revision rev.
func compact(t *testing.T, url, rev string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	r, err := strconv.ParseInt(rev, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(t.Context(), r); err != nil {
		t.Fatal(err)
	}
}

// A watcher on one member keeps receiving every release, in order, while
// another member (etcd's leader, when it is not the watcher's) stops.
func TestConfigWatchSurvivesAnotherMemberStopping(t *testing.T) {
	t.Parallel()
	ds := startCluster(t, 3)
	leader := 0
	for i, d := range ds {
		if d.Etcd().Server.Leader() == d.Etcd().Server.MemberID() {
			leader = i
		}
	}
	watched := (leader + 1) % 3
	writer := (leader + 2) % 3
	dial := func(d *daemon.Daemon) coorddv1.ConfigServiceClient {
		conn := dialRaw(t, d.GRPCAddr())
		return coorddv1.NewConfigServiceClient(conn)
	}
	wc, pc := dial(ds[watched]), dial(ds[writer])
	ctx := t.Context()
	stream, err := wc.Watch(ctx, &coorddv1.WatchRequest{Namespaces: []string{"ha"}})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err != nil || msg.GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT {
		t.Fatalf("first message = %v, %v", msg, err)
	}
	got := make(chan int64, 100)
	go func() {
		defer close(got)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			if msg.GetType() == coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE {
				got <- msg.GetRelease().GetNumber()
			}
		}
	}()
	const releases = 20
	for i := 1; i <= releases; i++ {
		if i == releases/2 {
			if err := ds[leader].Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for {
			_, err := pc.Put(ctx, &coorddv1.PutRequest{Namespace: "ha", Key: "k", Value: strconv.Itoa(i)})
			if err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // no quorum for a moment: retry
		}
	}
	for want := int64(1); want <= releases; want++ {
		select {
		case n, ok := <-got:
			if !ok || n != want {
				t.Fatalf("watcher got release %d (open %v), want %d", n, ok, want)
			}
		case <-time.After(wait.Bound(20 * time.Second)):
			t.Fatalf("watcher stopped before release %d", want)
		}
	}
}

// WatchMany: two watches of one namespace on one stream get a release in
// one message naming both; a stopped watch gets nothing more; a refused
// start is answered in-stream and the stream goes on; a watch resumed from
// a revision gets exactly the releases after it.
func TestWatchMany(t *testing.T) {
	t.Parallel()
	d := start(t, configTestConfig(t))
	conn := dialRaw(t, d.GRPCAddr())
	c := coorddv1.NewConfigServiceClient(conn)
	ctx := t.Context()
	put := func(v string) int64 {
		t.Helper()
		r, err := c.Put(ctx, &coorddv1.PutRequest{Namespace: "many", Key: "k", Value: v})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRelease().GetRevision()
	}
	rev1 := put("1")
	st, err := c.WatchMany(ctx)
	if err != nil {
		t.Fatal(err)
	}
	startWatch := func(id int64, ns string, from int64) {
		t.Helper()
		if err := st.Send(&coorddv1.WatchManyRequest{Request: &coorddv1.WatchManyRequest_Start{Start: &coorddv1.WatchManyStart{WatchId: id, Namespaces: []string{ns}, FromRevision: from}}}); err != nil {
			t.Fatal(err)
		}
	}
	// next returns the next message that is not a bookmark.
	next := func() *coorddv1.WatchManyResponse {
		t.Helper()
		for {
			msg, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if msg.GetEvent().GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_BOOKMARK {
				return msg
			}
		}
	}
	startWatch(1, "many", 0)
	startWatch(2, "many", 0)
	for range 2 {
		if msg := next(); msg.GetEvent().GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT || len(msg.GetWatchIds()) != 1 {
			t.Fatalf("first messages: %v", msg)
		}
	}
	put("2")
	// Usually one message names both watches; a release that came while
	// the mux was taking a round (a bookmark's) reaches the watch that
	// round had passed in a message of its own (watchmux's non-guarantee).
	for got := map[int64]bool{}; len(got) < 2; {
		msg := next()
		if msg.GetEvent().GetType() != coorddv1.WatchEventType_WATCH_EVENT_TYPE_CHANGE || msg.GetEvent().GetRelease().GetNumber() != 2 {
			t.Fatalf("a release for two watches: %v", msg)
		}
		for _, id := range msg.GetWatchIds() {
			if got[id] {
				t.Fatalf("watch %d got release 2 twice: %v", id, msg)
			}
			got[id] = true
		}
	}
	startWatch(3, "bad//ns", 0)
	if msg := next(); msg.GetErrorReason() != "INVALID_ARGUMENT" || msg.GetWatchIds()[0] != 3 {
		t.Fatalf("a refused start: %v", msg)
	}
	if err := st.Send(&coorddv1.WatchManyRequest{Request: &coorddv1.WatchManyRequest_Stop{Stop: &coorddv1.WatchManyStop{WatchId: 2}}}); err != nil {
		t.Fatal(err)
	}
	startWatch(4, "many", rev1+1) // resumes after release 1: gets 2 (and 3 below)
	if msg := next(); msg.GetEvent().GetRelease().GetNumber() != 2 || len(msg.GetWatchIds()) != 1 || msg.GetWatchIds()[0] != 4 {
		t.Fatalf("a resumed watch: %v", msg)
	}
	put("3")
	// Release 3 reaches watches 1 and 4 (usually in one message; in two when
	// it lands while the server is between them in a round), never 2.
	got := map[int64]bool{}
	for len(got) < 2 {
		msg := next()
		if msg.GetEvent().GetRelease().GetNumber() != 3 {
			t.Fatalf("after watch 2 stopped, want release 3: %v", msg)
		}
		for _, id := range msg.GetWatchIds() {
			if (id != 1 && id != 4) || got[id] {
				t.Fatalf("after watch 2 stopped, release 3 for watch %d: %v", id, msg)
			}
			got[id] = true
		}
	}
}
