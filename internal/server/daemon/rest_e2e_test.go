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
