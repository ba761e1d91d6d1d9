package daemon_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/tlsfiles"
)

// testCA issues certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

var serial int64 = 100

// issue returns a PEM certificate and key for cn (and uri, if set),
// valid from notBefore for a day.
func (ca *testCA) issue(t *testing.T, cn, uri string, server bool, notBefore time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notBefore.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames, tmpl.IPAddresses = []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
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
	ca, other := newCA(t, "coordd test CA"), newCA(t, "someone else's CA")
	dir := t.TempDir()
	srvCert, srvKey := ca.issue(t, "coordd", "", true, time.Now().Add(-time.Hour))
	cfg := authConfig(t, testPolicy)
	files, err := tlsfiles.Load(writeFile(t, dir, "server.pem", srvCert), writeFile(t, dir, "server-key.pem", srvKey), writeFile(t, dir, "ca.pem", ca.pem))
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSFiles = files
	d := start(t, cfg)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)

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
	aliceCert, aliceKey := ca.issue(t, "alice", "", false, time.Now().Add(-time.Hour))
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
		"no certificate":        {nil, nil},
		"an untrusted one":      pair(other.issue(t, "alice", "", false, time.Now().Add(-time.Hour))),
		"an expired one":        pair(ca.issue(t, "alice", "", false, time.Now().Add(-48*time.Hour))),
		"one not yet valid one": pair(ca.issue(t, "alice", "", false, time.Now().Add(48*time.Hour))),
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
	newCert, newKey := ca.issue(t, "coordd-renewed", "", true, time.Now().Add(-time.Minute))
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
