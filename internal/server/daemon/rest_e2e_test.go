package daemon_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
)

// restSession creates a session of TTL 30s over REST and returns its id.
func restSession(t *testing.T, base string) string {
	t.Helper()
	r := call(t, "POST", base+"/v1/sessions", `{"ttl":"30s"}`)
	if r.status != 200 {
		t.Fatalf("create session = %d %v", r.status, r.body)
	}
	return r.body["session"].(map[string]any)["id"].(string)
}

// Locks, elections and namespaces share one name rule over REST: a name
// that a client or proxy could normalise into another is refused with
// INVALID_ARGUMENT and creates nothing, and a valid one reads back under
// the same name.
func TestRESTNameRule(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	s := restSession(t, base)

	for _, name := range []string{"../etc/passwd", "a/../b", "./a", "/leading", "trailing/", "a//b", ".", "a b"} {
		for _, c := range []struct{ path, body string }{
			{"/v1/locks:acquire", fmt.Sprintf(`{"name":%q,"sessionId":%q}`, name, s)},
			{"/v1/elections:campaign", fmt.Sprintf(`{"name":%q,"sessionId":%q,"value":"v"}`, name, s)},
			{"/v1/config:put", fmt.Sprintf(`{"namespace":%q,"key":"k","value":"v"}`, name)},
		} {
			if r := call(t, "POST", base+c.path, c.body); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
				t.Errorf("%s %q = %d %v, want 400 INVALID_ARGUMENT", c.path, name, r.status, r.body)
			}
		}
	}
	if r := call(t, "GET", base+"/v1/locks", ""); len(r.body["names"].([]any)) != 0 {
		t.Errorf("refused names created locks: %v", r.body)
	}
	if r := call(t, "GET", base+"/v1/config:namespaces", ""); len(r.body["namespaces"].([]any)) != 0 {
		t.Errorf("refused names created namespaces: %v", r.body)
	}

	const name = "team.a/v1.2/job:nightly@eu-1"
	if r := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":%q,"sessionId":%q}`, name, s)); r.status != 200 {
		t.Fatalf("acquire %q = %d %v", name, r.status, r.body)
	}
	r := call(t, "GET", base+"/v1/locks/"+name, "")
	if r.status != 200 || r.body["name"] != name || len(r.body["holders"].([]any)) != 1 {
		t.Fatalf("GET /v1/locks/%s = %d %v, want the lock with its holder", name, r.status, r.body)
	}
}

// Durations in bodies take Go's syntax as well as seconds; every response
// and every stream line ends with a newline.
func TestRESTDurationsAndNewlines(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()
	for in, want := range map[string]string{"1m": "60s", "90s": "90s", "1h": "3600s", "2.5s": "3s"} {
		r := call(t, "POST", base+"/v1/sessions", fmt.Sprintf(`{"ttl":%q}`, in))
		if r.status != 200 || r.body["session"].(map[string]any)["ttl"] != want {
			t.Errorf("ttl %q = %d %v, want %s", in, r.status, r.body, want)
		}
	}
	r := call(t, "POST", base+"/v1/sessions", `{"ttl":"1m"}`)
	s := r.body["session"].(map[string]any)["id"].(string)
	if r := call(t, "POST", base+"/v1/locks:acquire", fmt.Sprintf(`{"name":"d","sessionId":%q,"wait":"1m","lockDelay":"1m"}`, s)); r.status != 200 {
		t.Errorf(`acquire with "wait":"1m","lockDelay":"1m" = %d %v`, r.status, r.body)
	}
	if r := call(t, "POST", base+"/v1/sessions", `{"ttl":"soon"}`); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
		t.Errorf(`ttl "soon" = %d %v, want 400 INVALID_ARGUMENT`, r.status, r.body)
	}

	for _, path := range []string{"/v1/sessions", "/v1/locks/d", "/v1/sessions/0000000000000001", "/v1/nowhere"} {
		resp, err := httpClient.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.HasSuffix(string(b), "}\n") {
			t.Errorf("GET %s (%d) = %q, want JSON ending with a newline", path, resp.StatusCode, b)
		}
	}

	resp, err := httpClient.Get(base + "/v1/elections:observe?name=" + url.QueryEscape("d"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		t.Fatalf("first observe line: %v", err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(line), &v); err != nil || v["result"] == nil {
		t.Fatalf("first observe line %q is not one JSON object: %v", line, err)
	}
}

// Every REST error, unary, routing or on a stream, has one body:
// {"error":{"code":<HTTP status>,"status":<gRPC code>,"reason":<coordd's>,
// "message","details"}}; its message speaks of the request the caller
// wrote, never of protobuf or Go types; durations take a plain number of
// seconds in bodies and in query parameters.
func TestRESTErrorBodies(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	base := "http://" + d.HTTPAddr()

	for _, c := range []struct {
		method, path, body string
		status             int
		grpc, reason       string
		says               string
	}{
		{"POST", "/v1/sessions", `{"ttl":"1s"}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "ttl 1s is outside"},
		{"GET", "/v1/sessions/00000000000000ff", "", 404, "NOT_FOUND", "SESSION_NOT_FOUND", "session"},
		{"GET", "/v1/nowhere", "", 404, "NOT_FOUND", "UNKNOWN_ROUTE", "no such endpoint: /v1/nowhere"},
		{"PUT", "/v1/sessions", `{}`, 405, "UNIMPLEMENTED", "UNKNOWN_ROUTE", "method PUT is not allowed"},
		{"POST", "/v1/sessions", `{"ttl":"30s"`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "ends before its JSON value does"},
		{"POST", "/v1/sessions", `{"ttl":"30s",}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "not valid JSON at byte 14"},
		{"POST", "/v1/sessions", `[{"ttl":"30s"}]`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "must be a JSON object"},
		{"POST", "/v1/sessions", `{"ttl":"30s","bogus":1}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `has no field "bogus"`},
		{"POST", "/v1/sessions", `{"ttl":"soon"}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `"soon" is not a duration`},
		{"POST", "/v1/sessions", `{"ttl":"30s","owner":5}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `field "owner" takes a string, not 5`},
		{"POST", "/v1/config:put", `{"namespace":"a/b","key":"k","value":["x"]}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `field "value" takes a string`},
		{"POST", "/v1/sessions", `{"ttl":"30s","labels":"team"}`, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `field "labels" takes an object of strings, such as {"name": "value"}, not "team"`},
		{"GET", "/v1/config:poll?namespace=a/b&wait=abc", "", 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", `query parameter "wait": "abc" is not a duration`},
		{"POST", "/v1/sessions", `{"owner":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "INVALID_ARGUMENT", "REQUEST_TOO_LARGE", "request body"},
	} {
		r := call(t, c.method, base+c.path, c.body)
		e, _ := r.body["error"].(map[string]any)
		if r.status != c.status || reason(r) != c.reason || e["status"] != c.grpc || !strings.Contains(message(r), c.says) {
			t.Errorf("%s %s %.60s = %d %v; want %d %s %s saying %q", c.method, c.path, c.body, r.status, r.body, c.status, c.grpc, c.reason, c.says)
		}
		if _, ok := e["details"].([]any); !ok {
			t.Errorf("%s %s: no details list: %v", c.method, c.path, r.body)
		}
		for _, leak := range []string{"proto", "Go value", "json.", "google.protobuf", "(line 1:"} {
			if strings.Contains(message(r), leak) {
				t.Errorf("%s %s %.60s: message %q shows %q", c.method, c.path, c.body, message(r), leak)
			}
		}
	}

	// A stream that fails before its first message answers the same body.
	resp, err := httpClient.Get(base + "/v1/elections:observe?name=" + url.QueryEscape("a//b"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("observe of a bad name: %q is not one JSON object: %v", raw, err)
	}
	if r := (httpResult{status: resp.StatusCode, body: body}); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
		t.Errorf("observe of a bad name = %d %s, want 400 INVALID_ARGUMENT in the REST error body", resp.StatusCode, raw)
	}

	// Plain numbers of seconds.
	for _, body := range []string{`{"ttl":30}`, `{"ttl":"30"}`, `{"ttl":"30.0"}`} {
		if r := call(t, "POST", base+"/v1/sessions", body); r.status != 200 || r.body["session"].(map[string]any)["ttl"] != "30s" {
			t.Errorf("POST /v1/sessions %s = %d %v, want a session of 30s", body, r.status, r.body)
		}
	}
	for _, body := range []string{`{"ttl":"1e3"}`, `{"ttl":"0x10"}`, `{"ttl":"NaN"}`, `{"ttl":" 30"}`} {
		if r := call(t, "POST", base+"/v1/sessions", body); r.status != 400 || reason(r) != "INVALID_ARGUMENT" {
			t.Errorf("POST /v1/sessions %s = %d %v, want 400 INVALID_ARGUMENT", body, r.status, r.body)
		}
	}
	if r := call(t, "POST", base+"/v1/config:put", `{"namespace":"a/b","key":"k","value":"1"}`); r.status != 200 {
		t.Fatalf("config put = %d %v", r.status, r.body)
	}
	// A poll after a revision that will not come within its wait of 1
	// (second) answers "not modified" when the wait ends.
	if r := call(t, "GET", base+"/v1/config:poll?namespace=a/b&afterRevision=999999&wait=1", ""); r.status != 200 || r.body["modified"] != false {
		t.Errorf("poll with wait=1 = %d %v, want 200 not modified", r.status, r.body)
	}
}
