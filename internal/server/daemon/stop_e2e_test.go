package daemon_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
)

// A graceful stop ends open keep-alive streams at once (with Unavailable)
// instead of waiting out the shutdown timeout for them.
func TestStopEndsStreams(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.ShutdownTimeout = time.Minute
	d := start(t, cfg)
	c := newClient(t, d.GRPCAddr())
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(cfg.ShutdownTimeout / 2):
		t.Fatal("Stop is waiting for the keep-alive stream instead of ending it")
	}
	select {
	case <-s.Done():
		t.Fatalf("session ended by a daemon stop: %v (it should keep retrying until its deadline)", s.Err())
	default:
	}
}

// With a certificate, both listeners serve TLS; the SDK connects with TLS
// and the REST gateway still reaches the gRPC listener.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	cfg := testConfig(t)
	cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	d := start(t, cfg)

	c, err := clientlib.New(t.Context(), clientlib.Config{
		Endpoints: []string{d.GRPCAddr()},
		TLS:       &tls.Config{RootCAs: pool, ServerName: "localhost"},
	})
	if err != nil {
		t.Fatalf("TLS client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSession(t.Context(), clientlib.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("NewSession over TLS: %v", err)
	}
	defer func() { _ = s.Close(t.Context()) }()

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	resp, err := hc.Get("https://" + d.HTTPAddr() + "/v1/sessions/" + s.ID())
	if err != nil {
		t.Fatalf("REST over TLS: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("REST over TLS: %s", resp.Status)
	}
	hc.CloseIdleConnections()

	// A plaintext client must not get through.
	if _, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr()}, DialTimeout: 500 * time.Millisecond}); err == nil {
		t.Fatal("plaintext client connected to a TLS listener")
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "coordd test"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
