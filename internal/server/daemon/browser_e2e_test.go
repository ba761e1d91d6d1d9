package daemon_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A page on another site cannot make a user's browser act on coordd:
// bodies must be JSON (which a cross-site page cannot send without a
// preflight), cross-origin requests are refused unless their origin is
// allowed, a browser reaching coordd by a name it was not given (DNS
// rebinding) is refused, and CORS preflights are answered only for
// allowed origins. curl-like clients (no browser headers) are unaffected.
// Nothing a refused request asked for happens.
func TestBrowsersCannotActForOtherSites(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.HTTPAllowedOrigins = []string{"https://console.example.com"}
	cfg.HTTPAllowedHosts = []string{"coordd.internal"}
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	do := func(method, path, body string, headers map[string]string) (int, http.Header, string) {
		t.Helper()
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, r)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range headers {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	const create = `{"ttl":"30s","owner":"browser-test"}`
	json := "application/json"
	for _, c := range []struct {
		what    string
		headers map[string]string
		want    int
		says    string
	}{
		{"text/plain body (a no-cors fetch)", map[string]string{"Content-Type": "text/plain"}, http.StatusUnsupportedMediaType, "application/json"},
		{"form body (curl -d, an HTML form)", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType, "--json"},
		{"a body without a content type", nil, http.StatusUnsupportedMediaType, "got none"},
		{"JSON from another origin", map[string]string{"Content-Type": json, "Origin": "http://evil.example"}, http.StatusForbidden, "--http-allowed-origins"},
		{"JSON from a sandboxed page", map[string]string{"Content-Type": json, "Origin": "null"}, http.StatusForbidden, "cross-origin"},
		{"cross-site without an Origin", map[string]string{"Content-Type": json, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden, "cross-site"},
		{"a rebound name, same-origin to the browser", map[string]string{"Content-Type": json, "Host": "evil.example:7421", "Origin": "http://evil.example:7421", "Sec-Fetch-Site": "same-origin"}, http.StatusForbidden, "--http-allowed-hosts"},
	} {
		if code, _, body := do("POST", "/v1/sessions", create, c.headers); code != c.want || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %s; want %d saying %q", c.what, code, body, c.want, c.says)
		}
	}
	if code, _, body := do("GET", "/v1/sessions", "", map[string]string{"Host": "evil.example", "Sec-Fetch-Mode": "cors"}); code != http.StatusForbidden {
		t.Errorf("a read by a browser through a rebound name: %d %s; want 403", code, body)
	}
	if _, _, body := do("GET", "/v1/sessions", "", nil); strings.Contains(body, "browser-test") {
		t.Fatalf("a refused request created a session: %s", body)
	}

	// Let through: non-browser clients by any name, coordd's own origin,
	// an allowed origin (with CORS headers), an allowed host name.
	for _, c := range []struct {
		what    string
		headers map[string]string
	}{
		{"curl --json", map[string]string{"Content-Type": json}},
		{"JSON with a charset", map[string]string{"Content-Type": "application/json; charset=utf-8"}},
		{"a service by a DNS name", map[string]string{"Content-Type": json, "Host": "coordd.svc.cluster.local:7421"}},
		{"the console (same origin)", map[string]string{"Content-Type": json, "Origin": base, "Sec-Fetch-Site": "same-origin"}},
		{"an allowed host name", map[string]string{"Content-Type": json, "Host": "coordd.internal:7421", "Origin": "http://coordd.internal:7421", "Sec-Fetch-Site": "same-origin"}},
		{"an allowed origin", map[string]string{"Content-Type": json, "Origin": "https://console.example.com", "Sec-Fetch-Site": "cross-site"}},
	} {
		code, h, body := do("POST", "/v1/sessions", create, c.headers)
		if code != http.StatusOK {
			t.Errorf("%s: %d %s; want 200", c.what, code, body)
		}
		if o := c.headers["Origin"]; o == "https://console.example.com" && h.Get("Access-Control-Allow-Origin") != o {
			t.Errorf("%s: Access-Control-Allow-Origin %q; want %q", c.what, h.Get("Access-Control-Allow-Origin"), o)
		}
	}

	// CORS preflights.
	code, h, _ := do("OPTIONS", "/v1/sessions", "", map[string]string{"Origin": "https://console.example.com", "Access-Control-Request-Method": "POST"})
	if code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://console.example.com" || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight from an allowed origin: %d %v", code, h)
	}
	if code, h, _ := do("OPTIONS", "/v1/sessions", "", map[string]string{"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}); code != http.StatusForbidden || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin: %d %v; want 403 without CORS headers", code, h)
	}
}

// A client that sends its request body too slowly is cut off at
// HTTPBodyTimeout instead of holding a connection and a handler forever.
func TestSlowBodiesAreCutOff(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.HTTPBodyTimeout = 300 * time.Millisecond
	d := start(t, cfg)
	conn, err := net.Dial("tcp", d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := io.WriteString(conn, "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ttl\":"); err != nil {
		t.Fatal(err)
	}
	// Far past the timeout, short of a hang: the server must have ended
	// the request (an answer, or the connection closed) by then.
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server still waited for the body 20 s later")
	}
}
