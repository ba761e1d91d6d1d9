package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/daemon"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/testcerts"
)

// Peer TLS: three embedded members whose peer traffic is TLS with
// certificates from one CA form a cluster, serve, and elect a new etcd
// leader when the leader member crashes. Their peer listeners refuse
// plaintext, a client without a certificate, one whose certificate
// another CA signed and one the members' CA signed under a name that is
// not a member's (--peer-allowed-cn), and answer a member's certificate
// (so the refusals are about the certificate, not a listener that refuses
// everything).
func TestPeerTLS(t *testing.T) {
	t.Parallel()
	ca, other := newCA(t, "coordd peer CA"), newCA(t, "someone else's CA")
	dir := t.TempDir()
	caFile := writeFile(t, dir, "peer-ca.pem", ca.PEM)
	var peers []*tcpproxy.Proxy
	n := 0
	withPeerTLS := func(cfg *daemon.Config) {
		cert, key := issue(t, ca, testcerts.Options{CommonName: fmt.Sprintf("member-%d", n), Peer: true})
		cfg.PeerTLS = daemon.PeerTLS{
			CertFile: writeFile(t, dir, fmt.Sprintf("peer-%d.pem", n), cert),
			KeyFile:  writeFile(t, dir, fmt.Sprintf("peer-%d-key.pem", n), key),
			CAFile:   caFile,
			// The CA below signs an API client's certificate too.
			AllowedCNs: []string{"member-0", "member-1", "member-2"},
		}
		n++
		// Behind a proxy (for the crash below), TLS end to end through it.
		addr := strings.TrimPrefix(cfg.ListenPeerURLs[0], "http://")
		p := tcpproxy.Start(t, addr)
		cfg.ListenPeerURLs = []string{"https://" + addr}
		cfg.AdvertisePeerURLs = []string{"https://" + p.Addr()}
		peers = append(peers, p)
	}
	ds := startCluster(t, 3, withPeerTLS)

	// The peer listeners. A plaintext request gets no member list.
	peerURL := "https://" + peers[0].Addr() + "/members"
	if resp, err := http.Get("http://" + peers[0].Addr() + "/members"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plaintext GET /members on a TLS peer listener: %s", resp.Status)
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	get := func(certs ...tls.Certificate) error {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs, MinVersion: tls.VersionTLS12},
		}}
		defer hc.CloseIdleConnections()
		resp, err := hc.Get(peerURL)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	}
	pair := func(c, k []byte) tls.Certificate {
		p, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := get(); err == nil {
		t.Error("a peer without a certificate was answered")
	}
	if err := get(pair(issue(t, other, testcerts.Options{CommonName: "intruder", Peer: true}))); err == nil {
		t.Error("a peer whose certificate another CA signed was answered")
	}
	if err := get(pair(issue(t, ca, testcerts.Options{CommonName: "api-client"}))); err == nil {
		t.Error("an API client whose certificate the members' CA signed, under another name, was answered")
	}
	if err := get(pair(issue(t, ca, testcerts.Options{CommonName: "member-1", Peer: true}))); err != nil {
		t.Fatalf("a peer with a certificate from the members' CA: %v", err)
	}

	// The cluster serves, and fails over when its etcd leader crashes.
	leader := etcdLeader(t, ds)
	proxies, endpoints := grpcProxies(t, ds)
	c := newClient(t, endpoints...)
	ctx, cancel := context.WithTimeout(t.Context(), wait.Bound(30*time.Second))
	defer cancel()
	s, err := c.NewSession(ctx, clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(ctx, "peer-tls/x")
	if err != nil {
		t.Fatal(err)
	}
	before := l.Token()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	crashMember(ds[leader], peers[leader], proxies[leader])
	s2, err := newSessionRetrying(ctx, c)
	if err != nil {
		t.Fatalf("a session after the etcd leader member crashed: %v", err)
	}
	t.Cleanup(func() { closeBounded(s2) })
	l, err = s2.Lock(ctx, "peer-tls/x")
	if err != nil {
		t.Fatalf("a lock after the etcd leader member crashed: %v", err)
	}
	if l.Token() <= before {
		t.Errorf("token after the failover %d, want > %d", l.Token(), before)
	}
	for i, d := range ds {
		if i == leader {
			continue
		}
		if got := d.Etcd().Server.Leader(); uint64(got) == 0 || got == ds[leader].Etcd().Server.MemberID() {
			t.Errorf("member %d sees leader %x after the crash, want one of the survivors", i, got)
		}
	}
}
