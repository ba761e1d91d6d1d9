package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/testkit/testcerts"
)

// benchAuth measures what security costs: the same lock and config
// workloads against a daemon that runs open over plaintext and one that
// requires mutual TLS and enforces a policy, in one run, rounds
// alternating which goes first.
func benchAuth(bin, tmp string) error {
	dir := filepath.Join(tmp, "auth")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	certs, err := writeBenchCerts(dir)
	if err != nil {
		return err
	}
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(`rules:
  - principals: [bench]
    actions: [session, lock.acquire, lock.release, config.read, config.write]
    locks: ["*"]
    namespaces: ["bench/*"]
`), 0o600); err != nil {
		return err
	}
	open, err := startDaemon(bin, filepath.Join(dir, "open"))
	if err != nil {
		return err
	}
	defer open.stop()
	readyTLS = certs.client
	secured, err := startDaemon(bin, filepath.Join(dir, "secured"),
		"--tls-cert-file", certs.serverCert, "--tls-key-file", certs.serverKey, "--client-ca-file", certs.ca,
		"--policy-file", policy, "--public-metrics")
	if err != nil {
		return err
	}
	defer secured.stop()

	// The two daemons, with how to reach each.
	targets := []struct {
		name string
		addr string
		tls  *tls.Config
		d    *daemon
	}{{"open, plaintext", open.grpcAddr, nil, open}, {"mTLS + policy", secured.grpcAddr, certs.client, secured}}
	fmt.Printf("\nauth overhead (%d rounds, %s per peer per workload and round)\n", *lockRounds, *lockD)
	fmt.Printf("%-18s %-22s %10s %10s %10s\n", "peer", "workload", "p50", "p99", "ops/s")
	type key struct{ peer, workload string }
	cycles := map[key][]float64{}
	rates := map[key]float64{}
	for round := range *lockRounds {
		for i := range targets {
			tg := targets[(i+round)%len(targets)]
			p := coorddPeer(tg.name, tg.addr, tg.tls, false)
			for _, w := range []struct {
				name           string
				clients, locks int
			}{{"1 client (cycle)", 1, 1}, {"16 clients, 16 locks", 16, 16}} {
				r, err := runLocks(p, w.clients, w.locks, *lockD, fmt.Sprintf("auth-r%d-%d", round, w.clients), tg.d.cpuSeconds)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", p.name, w.name, err)
				}
				k := key{p.name, w.name}
				cycles[k] = append(cycles[k], r.cycleUs...)
				rates[k] += r.acqPerSec / float64(*lockRounds)
			}
			lat, err := publishLatency(tg.addr, tg.tls, 200)
			if err != nil {
				return fmt.Errorf("%s, config: %w", p.name, err)
			}
			k := key{p.name, "config put"}
			cycles[k] = append(cycles[k], lat...)
		}
	}
	for _, w := range []string{"1 client (cycle)", "16 clients, 16 locks", "config put"} {
		for _, tg := range targets {
			k := key{tg.name, w}
			p50, p99 := "-", "-"
			if len(cycles[k]) > 0 {
				p50, p99 = fmt.Sprintf("%.0fus", percentile(cycles[k], 50)), fmt.Sprintf("%.0fus", percentile(cycles[k], 99))
			}
			rate := "-"
			if rates[k] > 0 {
				rate = fmt.Sprintf("%.0f", rates[k])
			}
			fmt.Printf("%-18s %-22s %10s %10s %10s\n", tg.name, w, p50, p99, rate)
		}
	}
	a, b := targets[0].name, targets[1].name
	fmt.Printf("\ntargets:\n")
	fmt.Printf("  uncontended lock cycle p50, secured / open:   %.2f (target <= 1.10)\n",
		percentile(cycles[key{b, "1 client (cycle)"}], 50)/percentile(cycles[key{a, "1 client (cycle)"}], 50))
	fmt.Printf("  16 clients on 16 locks, cycles/s, secured / open: %.2f\n", rates[key{b, "16 clients, 16 locks"}]/rates[key{a, "16 clients, 16 locks"}])
	fmt.Printf("  config put p50, secured / open:               %.2f\n",
		percentile(cycles[key{b, "config put"}], 50)/percentile(cycles[key{a, "config put"}], 50))
	return nil
}

// publishLatency times n config puts of one key through the SDK.
func publishLatency(addr string, tc *tls.Config, n int) ([]float64, error) {
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{addr}, TLS: tc})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	out := make([]float64, 0, n)
	for i := range n {
		t0 := time.Now()
		if _, err := c.ConfigCenter().Put(ctx, "bench/auth", "k", fmt.Sprint(i), clientlib.PublishOptions{}); err != nil {
			return nil, err
		}
		out = append(out, float64(time.Since(t0).Microseconds()))
	}
	return out, nil
}

// benchCerts are a CA, a server certificate for 127.0.0.1 and a client
// certificate for the principal "bench".
type benchCerts struct {
	ca, serverCert, serverKey string
	client                    *tls.Config
}

func writeBenchCerts(dir string) (benchCerts, error) {
	ca, err := testcerts.NewCA("bench CA")
	if err != nil {
		return benchCerts{}, err
	}
	srvCert, srvKey, err := ca.Issue(testcerts.Options{CommonName: "coordd", Server: true})
	if err != nil {
		return benchCerts{}, err
	}
	cliCert, cliKey, err := ca.Issue(testcerts.Options{CommonName: "bench"})
	if err != nil {
		return benchCerts{}, err
	}
	c := benchCerts{ca: filepath.Join(dir, "ca.pem"), serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem")}
	for file, data := range map[string][]byte{c.ca: ca.PEM, c.serverCert: srvCert, c.serverKey: srvKey} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			return benchCerts{}, err
		}
	}
	pair, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		return benchCerts{}, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c.client = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	return c, nil
}
