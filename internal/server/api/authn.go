package api

import (
	"context"
	"crypto/x509"
	"net/http"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/base/errkind"
)

// Where a certificate's principal is read from.
const (
	IdentityFromCN  = "cn"  // the subject's common name
	IdentityFromURI = "uri" // the first URI SAN, e.g. spiffe://corp/payments
)

// Metadata keys the REST gateway uses to hand the principal it
// authenticated to the daemon's internal gRPC server. Clients cannot set
// them: the gateway drops such headers, and the public server ignores them.
const (
	forwardedPrincipal = "x-coordd-principal"
	forwardedGroups    = "x-coordd-groups"
	forwardedError     = "x-coordd-auth-error"
	forwardedSource    = "x-coordd-source"     // the HTTP client's address
	forwardedRequestID = "x-coordd-request-id" // its X-Request-Id header
)

// maxRequestIDBytes bounds the X-Request-Id an audit line records.
const maxRequestIDBytes = 128

// Authenticator finds a call's principal: a bearer token (the
// "authorization: Bearer ..." metadata or HTTP header), checked against the
// token file, or else a verified client certificate (CN or URI SAN). A
// token that is sent must check, in open mode too; a call with neither is
// anonymous. Tokens can be replaced while running (SetTokens).
type Authenticator struct {
	IdentityFrom string // IdentityFromCN (default) or IdentityFromURI
	// Forwarded trusts the principal the REST gateway forwards; set only
	// on the daemon's internal server, which only the gateway reaches.
	Forwarded bool
	tokens    atomic.Pointer[auth.Tokens]
}

// SetTokens puts a token file in force (nil: no tokens are accepted).
func (a *Authenticator) SetTokens(t *auth.Tokens) { a.tokens.Store(t) }

// Principal implements Authn for gRPC calls.
func (a *Authenticator) Principal(ctx context.Context) (auth.Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a.Forwarded {
		if msg := md.Get(forwardedError); len(msg) > 0 {
			return auth.Anonymous, errkind.Unauthenticated.New(msg[0])
		}
		names := md.Get(forwardedPrincipal)
		if len(names) != 1 {
			return auth.Anonymous, nil
		}
		var groups []string
		if g := md.Get(forwardedGroups); len(g) == 1 && g[0] != "" {
			groups = strings.Split(g[0], ",")
		}
		return auth.Principal{Name: names[0], Groups: groups}, nil
	}
	var cert *x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cert = ti.State.VerifiedChains[0][0]
		}
	}
	return a.principal(md.Get("authorization"), cert)
}

// Origin implements Authn. On the public server the source is the gRPC
// peer's address and there is no transport request id: metadata a client
// sends (x-coordd-source, x-request-id) is never trusted. On the internal
// server they are what the gateway observed of the HTTP request.
func (a *Authenticator) Origin(ctx context.Context) (source, requestID string) {
	if a.Forwarded {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(forwardedSource); len(v) == 1 {
			source = v[0]
		}
		if v := md.Get(forwardedRequestID); len(v) == 1 {
			requestID = v[0]
		}
		return source, requestID
	}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		source = pr.Addr.String()
	}
	return source, ""
}

// HTTPPrincipal is Principal for a REST request.
func (a *Authenticator) HTTPPrincipal(r *http.Request) (auth.Principal, error) {
	var cert *x509.Certificate
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		cert = r.TLS.VerifiedChains[0][0]
	}
	return a.principal(r.Header.Values("Authorization"), cert)
}

func (a *Authenticator) principal(authorization []string, cert *x509.Certificate) (auth.Principal, error) {
	if len(authorization) > 0 {
		if len(authorization) > 1 {
			return auth.Anonymous, errkind.Unauthenticated.New("auth: more than one authorization header")
		}
		token, ok := strings.CutPrefix(authorization[0], "Bearer ")
		if !ok {
			return auth.Anonymous, errkind.Unauthenticated.New("auth: the authorization header must be \"Bearer <token>\"")
		}
		p, ok := a.tokens.Load().Lookup(strings.TrimSpace(token))
		if !ok {
			return auth.Anonymous, errkind.Unauthenticated.New("auth: unknown bearer token")
		}
		return p, nil
	}
	if cert == nil {
		return auth.Anonymous, nil
	}
	if a.IdentityFrom == IdentityFromURI {
		if len(cert.URIs) == 0 {
			return auth.Anonymous, errkind.Unauthenticated.New("auth: the client certificate has no URI SAN to name its principal (--identity-from uri)")
		}
		return auth.Principal{Name: cert.URIs[0].String()}, nil
	}
	if cert.Subject.CommonName == "" {
		return auth.Anonymous, errkind.Unauthenticated.New("auth: the client certificate has no common name to name its principal (--identity-from cn)")
	}
	return auth.Principal{Name: cert.Subject.CommonName}, nil
}

// ForwardedMetadata is what the REST gateway sends to the internal server
// for r: the principal it authenticated, or why it could not.
func (a *Authenticator) ForwardedMetadata(r *http.Request) metadata.MD {
	md := metadata.Pairs(forwardedSource, r.RemoteAddr)
	if id := r.Header.Get("X-Request-Id"); id != "" {
		md.Set(forwardedRequestID, printable(id, maxRequestIDBytes))
	}
	p, err := a.HTTPPrincipal(r)
	switch {
	case err != nil:
		md.Set(forwardedError, err.Error())
	case !p.IsAnonymous():
		md.Set(forwardedPrincipal, p.Name)
		md.Set(forwardedGroups, strings.Join(p.Groups, ","))
	}
	return md
}

// printable is s cut to at most n bytes of printable ASCII (others become
// '?'), so an audit line records a header as a header, not as whatever
// bytes a client chose.
func printable(s string, n int) string {
	b := []byte(s[:min(len(s), n)])
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

// IsForwardedHeader reports whether an HTTP header would reach the
// internal server as one of the forwarding keys; the gateway drops such
// headers so that no client can claim a principal.
func IsForwardedHeader(key string) bool {
	k := strings.ToLower(key)
	k = strings.TrimPrefix(k, "grpc-metadata-")
	return strings.HasPrefix(k, "x-coordd-")
}
