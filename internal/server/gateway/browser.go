package gateway

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/coordd/coordd/internal/server/api"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Browsers are the one kind of client that acts on behalf of someone
// else: a page from any site can make the user's browser send requests to
// coordd, with the user's network position and client certificate. The
// guard below keeps such requests out, and lets every non-browser client
// (curl, the SDKs, services) through unchanged:
//
//   - Cross-site requests (CSRF): a request whose Origin is not coordd's
//     own origin or one of AllowedOrigins is refused, as is one a browser
//     marks cross-site (Sec-Fetch-Site) without an Origin. A request body
//     must be application/json, which a page on another site cannot send
//     without a CORS preflight, which is refused unless allowed.
//   - DNS rebinding: a page whose name is made to resolve to coordd's
//     address is same-origin to the browser, so the Host header is what
//     tells: on plaintext HTTP, requests from a browser (those carrying
//     Origin or Sec-Fetch-* headers) must name coordd by an IP address,
//     localhost, or one of AllowedHosts. Over TLS the browser itself
//     refuses coordd's certificate for the attacker's name.
//   - CORS is answered deliberately: a preflight from an allowed origin
//     gets the methods and headers the API takes; any other is refused.
//
// Non-guarantee: a browser too old to send Origin on cross-site writes or
// Sec-Fetch-* headers is only held back by the content type check.

// BrowserPolicy says which other origins and host names browsers may use.
type BrowserPolicy struct {
	// AllowedOrigins are origins ("https://console.example.com") whose
	// pages may call the API cross-origin; "*" allows every origin.
	AllowedOrigins []string
	// AllowedHosts are host names (without port) a browser may reach
	// coordd by over plaintext HTTP, besides IP addresses and localhost.
	AllowedHosts []string
}

func (p BrowserPolicy) originAllowed(origin string) bool {
	return slices.Contains(p.AllowedOrigins, "*") || slices.ContainsFunc(p.AllowedOrigins, func(o string) bool {
		return strings.EqualFold(strings.TrimSuffix(o, "/"), origin)
	})
}

func (p BrowserPolicy) hostAllowed(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") ||
		slices.ContainsFunc(p.AllowedHosts, func(h string) bool { return strings.EqualFold(h, host) })
}

// fromBrowser reports whether a request carries the headers only browsers
// send.
func fromBrowser(r *http.Request) bool {
	return r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != "" || r.Header.Get("Sec-Fetch-Mode") != ""
}

// sameOrigin reports whether origin names the host the request was sent
// to. The scheme is not compared: behind a TLS-terminating proxy the page
// is https while coordd sees plaintext.
func sameOrigin(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

const (
	corsMethods = "GET, POST, PUT, PATCH, DELETE"
	corsHeaders = "Authorization, Content-Type, X-Request-Id"
)

// guardBrowsers wraps every route of the HTTP listener.
func guardBrowsers(p BrowserPolicy, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r) // probes: nothing to read or change
			return
		}
		if fromBrowser(r) && !p.hostAllowed(r) {
			refuse(w, "the Host "+r.Host+" is not one coordd answers browsers on over plaintext HTTP (a page could have made its own name resolve here): use an IP address or localhost, or add the name to --http-allowed-hosts")
			return
		}
		origin := r.Header.Get("Origin")
		crossOrigin := origin != "" && !sameOrigin(r, origin)
		if crossOrigin && !p.originAllowed(origin) {
			refuse(w, "cross-origin request from "+origin+" refused: add the origin to --http-allowed-origins to let its pages call coordd")
			return
		}
		if origin == "" {
			switch r.Header.Get("Sec-Fetch-Site") {
			case "cross-site", "same-site":
				refuse(w, "cross-site request refused (Sec-Fetch-Site without an Origin)")
				return
			}
		}
		if crossOrigin {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", origin)
			h.Add("Vary", "Origin")
			if r.Method == http.MethodOptions {
				h.Set("Access-Control-Allow-Methods", corsMethods)
				h.Set("Access-Control-Allow-Headers", corsHeaders)
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		if r.Method == http.MethodOptions {
			w.Header().Set("Allow", corsMethods+", OPTIONS")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") && hasBody(r) && !isJSON(r.Header.Get("Content-Type")) {
			writeStatus(w, http.StatusUnsupportedMediaType, api.NewStatus(codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT,
				"a request body must be JSON with Content-Type: application/json (got "+quoteOr(r.Header.Get("Content-Type"), "none")+"); with curl, use --json"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func refuse(w http.ResponseWriter, msg string) {
	writeStatus(w, http.StatusForbidden, api.NewStatus(codes.PermissionDenied, coorddv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, msg))
}

// hasBody reports whether a request sends a body (known or chunked).
func hasBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

func quoteOr(s, none string) string {
	if s == "" {
		return none
	}
	return `"` + s + `"`
}
