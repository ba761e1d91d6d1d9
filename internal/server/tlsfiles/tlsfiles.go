// Package tlsfiles serves TLS from certificate files that can be replaced
// while the server runs: Reload reads them again, and every new
// connection uses what was read last. Connections already open keep the
// certificate they began with.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// Server is a server certificate and key, and optionally a CA bundle that
// client certificates must chain to (mutual TLS).
type Server struct {
	CertFile, KeyFile string
	// ClientCAFile, when set, makes every client present a certificate
	// signed by one of its CAs.
	ClientCAFile string

	current atomic.Pointer[tls.Config]
}

// Load reads the files once; the returned Server is ready to serve.
func Load(certFile, keyFile, clientCAFile string) (*Server, error) {
	s := &Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCAFile}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the files again. On any error the configuration in force
// stays, and the error says which file is wrong.
func (s *Server) Reload() error {
	if s.CertFile == "" || s.KeyFile == "" {
		return errors.New("--tls-cert-file and --tls-key-file go together")
	}
	cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate (--tls-cert-file %s, --tls-key-file %s): %w", s.CertFile, s.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if s.ClientCAFile != "" {
		pool, err := ReadPool(s.ClientCAFile)
		if err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.current.Store(cfg)
	return nil
}

// Config returns the tls.Config to serve with: each handshake takes the
// configuration last loaded.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current.Load(), nil
		},
		// The first certificate, for code that reads Certificates (it is
		// never served: GetConfigForClient answers every handshake).
		Certificates: s.current.Load().Certificates,
	}
}

// ReadPool reads a PEM bundle of CA certificates.
func ReadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}
