package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

func TestSessionsThroughSDK(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	ctx := t.Context()

	s, err := c.NewSession(ctx, clientlib.WithTTL(5*time.Second), clientlib.WithOwner("billing"), clientlib.WithLabels(map[string]string{"zone": "a"}))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	if s.TTL() != 5*time.Second || len(s.ID()) != 16 {
		t.Fatalf("session id %q ttl %s", s.ID(), s.TTL())
	}
	if until := time.Until(s.Deadline()); until <= 0 || until > 5*time.Second-margin(5*time.Second) {
		t.Fatalf("local deadline in %s, want within TTL-margin = %s", until, 5*time.Second-margin(5*time.Second))
	}
	info, err := c.Admin().GetSession(ctx, s.ID())
	if err != nil {
		t.Fatalf("GetSession: %v", err)
	}
	if info.Owner != "billing" || info.Labels["zone"] != "a" || info.Hostname == "" || info.Remaining <= 0 {
		t.Fatalf("GetSession = %+v", info)
	}
	if len(info.Locks) != 0 || len(info.Elections) != 0 {
		t.Fatalf("a new session holds %v and campaigns in %v", info.Locks, info.Elections)
	}
	// What it holds, waits for, leads and campaigns in, by name (names with
	// slashes included); another session's entries are not its.
	other, err := c.NewSession(ctx, clientlib.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close(ctx) }()
	if _, err := other.Lock(ctx, "jobs/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Campaign(ctx, "leader/y", "o"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"jobs/a", "jobs/c"} {
		if _, err := s.Lock(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Campaign(ctx, "leader/x", "v"); err != nil {
		t.Fatal(err)
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	var waiting sync.WaitGroup
	defer func() { stopWaiting(); waiting.Wait() }()
	waiting.Go(func() { _, _ = s.Lock(waitCtx, "jobs/b") })            // waits behind other
	waiting.Go(func() { _, _ = s.Campaign(waitCtx, "leader/y", "v") }) // campaigns behind other
	wait.For(t, "the session's holdings listed", func() bool {
		info, err = c.Admin().GetSession(ctx, s.ID())
		return err == nil && slices.Equal(info.Locks, []string{"jobs/a", "jobs/b", "jobs/c"}) && slices.Equal(info.Elections, []string{"leader/x", "leader/y"})
	})
	// A detailed list says the same of every session, with its time left.
	detailed, err := c.Admin().ListSessionsDetailed(ctx)
	if err != nil || len(detailed) != 2 {
		t.Fatalf("ListSessionsDetailed = %+v, %v", detailed, err)
	}
	for _, d := range detailed {
		if d.ID == s.ID() && (!slices.Equal(d.Locks, info.Locks) || !slices.Equal(d.Elections, info.Elections) || d.Remaining <= 0 || d.Remaining > d.TTL) {
			t.Fatalf("ListSessionsDetailed of the session = %+v, want %v, %v and a time left", d, info.Locks, info.Elections)
		}
	}
	stopWaiting()
	waiting.Wait()

	// Keep-alives move the local deadline forward.
	first := s.Deadline()
	wait.Within(t, 5*time.Second, "a keep-alive to move the deadline", func() bool { return s.Deadline().After(first) })
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := c.Admin().ListSessions(ctx)
	if err != nil || len(all) != 1 || all[0].ID != s.ID() {
		t.Fatalf("ListSessions = %+v, %v", all, err)
	}

	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-s.Done()
	if !errors.Is(s.Err(), clientlib.ErrSessionClosed) {
		t.Fatalf("Err after Close = %v", s.Err())
	}
	if _, err := c.Admin().GetSession(ctx, s.ID()); !errors.Is(err, clientlib.ErrSessionNotFound) {
		t.Fatalf("GetSession after Close: %v, want ErrSessionNotFound", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Bad input through the SDK maps to sentinels.
	if _, err := c.NewSession(ctx, clientlib.WithTTL(time.Millisecond)); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Fatalf("tiny TTL: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.NewSession(ctx, clientlib.WithOwner(strings.Repeat("x", 300))); !errors.Is(err, clientlib.ErrValueTooLarge) {
		t.Fatalf("huge owner: %v, want ErrValueTooLarge", err)
	}
	if _, err := c.NewSession(ctx, clientlib.WithOwner(strings.Repeat("x", 2<<20))); !errors.Is(err, clientlib.ErrRequestTooLarge) {
		t.Fatalf("request over the limit: %v, want ErrRequestTooLarge", err)
	}
	if err := c.Admin().CloseSession(ctx, "zz"); !errors.Is(err, clientlib.ErrInvalidArgument) {
		t.Fatalf("malformed id: %v, want ErrInvalidArgument", err)
	}
	if err := c.Admin().CloseSession(ctx, "0000000000000abc"); !errors.Is(err, clientlib.ErrSessionNotFound) {
		t.Fatalf("unknown id: %v, want ErrSessionNotFound", err)
	}
}

// A keep-alive stream message over the size limit ends the stream with
// gRPC's own ResourceExhausted (the SDK maps it to ErrRequestTooLarge), and
// the daemon lives on.
func TestKeepAliveStreamTooLarge(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	conn := dialRaw(t, d.GRPCAddr())
	st, err := coorddv1.NewSessionServiceClient(conn).KeepAliveStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&coorddv1.KeepAliveStreamRequest{SessionId: strings.Repeat("f", 2<<20)}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized stream message: %v, want ResourceExhausted", err)
	}
	if err := d.Ready(t.Context()); err != nil {
		t.Fatalf("daemon not ready after an oversized message: %v", err)
	}
}

// A session whose server side was closed behind its back ends at once with
// ErrSessionNotFound, long before its local deadline.
func TestSessionLostWhenClosedElsewhere(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	c := newClient(t, d.GRPCAddr())
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Admin().CloseSession(t.Context(), s.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(wait.Bound(15 * time.Second)):
		t.Fatal("session not reported lost within one keep-alive interval")
	}
	if !errors.Is(s.Err(), clientlib.ErrSessionNotFound) {
		t.Fatalf("Err = %v, want ErrSessionNotFound", s.Err())
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatalf("Close of a lost session: %v", err)
	}
}

type httpResult struct {
	status int
	body   map[string]any
}

func call(t *testing.T, method, url, body string) httpResult {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := httpResult{status: resp.StatusCode}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, url, raw, err)
		}
	}
	return r
}

// reason is the reason of a REST error body,
// {"error":{"code","status","reason","message","details"}}, or "" for a
// body that is not one. The reason at the top must be the one in the
// body's ErrorInfo, if it has one, and the code the response's status.
func reason(r httpResult) string {
	e, ok := r.body["error"].(map[string]any)
	if !ok {
		return ""
	}
	top, _ := e["reason"].(string)
	if code, _ := e["code"].(float64); int(code) != r.status {
		return fmt.Sprintf("(body code %v, response %d)", e["code"], r.status)
	}
	details, _ := e["details"].([]any)
	for _, d := range details {
		if m, ok := d.(map[string]any); ok && m["domain"] == "coordd" && m["reason"] != top {
			return fmt.Sprintf("(reason %q at the top, %q in the ErrorInfo)", top, m["reason"])
		}
	}
	return top
}

// message is the message of a REST error body.
func message(r httpResult) string {
	e, _ := r.body["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

func TestSessionsOverHTTP(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()

	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		if r := call(t, "GET", base+path, ""); r.status != 200 {
			t.Errorf("GET %s = %d", path, r.status)
		}
	}

	r := call(t, "POST", base+"/v1/sessions", `{"ttl":"10s","owner":"curl","labels":{"team":"payments"}}`)
	if r.status != 200 {
		t.Fatalf("create = %d %v", r.status, r.body)
	}
	sess := r.body["session"].(map[string]any)
	id := sess["id"].(string)
	if sess["ttl"] != "10s" || sess["owner"] != "curl" {
		t.Fatalf("create body = %v", r.body)
	}
	if r := call(t, "GET", base+"/v1/sessions/"+id, ""); r.status != 200 || r.body["session"].(map[string]any)["remainingTtl"] == nil {
		t.Fatalf("get = %d %v", r.status, r.body)
	}
	if r := call(t, "POST", base+"/v1/sessions/"+id+":keepalive", `{}`); r.status != 200 || r.body["ttl"] != "10s" {
		t.Fatalf("keepalive = %d %v", r.status, r.body)
	}
	if r := call(t, "GET", base+"/v1/sessions", ""); r.status != 200 || len(r.body["sessions"].([]any)) != 1 {
		t.Fatalf("list = %d %v", r.status, r.body)
	}

	// Every bad request gets its code and reason and changes nothing.
	bad := []struct {
		name, method, path, body string
		status                   int
		reason                   string
	}{
		{"missing ttl", "POST", "/v1/sessions", `{}`, 400, "INVALID_ARGUMENT"},
		{"zero ttl", "POST", "/v1/sessions", `{"ttl":"0s"}`, 400, "INVALID_ARGUMENT"},
		{"negative ttl", "POST", "/v1/sessions", `{"ttl":"-5s"}`, 400, "INVALID_ARGUMENT"},
		{"tiny ttl", "POST", "/v1/sessions", `{"ttl":"0.001s"}`, 400, "INVALID_ARGUMENT"},
		{"huge ttl", "POST", "/v1/sessions", `{"ttl":"999999s"}`, 400, "INVALID_ARGUMENT"},
		{"ttl not a duration", "POST", "/v1/sessions", `{"ttl":"ten"}`, 400, "INVALID_ARGUMENT"},
		{"oversized owner", "POST", "/v1/sessions", `{"ttl":"5s","owner":"` + strings.Repeat("o", 300) + `"}`, 400, "VALUE_TOO_LARGE"},
		{"too many labels", "POST", "/v1/sessions", `{"ttl":"5s","labels":{` + manyLabels(40) + `}}`, 400, "VALUE_TOO_LARGE"},
		{"bad label key", "POST", "/v1/sessions", `{"ttl":"5s","labels":{"a b":"c"}}`, 400, "INVALID_ARGUMENT"},
		{"malformed json", "POST", "/v1/sessions", `{"ttl":`, 400, "INVALID_ARGUMENT"},
		{"unknown field", "POST", "/v1/sessions", `{"ttl":"5s","color":"red"}`, 400, "INVALID_ARGUMENT"},
		{"body over the limit", "POST", "/v1/sessions", `{"ttl":"5s","owner":"` + strings.Repeat("o", 2<<20) + `"}`, 413, "REQUEST_TOO_LARGE"},
		{"malformed id", "GET", "/v1/sessions/not-hex", "", 400, "INVALID_ARGUMENT"},
		{"id too long", "GET", "/v1/sessions/11112222333344445", "", 400, "INVALID_ARGUMENT"},
		{"unknown id", "GET", "/v1/sessions/00000000000000ff", "", 404, "SESSION_NOT_FOUND"},
		{"keepalive unknown", "POST", "/v1/sessions/00000000000000ff:keepalive", `{}`, 404, "SESSION_NOT_FOUND"},
		{"close unknown", "DELETE", "/v1/sessions/00000000000000ff", "", 404, "SESSION_NOT_FOUND"},
		{"bad page size", "GET", "/v1/sessions?pageSize=5000", "", 400, "INVALID_ARGUMENT"},
		{"bad page token", "GET", "/v1/sessions?pageToken=zz", "", 400, "INVALID_ARGUMENT"},
		{"wrong method", "PUT", "/v1/sessions", `{}`, 405, "UNKNOWN_ROUTE"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, tt.method, base+tt.path, tt.body)
			if r.status != tt.status || reason(r) != tt.reason {
				t.Fatalf("%s %s = %d %q (%v), want %d %q", tt.method, tt.path, r.status, reason(r), message(r), tt.status, tt.reason)
			}
		})
	}
	if r := call(t, "GET", base+"/v1/sessions", ""); len(r.body["sessions"].([]any)) != 1 {
		t.Fatalf("bad requests changed the session list: %v", r.body)
	}

	if r := call(t, "DELETE", base+"/v1/sessions/"+id, ""); r.status != 200 {
		t.Fatalf("close = %d %v", r.status, r.body)
	}
	if r := call(t, "GET", base+"/v1/sessions/"+id, ""); r.status != 404 {
		t.Fatalf("get after close = %d", r.status)
	}
}

func manyLabels(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `"k` + strings.Repeat("x", i) + `":"v"`
	}
	return strings.Join(parts, ",")
}

// A restarted daemon on the same data dir still has a live session.
func TestRestartKeepsSession(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	// Stopped at the test's end even after a failure (start); the restart
	// below stops it earlier, which Stop allows (it is idempotent).
	d := start(t, cfg)
	r := call(t, "POST", "http://"+d.HTTPAddr()+"/v1/sessions", `{"ttl":"60s","owner":"survivor"}`)
	if r.status != 200 {
		t.Fatalf("create = %d %v", r.status, r.body)
	}
	id := r.body["session"].(map[string]any)["id"].(string)
	if err := d.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}

	d2 := start(t, cfg)
	r = call(t, "GET", "http://"+d2.HTTPAddr()+"/v1/sessions/"+id, "")
	if r.status != 200 || r.body["session"].(map[string]any)["owner"] != "survivor" {
		t.Fatalf("after restart: %d %v", r.status, r.body)
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.EtcdClientURL = "http://0.0.0.0:2379"
	cfg.KeyRoot = "coordd"
	cfg.InitialClusterState = "maybe"
	_, err := daemon.Start(t.Context(), cfg)
	if err == nil {
		t.Fatal("Start accepted an invalid configuration")
	}
	for _, want := range []string{"not a loopback address", "--key-root", "--initial-cluster-state"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}
