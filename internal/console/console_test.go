package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string, header map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func TestServesTheConsoleWithItsHeaders(t *testing.T) {
	h := Handler()
	for path, ctype := range map[string]string{"/": "text/html", "/index.html": "text/html", "/app.js": "javascript", "/style.css": "text/css", "/icon.svg": "image/svg+xml"} {
		resp := get(t, h, path, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || len(body) == 0 || !strings.Contains(resp.Header.Get("Content-Type"), ctype) {
			t.Fatalf("GET %s: %d, %q, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe") {
			t.Fatalf("GET %s: Content-Security-Policy %q", path, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Cache-Control") != "no-cache" {
			t.Fatalf("GET %s: headers %v", path, resp.Header)
		}
		// Revalidation: an unchanged file is not sent again.
		again := get(t, h, path, map[string]string{"If-None-Match": resp.Header.Get("ETag")})
		if again.StatusCode != http.StatusNotModified {
			t.Fatalf("GET %s with its ETag: %d, want 304", path, again.StatusCode)
		}
	}
	for _, path := range []string{"/nope.js", "/../console.go", "/assets/app.js"} {
		if resp := get(t, h, path, nil); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// Nothing in the console comes from another origin, and every URL it uses
// is relative (so a path prefix in front of coordd keeps working).
func TestAssetsUseNoOtherOriginAndNoAbsolutePath(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	rooted := regexp.MustCompile(`(href|src)="/`)
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		// SVG's namespace (the icon's, and the charts' createElementNS) is a
		// name, never fetched.
		text := strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", "")
		if m := external.FindString(text); m != "" {
			t.Errorf("%s refers to another origin: %q", p, m)
		}
		if m := rooted.FindString(text); m != "" {
			t.Errorf("%s uses a path from the root: %q", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
