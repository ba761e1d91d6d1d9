package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/server/api"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// alice may do anything to names under a/; bob may only use sessions and
// read config under b/; carol is known but allowed nothing.
const testPolicy = `
groups:
  readers: [bob]
rules:
  - principals: [alice]
    actions: ["*"]
    locks: ["a/*"]
    elections: ["a/*"]
    namespaces: ["a/*"]
    keys: ["a/*"]
  - principals: [bob]
    actions: [session, config.read]
    namespaces: ["b/*"]
`

// testTokens are the principals every test daemon with authentication
// knows (read only: the tests run in parallel).
var testTokens = map[string]string{
	"alice": "alice-token-0123456789", "bob": "bob-token-0123456789", "carol": "carol-token-0123456789",
	"mallory": "mallory-token-0123456789", "root": "root-token-0123456789", "eve": "eve-token-0123456789",
}

// authConfig is a daemon with testTokens and policy.
func authConfig(t *testing.T, policy string) daemon.Config {
	t.Helper()
	cfg := testConfig(t)
	dir := t.TempDir()
	var tokens strings.Builder
	tokens.WriteString("tokens:\n")
	for p, tok := range testTokens {
		tokens.WriteString("  - principal: " + p + "\n    sha256: " + auth.HashToken(tok) + "\n")
	}
	cfg.TokenFile = filepath.Join(dir, "tokens.yaml")
	cfg.PolicyFile = filepath.Join(dir, "policy.yaml")
	for file, data := range map[string]string{cfg.TokenFile: tokens.String(), cfg.PolicyFile: policy} {
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg.HealthInterval = time.Hour // no health reports: the revision moves only by calls
	return cfg
}

func withToken(ctx context.Context, principal string) context.Context {
	if principal == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testTokens[principal])
}

// invoke calls method with a request naming "a/x" and returns the code it
// ends with. A call expected in (letIn) that is still waiting or streaming
// after a moment has passed authorization (codes.OK is returned for it);
// one expected out is given time to be refused: a refusal comes before
// any wait, however loaded the machine.
func invoke(t *testing.T, conn *grpc.ClientConn, m protoreflect.MethodDescriptor, principal string, letIn bool) codes.Code {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
	if err != nil {
		t.Fatal(err)
	}
	req := mt.New()
	api.SetNames(req, "a/x")
	moment := 500 * time.Millisecond
	if !letIn {
		moment = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(withToken(t.Context(), principal), moment)
	defer cancel()
	method := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
	outType, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
	if err != nil {
		t.Fatal(err)
	}
	resp := outType.New().Interface()
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		err = conn.Invoke(ctx, method, req.Interface(), resp)
	} else {
		var st grpc.ClientStream
		st, err = conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.IsStreamingClient(), ServerStreams: m.IsStreamingServer()}, method)
		if err == nil {
			if err = st.SendMsg(req.Interface()); err == nil || errors.Is(err, io.EOF) {
				err = st.RecvMsg(resp)
			}
		}
	}
	code := status.Code(err)
	if wm, ok := resp.(*coorddv1.WatchManyResponse); ok && err == nil {
		// A WatchMany start is refused alone, in a message of the stream.
		switch wm.GetErrorReason() {
		case "UNAUTHENTICATED":
			return codes.Unauthenticated
		case "PERMISSION_DENIED":
			return codes.PermissionDenied
		}
	}
	if code == codes.DeadlineExceeded && ctx.Err() != nil {
		return codes.OK // still waiting (Acquire, Campaign) or streaming: let in
	}
	return code
}

// Every RPC, over gRPC and through the REST gateway: without an identity
// UNAUTHENTICATED, with a principal the policy does not allow
// PERMISSION_DENIED, and with one it allows, let in. The denied calls
// change nothing in etcd.
func TestEveryRPCIsAuthorized(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	d := start(t, cfg)
	conn := dialRaw(t, d.GRPCAddr())
	var methods []protoreflect.MethodDescriptor
	_ = coorddv1.File_coordd_v1_session_proto
	protoregistry.GlobalFiles.RangeFilesByPackage("coordd.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			for j := range fd.Services().Get(i).Methods().Len() {
				methods = append(methods, fd.Services().Get(i).Methods().Get(j))
			}
		}
		return true
	})
	revision := func() int64 {
		st, err := newClientWithToken(t, d.GRPCAddr(), "alice").Admin().ClusterStatus(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return st.Revision
	}
	// The member writes its first health report in the background as it
	// starts (the next is an hour away): wait for it, so that from here
	// only calls move the revision.
	wait.For(t, "the member's first health report", func() bool { return revision() > 1 })
	// The history recorder's first write (the cursor) too.
	wait.For(t, "the history recorder's first write", func() bool { return d.Metric("coordd_history_recording") == 1 })
	before := revision()
	for _, m := range methods {
		wrong := "bob"
		if strings.HasPrefix(string(m.Parent().Name()), "Session") {
			wrong = "carol" // bob may use sessions
		}
		if got := invoke(t, conn, m, "", false); got != codes.Unauthenticated {
			t.Errorf("%s without an identity: %s, want Unauthenticated", m.FullName(), got)
		}
		if m.Name() == "WhoAmI" {
			continue // anyone known may ask its own name (below)
		}
		if got := invoke(t, conn, m, wrong, false); got != codes.PermissionDenied {
			t.Errorf("%s as %s: %s, want PermissionDenied", m.FullName(), wrong, got)
		}
	}
	if after := revision(); after != before {
		t.Errorf("denied calls changed etcd: revision %d -> %d", before, after)
	}
	for _, m := range methods {
		if got := invoke(t, conn, m, "alice", true); got == codes.Unauthenticated || got == codes.PermissionDenied || got == codes.Internal {
			t.Errorf("%s as alice: %s, want it let in", m.FullName(), got)
		}
	}
	// WhoAmI names whoever is known, and nobody else.
	if me, err := newClientWithToken(t, d.GRPCAddr(), "bob").Admin().WhoAmI(t.Context()); err != nil || me.Principal != "bob" || !slices.Equal(me.Groups, []string{"readers"}) || !me.Policy {
		t.Errorf("WhoAmI as bob = %+v, %v", me, err)
	}

	// REST: the gateway authenticates the HTTP request and the daemon
	// authorizes it as any call; a client cannot claim a principal by
	// header.
	base := "http://" + d.HTTPAddr()
	for _, c := range []struct {
		method, path, body string
		headers            map[string]string
		want               int
	}{
		{"GET", "/v1/locks/a/x", "", nil, http.StatusUnauthorized},
		{"GET", "/v1/locks/a/x", "", map[string]string{"Authorization": "Bearer " + testTokens["bob"]}, http.StatusForbidden},
		{"GET", "/v1/locks/a/x", "", map[string]string{"Authorization": "Bearer " + testTokens["alice"]}, http.StatusOK},
		{"GET", "/v1/locks/a/x", "", map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"GET", "/v1/locks/a/x", "", map[string]string{"Grpc-Metadata-X-Coordd-Principal": "alice"}, http.StatusUnauthorized},
		{"GET", "/v1/locks/a/x", "", map[string]string{"X-Coordd-Principal": "alice"}, http.StatusUnauthorized},
		{"POST", "/v1/locks:acquire", `{"name":"a/x","sessionId":"1"}`, map[string]string{"Authorization": "Bearer " + testTokens["bob"]}, http.StatusForbidden},
		{"GET", "/v1/config:get?namespace=b%2Fy&key=k", "", map[string]string{"Authorization": "Bearer " + testTokens["bob"]}, http.StatusNotFound},
		{"GET", "/v1/config:get?namespace=a%2Fy&key=k", "", map[string]string{"Authorization": "Bearer " + testTokens["bob"]}, http.StatusForbidden},
		{"GET", "/metrics", "", nil, http.StatusUnauthorized},
		{"GET", "/metrics", "", map[string]string{"Authorization": "Bearer " + testTokens["bob"]}, http.StatusForbidden},
		{"GET", "/metrics", "", map[string]string{"Authorization": "Bearer " + testTokens["alice"]}, http.StatusOK},
		{"GET", "/openapi.json", "", nil, http.StatusUnauthorized},
		{"GET", "/readyz", "", nil, http.StatusOK},
	} {
		req, err := http.NewRequestWithContext(t.Context(), c.method, base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s %v: %d %s, want %d", c.method, c.path, c.headers, resp.StatusCode, body, c.want)
		}
	}
	// A streaming REST call is checked too.
	if code, body := httpAs(t, "GET", base+"/v1/elections:observe?name=a%2Fx", "bob", ""); !strings.Contains(body, "PERMISSION_DENIED") {
		t.Errorf("observe as bob over REST: %d %s", code, body)
	}

	// The audit log has a line for every refused call and every call
	// that changed something, and releases name the principal as author.
	rel, err := newClientWithToken(t, d.GRPCAddr(), "alice").ConfigCenter().Put(t.Context(), "a/audit", "k", "v", clientlib.PublishOptions{Author: "deploy-bot"})
	if err != nil || rel.Author != "alice (deploy-bot)" {
		t.Errorf("a release by alice: author %q, %v; want alice (deploy-bot)", rel.Author, err)
	}
	data, err := os.ReadFile(cfg.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	var refused, restRefused, alicePut int
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r auth.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Time.IsZero() || r.RPC == "" || r.Result == "" || r.Source == "" {
			t.Fatalf("audit line %q: %+v, %v", line, r, err)
		}
		switch {
		case r.Result == "PermissionDenied" || r.Result == "Unauthenticated":
			refused++
			if strings.HasSuffix(r.RPC, "/DescribeLock") && r.Principal == "bob" && strings.HasPrefix(r.Source, "127.0.0.1:") {
				restRefused++
			}
		case r.Principal == "alice" && strings.HasSuffix(r.RPC, "ConfigService/Put") && slices.Contains(r.Resources, "namespace:a/audit") && r.Result == "OK":
			alicePut++
		}
	}
	if refused < 2*len(methods) || restRefused == 0 || alicePut != 1 {
		t.Errorf("audit log: %d refused lines (want at least %d), %d of bob's REST DescribeLock, %d of alice's put (want 1)", refused, 2*len(methods), restRefused, alicePut)
	}
}

// httpAs sends a REST request as principal ("" for none) and returns the
// status and body.
func httpAs(t *testing.T, method, url, principal, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if principal != "" {
		req.Header.Set("Authorization", "Bearer "+testTokens[principal])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func newClientWithToken(t *testing.T, endpoint, principal string) *clientlib.Client {
	t.Helper()
	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{endpoint}, BearerToken: testTokens[principal]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A policy reload takes effect for new calls without dropping streams;
// a policy that does not validate is refused and the old one stays.
func TestPolicyReload(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	d := start(t, cfg)
	alice := newClientWithToken(t, d.GRPCAddr(), "alice")
	bob := newClientWithToken(t, d.GRPCAddr(), "bob")
	ctx := t.Context()
	obs := alice.Observe(ctx, "a/e")
	if _, ok := <-obs.Events(); !ok {
		t.Fatalf("observe as alice: %v", obs.Err())
	}
	if _, err := bob.ConfigCenter().Put(ctx, "a/ns", "k", "v", clientlib.PublishOptions{}); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("bob writing a/ns before the reload: %v", err)
	}
	granted := testPolicy + "  - principals: [bob]\n    actions: [config.write]\n    namespaces: [\"a/*\"]\n"
	if err := os.WriteFile(cfg.PolicyFile, []byte(granted), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.ConfigCenter().Put(ctx, "a/ns", "k", "v", clientlib.PublishOptions{}); err != nil {
		t.Fatalf("bob writing a/ns after the reload: %v", err)
	}
	if err := os.WriteFile(cfg.PolicyFile, []byte("rules:\n  - principals: [bob]\n    actions: [everything]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(); err == nil || !strings.Contains(err.Error(), "unknown action") {
		t.Fatalf("a bad policy reloaded: %v", err)
	}
	if _, err := bob.ConfigCenter().Put(ctx, "a/ns", "k", "v2", clientlib.PublishOptions{}); err != nil {
		t.Fatalf("after a refused reload the policy in force changed: %v", err)
	}
	// The stream opened before both reloads is still there.
	s, err := alice.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Campaign(ctx, "a/e", "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-obs.Events():
		if !ok {
			t.Fatalf("the observe stream ended across the reloads: %v", obs.Err())
		}
	case <-time.After(wait.Bound(10 * time.Second)):
		t.Fatal("no event on the observe stream after the reloads")
	}
	// Open mode says so.
	open := start(t, testConfig(t))
	if _, body := get(t, "http://"+open.HTTPAddr()+"/readyz"); !strings.Contains(body, "auth: open") {
		t.Errorf("/readyz without a policy: %q", body)
	}
}

// A session belongs to the principal that created it: another principal,
// even one the policy lets use the same names, cannot keep it alive, close
// it, acquire or campaign with it, release its grants or resign its terms,
// and does not see its tokens unless it may release the lock. A principal
// allowed cluster.admin may.
func TestSessionsBelongToTheirPrincipal(t *testing.T) {
	t.Parallel()
	policy := `
rules:
  - principals: [alice, mallory]
    actions: [session, lock.acquire, lock.release, election.campaign, election.observe, kv.fenced]
    locks: ["shared/*"]
    elections: ["shared/*"]
    keys: ["shared/*"]
  - principals: [eve]
    actions: [lock.describe]
    locks: ["shared/*"]
  - principals: [root]
    actions: ["*"]
    locks: ["*"]
    elections: ["*"]
`
	d := start(t, authConfig(t, policy))
	ctx := t.Context()
	alice := newClientWithToken(t, d.GRPCAddr(), "alice")
	mallory := newClientWithToken(t, d.GRPCAddr(), "mallory").Admin()
	s, err := alice.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "shared/l")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := s.Campaign(ctx, "shared/e", "alice")
	if err != nil {
		t.Fatal(err)
	}
	root := newClientWithToken(t, d.GRPCAddr(), "root").Admin()
	if info, err := root.GetSession(ctx, s.ID()); err != nil || info.Principal != "alice" {
		t.Fatalf("the session's principal: %+v, %v", info, err)
	}
	// mallory neither reads alice's session nor sees it listed; her own
	// she does.
	if _, err := mallory.GetSession(ctx, s.ID()); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Errorf("mallory reading alice's session: %v; want PermissionDenied", err)
	}
	ms, err := mallory.CreateSession(ctx, 30*time.Second, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := mallory.ListSessions(ctx); err != nil || len(list) != 1 || list[0].ID != ms.ID {
		t.Errorf("mallory listing sessions: %+v, %v; want her own only", list, err)
	}
	if list, err := root.ListSessions(ctx); err != nil || len(list) != 2 {
		t.Errorf("root listing sessions: %+v, %v; want alice's and mallory's", list, err)
	}
	// Page by page, mallory finds her session, and no page token names
	// alice's (the token after a page that read it is sealed).
	var mine []string
	for tok, pages := "", 0; pages == 0 || tok != ""; pages++ {
		resp, err := coorddv1.NewSessionServiceClient(dialRaw(t, d.GRPCAddr())).ListSessions(withToken(ctx, "mallory"), &coorddv1.ListSessionsRequest{PageSize: 1, PageToken: tok})
		if err != nil || pages > 3 {
			t.Fatalf("mallory listing page %d: %v", pages, err)
		}
		for _, ses := range resp.GetSessions() {
			mine = append(mine, ses.GetId())
		}
		if tok = resp.GetNextPageToken(); strings.Contains(tok, s.ID()) || strings.Contains(tok, ms.ID) {
			t.Errorf("a page token names a session: %q", tok)
		}
	}
	if len(mine) != 1 || mine[0] != ms.ID {
		t.Errorf("mallory's sessions, page by page: %v; want %s", mine, ms.ID)
	}
	// A refusal tells mallory it is not hers, and names neither the owner
	// nor, when she named a grant or a term, the session that holds it.
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, clientlib.ErrPermissionDenied) || !strings.Contains(err.Error(), "is not mallory's") ||
			strings.Contains(err.Error(), "alice") || strings.Contains(what, "token") && strings.Contains(err.Error(), s.ID()) {
			t.Errorf("mallory %s: %v; want PermissionDenied (not hers), naming neither alice nor, for a token, the session", what, err)
		}
	}
	deniedRaw := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not mallory's") || strings.Contains(err.Error(), "alice") {
			t.Errorf("mallory %s: %v; want PermissionDenied (not hers), not naming alice", what, err)
		}
	}
	_, err = mallory.KeepAliveSession(ctx, s.ID())
	denied("keeping alice's session alive", err)
	// Nor in a batch of renewals with one of her own.
	conn := dialRaw(t, d.GRPCAddr())
	st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(withToken(ctx, "mallory"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionIds: []string{ms.ID, s.ID()}, Shared: true}); err != nil {
		t.Fatal(err)
	}
	if _, err = st.Recv(); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not mallory's") || strings.Contains(err.Error(), "alice") {
		t.Errorf("mallory renewing alice's session in a batch: %v; want PermissionDenied (not hers), not naming alice", err)
	}
	denied("closing alice's session", mallory.CloseSession(ctx, s.ID()))
	_, err = mallory.Acquire(ctx, s.ID(), "shared/other")
	denied("acquiring with alice's session", err)
	_, err = mallory.Campaign(ctx, s.ID(), "shared/other", "x")
	denied("campaigning with alice's session", err)
	denied("releasing alice's grant by its token", mallory.Release(ctx, "shared/l", l.Token()))
	denied("resigning alice's term", mallory.Resign(ctx, "shared/e", lead.Term()))
	denied("proclaiming in alice's term", mallory.Proclaim(ctx, "shared/e", lead.Term(), "mallory"))
	// A release or resignation that names some session (her own, one
	// that does not exist) and no request id acts on whoever holds the
	// token: the grant's own session is checked, over gRPC and REST.
	for _, sid := range []string{ms.ID, "1", "ffffffffffff"} {
		_, err = coorddv1.NewLockServiceClient(conn).Release(withToken(ctx, "mallory"), &coorddv1.ReleaseRequest{Name: "shared/l", Token: int64(l.Token()), SessionId: sid})
		deniedRaw("releasing alice's grant naming session "+sid+" over gRPC", err)
		if strings.Contains(fmt.Sprint(err), s.ID()) {
			t.Errorf("the refusal of a release by token names the holder's session: %v", err)
		}
		_, err = coorddv1.NewElectionServiceClient(conn).Resign(withToken(ctx, "mallory"), &coorddv1.ResignRequest{Name: "shared/e", Term: int64(lead.Term()), SessionId: sid})
		deniedRaw("resigning alice's term naming session "+sid+" over gRPC", err)
		for _, c := range []struct{ path, body string }{
			{"/v1/locks:release", fmt.Sprintf(`{"name":"shared/l","token":"%d","sessionId":%q}`, l.Token(), sid)},
			{"/v1/elections:resign", fmt.Sprintf(`{"name":"shared/e","term":"%d","sessionId":%q}`, lead.Term(), sid)},
		} {
			if code, body := httpAs(t, "POST", "http://"+d.HTTPAddr()+c.path, "mallory", c.body); code != http.StatusForbidden || !strings.Contains(body, "is not mallory's") ||
				strings.Contains(body, "alice") || strings.Contains(body, s.ID()) {
				t.Errorf("mallory POST %s %s: %d %s; want 403 (not hers), naming neither alice nor her session", c.path, c.body, code, body)
			}
		}
	}
	_, err = mallory.FencedPut(ctx, l.Fence(), "shared/k", []byte("mallory"))
	denied("writing with alice's lock token", err)
	_, err = mallory.FencedDelete(ctx, clientlib.Fence{Election: "shared/e", Token: lead.Term()}, "shared/k")
	denied("deleting with alice's leadership term", err)
	if _, err := l.Put(ctx, "shared/k", []byte("alice")); err != nil {
		t.Fatalf("alice writing with her own token: %v", err)
	}
	// Nothing of it happened.
	if err := root.ValidateFence(ctx, l.Fence()); err != nil {
		t.Fatalf("alice's grant after mallory's attempts: %v", err)
	}
	if _, err := root.GetSession(ctx, s.ID()); err != nil {
		t.Fatalf("alice's session after mallory's attempts: %v", err)
	}
	if ld, err := newClientWithToken(t, d.GRPCAddr(), "root").Leader(ctx, "shared/e"); err != nil || ld.Term != lead.Term() {
		t.Fatalf("alice's term after mallory's attempts: %+v, %v", ld, err)
	}
	// eve may describe the lock but not release it: she sees no tokens...
	eve := newClientWithToken(t, d.GRPCAddr(), "eve").Admin()
	desc, err := eve.DescribeLock(ctx, "shared/l")
	if err != nil || len(desc.Holders) != 1 || desc.Holders[0].Token != 0 {
		t.Fatalf("eve describing shared/l: %+v, %v; want the holder without its token", desc, err)
	}
	// ...but root, allowed cluster.admin, may do everything.
	if desc, err := root.DescribeLock(ctx, "shared/l"); err != nil || desc.Holders[0].Token != l.Token() {
		t.Fatalf("root describing shared/l: %+v, %v", desc, err)
	}
	if err := root.Release(ctx, "shared/l", l.Token()); err != nil {
		t.Fatalf("root releasing alice's grant: %v", err)
	}
	if err := root.CloseSession(ctx, s.ID()); err != nil {
		t.Fatalf("root closing alice's session: %v", err)
	}
}

// Rate limits: each principal's calls that change something, and each
// namespace's releases, are token buckets. Past them a call is refused
// with RATE_LIMITED (HTTP 429) and a retry hint, changing nothing; others
// are not held up; once the hint has passed the call goes through.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy+"  - principals: [bob, carol]\n    actions: [config.write]\n    namespaces: [\"a/*\"]\n")
	// Slow refills (one token per 20 s and per 4 s), so that a busy
	// machine's slow calls cannot earn a token back within a burst.
	cfg.RateLimit, cfg.RateBurst = 0.05, 3
	cfg.PublishRate, cfg.PublishBurst = 0.25, 2
	d := start(t, cfg)
	ctx := t.Context()
	alice := newClientWithToken(t, d.GRPCAddr(), "alice").Admin()
	bob := newClientWithToken(t, d.GRPCAddr(), "bob")

	// alice's burst of 3 calls that change something, then refused.
	s, err := alice.CreateSession(ctx, 30*time.Second, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := alice.Acquire(ctx, s.ID, fmt.Sprintf("a/l%d", i)); err != nil {
			t.Fatalf("acquire %d within the burst: %v", i, err)
		}
	}
	_, err = alice.Acquire(ctx, s.ID, "a/l2")
	if !errors.Is(err, clientlib.ErrRateLimited) || !strings.Contains(err.Error(), "principal alice") {
		t.Fatalf("alice's 4th call in a burst of 3: %v; want ErrRateLimited", err)
	}
	if d, err := alice.DescribeLock(ctx, "a/l2"); err != nil || len(d.Holders) != 0 {
		t.Fatalf("the refused acquire changed the lock: %+v, %v", d, err)
	}
	// Reads are not limited.
	if _, err := alice.DescribeLock(ctx, "a/l0"); err != nil {
		t.Fatalf("a read while over the rate: %v", err)
	}
	// Releases per namespace, whoever publishes: burst 2 at 0.25/s.
	if _, err := bob.ConfigCenter().Put(ctx, "a/ns", "k", "v1", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.ConfigCenter().Put(ctx, "a/ns", "k", "v2", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = bob.ConfigCenter().Put(ctx, "a/ns", "k", "v3", clientlib.PublishOptions{})
	if !errors.Is(err, clientlib.ErrRateLimited) || !strings.Contains(err.Error(), "namespace a/ns") {
		t.Fatalf("a 3rd release of a/ns in a burst of 2: %v; want ErrRateLimited naming the namespace", err)
	}
	// Over REST: 429 with a RetryInfo detail.
	code, body := httpAs(t, "POST", "http://"+d.HTTPAddr()+"/v1/config:put", "bob", `{"namespace":"a/ns","key":"k","value":"v4"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "RATE_LIMITED") || !strings.Contains(body, "retryDelay") {
		t.Fatalf("REST put over the namespace's rate: %d %s; want 429 RATE_LIMITED with retryDelay", code, body)
	}
	// bob has his own bucket (the refusals above took nothing from it),
	// and another namespace its own.
	if _, err := bob.ConfigCenter().Put(ctx, "a/b1", "k", "v", clientlib.PublishOptions{}); err != nil {
		t.Fatalf("bob in another namespace while alice and a/ns are over their rates: %v", err)
	}
	// Once a token is back, the release goes through.
	// (carol's put: bob has spent his own burst.)
	carol := newClientWithToken(t, d.GRPCAddr(), "carol")
	wait.Within(t, 15*time.Second, "the namespace's bucket to refill", func() bool {
		_, err := carol.ConfigCenter().Put(ctx, "a/ns", "k", "v5", clientlib.PublishOptions{})
		return err == nil
	})
	_, metrics := httpAs(t, "GET", "http://"+d.HTTPAddr()+"/metrics", "alice", "")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(metrics))
	if err != nil {
		t.Fatal(err)
	}
	// alice's 4th acquire; the 3rd release of a/ns and the REST one;
	// and whatever was refused while waiting for the refill.
	if p, ns := value(fams, "coordd_rate_limited_total", "limit", "principal"), value(fams, "coordd_rate_limited_total", "limit", "namespace"); p < 1 || ns < 2 {
		t.Errorf("coordd_rate_limited_total: principal %v (want at least 1), namespace %v (want at least 2)", p, ns)
	}
}

// An audit line's source and transport request id are what the daemon
// observed: over gRPC the peer's address and no request id, whatever
// metadata the client sends (x-coordd-source, x-request-id); over REST
// the HTTP client's address and its X-Request-Id header, which the
// gateway passes in memory.
func TestAuditRecordsWhatTheDaemonObserved(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy)
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	d := start(t, cfg)
	ctx := metadata.AppendToOutgoingContext(withToken(t.Context(), "alice"),
		"x-coordd-source", "6.6.6.6:666", "x-request-id", "forged-id", "x-coordd-request-id", "forged-too")
	if _, err := coorddv1.NewConfigServiceClient(dialRaw(t, d.GRPCAddr())).Put(ctx, &coorddv1.PutRequest{Namespace: "a/grpc", Key: "k", Value: "v"}); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), "POST", "http://"+d.HTTPAddr()+"/v1/config:put", strings.NewReader(`{"namespace":"a/rest","key":"k","value":"v"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testTokens["alice"])
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "deploy-42")
	req.Header.Set("Grpc-Metadata-X-Coordd-Source", "6.6.6.6:666")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("REST put: %s", resp.Status)
	}
	data, err := os.ReadFile(cfg.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]auth.Record{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r auth.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		for _, res := range r.Resources {
			seen[res] = r
		}
	}
	for res, wantID := range map[string]string{"namespace:a/grpc": "", "namespace:a/rest": "deploy-42"} {
		r, ok := seen[res]
		if !ok {
			t.Errorf("no audit line for %s in\n%s", res, data)
			continue
		}
		if !strings.HasPrefix(r.Source, "127.0.0.1:") || r.RequestID != wantID {
			t.Errorf("audit line for %s: source %q, request id %q; want 127.0.0.1:<port> and %q", res, r.Source, r.RequestID, wantID)
		}
	}
}

// Per-principal quotas: a principal at its live-session bound cannot
// create another (gRPC and REST: QUOTA_EXCEEDED, 429) until one ends,
// while another principal can; a principal at its bound of waiting
// acquisitions and campaigns on a member is refused another at once,
// and let in again once one ends. Refused calls change nothing.
func TestPrincipalQuotas(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy+"  - principals: [bob]\n    actions: [session]\n")
	cfg.MaxSessionsPerPrincipal, cfg.MaxWaitersPerPrincipal = 3, 2
	d := start(t, cfg)
	ctx := t.Context()
	alice := newClientWithToken(t, d.GRPCAddr(), "alice").Admin()
	var ids []string
	for range 3 {
		s, err := alice.CreateSession(ctx, 30*time.Second, "", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if _, err := alice.CreateSession(ctx, 30*time.Second, "", "", nil); !errors.Is(err, clientlib.ErrQuotaExceeded) || !strings.Contains(err.Error(), "--max-sessions-per-principal") {
		t.Fatalf("alice's fourth session: %v; want QUOTA_EXCEEDED", err)
	}
	if code, body := httpAs(t, "POST", "http://"+d.HTTPAddr()+"/v1/sessions", "alice", `{"ttl":"30s"}`); code != http.StatusTooManyRequests || !strings.Contains(body, "QUOTA_EXCEEDED") {
		t.Errorf("alice's fourth session over REST: %d %s; want 429 QUOTA_EXCEEDED", code, body)
	}
	if list, err := newClientWithToken(t, d.GRPCAddr(), "alice").Admin().ListSessions(ctx); err != nil || len(list) != 3 {
		t.Errorf("alice's sessions after the refusals: %d, %v; want 3", len(list), err)
	}
	if _, err := newClientWithToken(t, d.GRPCAddr(), "bob").Admin().CreateSession(ctx, 30*time.Second, "", "", nil); err != nil {
		t.Errorf("bob's session while alice is at her bound: %v", err)
	}
	if err := alice.CloseSession(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.CreateSession(ctx, 30*time.Second, "", "", nil); err != nil {
		t.Fatalf("alice's session after closing one: %v", err)
	}

	// Waiters: ids[0] holds a/w, two acquisitions by ids[1] wait; ids[0]
	// leads a/e2, so that a campaign by ids[1] would wait if let in.
	if _, err := alice.Acquire(ctx, ids[0], "a/w"); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Campaign(ctx, ids[0], "a/e2", "leader"); err != nil {
		t.Fatal(err)
	}
	waiting, stop := context.WithCancel(ctx)
	defer stop()
	waits := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := alice.Acquire(waiting, ids[1], "a/w", clientlib.WithRequestID(fmt.Sprintf("wait-%d", i)))
			waits <- err
		}()
	}
	third := func() error {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := alice.Campaign(short, ids[1], "a/e2", "x")
		if err == nil {
			t.Fatal("a campaign with nobody leading did not wait: the test needs a held election")
		}
		return err
	}
	wait.For(t, "two acquisitions waiting", func() bool {
		desc, err := alice.DescribeLock(ctx, "a/w")
		return err == nil && len(desc.Waiters) == 2
	})
	if err := third(); !errors.Is(err, clientlib.ErrQuotaExceeded) || !strings.Contains(err.Error(), "--max-waiters-per-principal") {
		t.Fatalf("a third waiting call: %v; want QUOTA_EXCEEDED", err)
	}
	stop()
	for range 2 {
		if err := <-waits; !errors.Is(err, context.Canceled) {
			t.Errorf("a waiting acquisition, cancelled: %v", err)
		}
	}
	wait.For(t, "a call let in again once the waits ended", func() bool {
		return errors.Is(third(), context.DeadlineExceeded)
	})
}

// Streams are bounded per principal (--max-streams-per-principal): past
// the bound a stream is refused with QUOTA_EXCEEDED (gRPC
// ResourceExhausted) and counted in coordd_quota_refused_total, another
// principal still opens streams, and a stream that ends gives its place
// back.
func TestStreamsPerPrincipal(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, testPolicy+"  - principals: [carol]\n    actions: [lock.describe]\n    locks: [\"a/*\"]\n")
	cfg.MaxStreamsPerPrincipal = 3
	d := start(t, cfg)
	ctx := t.Context()
	alice := newClientWithToken(t, d.GRPCAddr(), "alice").Admin()
	watching, stop := context.WithCancel(ctx)
	defer stop()
	// watch opens one WatchLock stream and reports its first message (or
	// its refusal); the stream stays open until watching ends.
	watch := func(c *clientlib.Admin, name string) <-chan error {
		ch := make(chan error, 2)
		go func() {
			ch <- c.WatchLock(watching, name, func(clientlib.LockState) error {
				ch <- nil
				return nil
			})
		}()
		return ch
	}
	open := 0
	var refusal error
	for range 10 {
		if err := <-watch(alice, "a/w"); err != nil {
			refusal = err
			break
		}
		open++
	}
	if open == 0 || open > cfg.MaxStreamsPerPrincipal || !errors.Is(refusal, clientlib.ErrQuotaExceeded) || !strings.Contains(refusal.Error(), "--max-streams-per-principal") {
		t.Fatalf("alice opened %d streams, then: %v; want at most 3, then QUOTA_EXCEEDED naming the flag", open, refusal)
	}
	if _, body := httpAs(t, "GET", "http://"+d.HTTPAddr()+"/metrics", "alice", ""); !strings.Contains(body, `coordd_quota_refused_total{quota="streams"} 1`) {
		t.Errorf(`coordd_quota_refused_total{quota="streams"} is not 1 after one refusal: %q`, grepLines(body, "coordd_quota_refused_total"))
	}
	carol := newClientWithToken(t, d.GRPCAddr(), "carol").Admin()
	if err := <-watch(carol, "a/w"); err != nil {
		t.Fatalf("carol's stream while alice is at her bound: %v", err)
	}
	stop()
	watching, stop = context.WithCancel(ctx)
	defer stop()
	wait.For(t, "alice's streams to give their places back", func() bool {
		return <-watch(alice, "a/w") == nil
	})
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}
