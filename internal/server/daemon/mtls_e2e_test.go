package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/tlsfiles"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/testcerts"
)

// issue returns a certificate and key from ca, failing the test on error.
func issue(t *testing.T, ca *testcerts.CA, o testcerts.Options) (certPEM, keyPEM []byte) {
	t.Helper()
	c, k, err := ca.Issue(o)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func newCA(t *testing.T, name string) *testcerts.CA {
	t.Helper()
	ca, err := testcerts.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// mTLS: with --client-ca-file, gRPC and HTTPS require a client certificate
// from that CA; its common name is the principal the policy judges. No
// certificate, an untrusted or an expired one: refused, saying so. A
// reloaded server certificate serves new connections.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca, other := newCA(t, "coordd test CA"), newCA(t, "someone else's CA")
	dir := t.TempDir()
	srvCert, srvKey := issue(t, ca, testcerts.Options{CommonName: "coordd", Server: true})
	cfg := authConfig(t, testPolicy)
	files, err := tlsfiles.Load(writeFile(t, dir, "server.pem", srvCert), writeFile(t, dir, "server-key.pem", srvKey), writeFile(t, dir, "ca.pem", ca.PEM))
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSFiles = files
	d := start(t, cfg)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	// No ServerName: the SDK verifies each endpoint against its own host
	// (here the IP address the server certificate names).
	client := func(cert, key []byte) (*clientlib.Client, error) {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if cert != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr()}, TLS: tc, DialTimeout: time.Second})
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		return c, err
	}
	aliceCert, aliceKey := issue(t, ca, testcerts.Options{CommonName: "alice"})
	alice, err := client(aliceCert, aliceKey)
	if err != nil {
		t.Fatalf("alice's certificate: %v", err)
	}
	s, err := alice.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(t.Context(), "a/mtls"); err != nil {
		t.Fatalf("alice locking a/mtls: %v", err)
	}
	if _, err := s.Lock(t.Context(), "b/mtls"); !errors.Is(err, clientlib.ErrPermissionDenied) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("alice locking b/mtls: %v; want PermissionDenied naming alice", err)
	}

	for name, c := range map[string][2][]byte{
		"no certificate":    {nil, nil},
		"an untrusted one":  pair(issue(t, other, testcerts.Options{CommonName: "alice"})),
		"an expired one":    pair(issue(t, ca, testcerts.Options{CommonName: "alice", NotBefore: time.Now().Add(-48 * time.Hour)})),
		"one not yet valid": pair(issue(t, ca, testcerts.Options{CommonName: "alice", NotBefore: time.Now().Add(48 * time.Hour)})),
	} {
		_, err := client(c[0], c[1])
		t.Logf("%s: %v", name, err)
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a client with %s: %v; want refused, naming the certificate", name, err)
		}
	}
	// HTTPS too.
	httpsClient := func(cert, key []byte) (*http.Response, error) {
		tc := &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
		if cert != nil {
			p, _ := tls.X509KeyPair(cert, key)
			tc.Certificates = []tls.Certificate{p}
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		defer hc.CloseIdleConnections()
		return hc.Get("https://" + d.HTTPAddr() + "/v1/locks/a/mtls")
	}
	if _, err := httpsClient(nil, nil); err == nil {
		t.Error("HTTPS without a client certificate was served")
	}
	resp, err := httpsClient(aliceCert, aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HTTPS as alice: %d", resp.StatusCode)
	}

	// Reload: a new server certificate serves the next connection.
	newCert, newKey := issue(t, ca, testcerts.Options{CommonName: "coordd-renewed", Server: true, NotBefore: time.Now().Add(-time.Minute)})
	writeFile(t, dir, "server.pem", newCert)
	writeFile(t, dir, "server-key.pem", newKey)
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", d.GRPCAddr(), &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{mustPair(t, aliceCert, aliceKey)}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	_ = conn.Close()
	if served != "coordd-renewed" {
		t.Errorf("after the reload the server presented %q, want the renewed certificate", served)
	}
	// A broken file is refused and the certificate in force stays.
	writeFile(t, dir, "server.pem", []byte("not a certificate"))
	if err := d.Reload(); err == nil || !strings.Contains(err.Error(), "--tls-cert-file") {
		t.Errorf("reloading a broken certificate: %v", err)
	}
	if _, err := alice.Admin().ListSessions(t.Context()); err != nil {
		t.Errorf("after a refused reload: %v", err)
	}
}

func pair(cert, key []byte) [2][]byte { return [2][]byte{cert, key} }

func mustPair(t *testing.T, cert, key []byte) tls.Certificate {
	t.Helper()
	p, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A client over TLS that verifies each endpoint against its own host (no
// ServerName) keeps verifying it after a fail-over: the endpoints it turns
// to are dialled with their own names, not the channel's made-up
// authority, which no certificate names. (They were: after a member went
// silent, the client could reach no other.) One member behind two
// proxies stands for two members; the one in use is partitioned.
func TestTLSFailoverVerifiesTheNextEndpoint(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "coordd test CA")
	srvCert, srvKey := issue(t, ca, testcerts.Options{CommonName: "coordd", Server: true})
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	d := start(t, cfg)
	proxies := []*tcpproxy.Proxy{tcpproxy.Start(t, d.GRPCAddr()), tcpproxy.Start(t, d.GRPCAddr())}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	ctx := t.Context()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{proxies[0].Addr(), proxies[1].Addr()},
		TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSession(ctx, clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	inUse := slices.IndexFunc(proxies, func(p *tcpproxy.Proxy) bool { return p.Active() > 0 })
	if inUse < 0 {
		t.Fatal("no proxy carries the client's connection")
	}
	proxies[inUse].Freeze()
	t.Cleanup(proxies[inUse].Thaw)
	lctx, cancel := context.WithTimeout(ctx, wait.Bound(5*time.Second))
	defer cancel()
	l, err := s.Lock(lctx, "after-failover")
	if err != nil {
		t.Fatalf("Lock after the endpoint in use went silent: %v (the client could not verify the other endpoint?)", err)
	}
	if err := l.Release(lctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
		t.Fatal("the session ended across the fail-over")
	default:
	}
}
