package daemon_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/server/tlsfiles"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/testcerts"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// toolsPolicy: root may read the cluster's state and back it up, carol
// may only use sessions.
const toolsPolicy = `
rules:
  - principals: [root]
    actions: [cluster.read, cluster.admin]
  - principals: [carol]
    actions: [session]
`

// listServices asks server reflection for the services, as principal.
func listServices(t *testing.T, addr, principal string) ([]string, error) {
	t.Helper()
	st, err := rpb.NewServerReflectionClient(dialRaw(t, addr)).ServerReflectionInfo(withToken(t.Context(), principal))
	if err != nil {
		return nil, err
	}
	if err := st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, st.CloseSend()
}

// grpcurl and other generic tools find coordd's services by server
// reflection; under a policy only principals with cluster.read do, as
// for /openapi.json.
func TestServerReflection(t *testing.T) {
	t.Parallel()
	open := start(t, testConfig(t))
	names, err := listServices(t, open.GRPCAddr(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"coordd.v1.LockService", "coordd.v1.ElectionService", "coordd.v1.ConfigService", "coordd.v1.SessionService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}

	d := start(t, authConfig(t, toolsPolicy))
	if _, err := listServices(t, d.GRPCAddr(), ""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without an identity: %v, want Unauthenticated", err)
	}
	if _, err := listServices(t, d.GRPCAddr(), "carol"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("reflection as carol (no cluster.read): %v, want PermissionDenied", err)
	}
	if names, err := listServices(t, d.GRPCAddr(), "root"); err != nil || !slices.Contains(names, "coordd.v1.LockService") {
		t.Errorf("reflection as root: %v, %v", names, err)
	}
}

// GET /v1/cluster/snapshot is SaveSnapshot over REST: the raw backup,
// one etcd can read (its integrity hash included), and only for
// cluster.admin.
func TestSnapshotOverREST(t *testing.T) {
	t.Parallel()
	d := start(t, authConfig(t, toolsPolicy))
	url := "http://" + d.HTTPAddr() + "/v1/cluster/snapshot"
	code, body := httpAs(t, http.MethodGet, url, "carol", "")
	var refused struct {
		Error struct {
			Reason string `json:"reason"`
		} `json:"error"`
	}
	if code != http.StatusForbidden || json.Unmarshal([]byte(body), &refused) != nil || refused.Error.Reason != "PERMISSION_DENIED" {
		t.Fatalf("snapshot as carol: %d %s, want 403 PERMISSION_DENIED", code, body)
	}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testTokens["root"])
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/octet-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("snapshot as root: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	file := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Restore checks the hash etcd appends to a snapshot: a truncated or
	// re-encoded body fails here.
	lg := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	if err := snapshot.NewV3(lg).Restore(snapshot.RestoreConfig{SnapshotPath: file, Name: "check", OutputDataDir: filepath.Join(t.TempDir(), "restored"), PeerURLs: []string{"http://127.0.0.1:2380"}, InitialCluster: "check=http://127.0.0.1:2380", InitialClusterToken: "check"}); err != nil {
		t.Fatalf("the REST backup does not restore: %v", err)
	}

	// /openapi.json lists the route, though the gateway serves it by hand.
	code, body = httpAs(t, http.MethodGet, "http://"+d.HTTPAddr()+"/openapi.json", "root", "")
	var doc struct {
		Paths map[string]map[string]struct {
			Produces []string `json:"produces"`
		} `json:"paths"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &doc) != nil {
		t.Fatalf("GET /openapi.json as root: %d", code)
	}
	if get, ok := doc.Paths["/v1/cluster/snapshot"]["get"]; !ok || !slices.Contains(get.Produces, "application/octet-stream") || len(doc.Paths) < 50 {
		t.Fatalf("/openapi.json: GET /v1/cluster/snapshot %+v (listed: %v), of %d paths; want it with application/octet-stream beside the generated ones", get, ok, len(doc.Paths))
	}
}

// An HTTP/1 request on the gRPC port (curl given the wrong port) gets a
// 400 that names the HTTP port, not gRPC's silence; gRPC clients on the
// same port are served as ever (every other test).
func TestTheGRPCPortNamesTheHTTPPort(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	code, body := httpAs(t, http.MethodGet, "http://"+d.GRPCAddr()+"/v1/locks", "", "")
	if code != http.StatusBadRequest || !strings.Contains(body, "coordd's gRPC port") || !strings.Contains(body, d.HTTPAddr()) {
		t.Fatalf("GET on the gRPC port: %d %q; want 400 naming the HTTP port %s", code, body, d.HTTPAddr())
	}
	c := newClient(t, d.GRPCAddr())
	if _, err := c.Admin().ClusterStatus(t.Context()); err != nil {
		t.Fatalf("a gRPC call after it: %v", err)
	}
}

// A gRPC client given the HTTP port is told which port is gRPC's: the Go
// SDK before its first call (the HTTP port's HTTP/2 SETTINGS name the
// gRPC port), any other gRPC client in its call's status, in plaintext and
// over TLS; REST on the same port is served as ever.
func TestTheHTTPPortNamesTheGRPCPort(t *testing.T) {
	t.Parallel()
	d := start(t, testConfig(t))
	_, grpcPort, _ := net.SplitHostPort(d.GRPCAddr())
	t0 := time.Now()
	_, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.HTTPAddr()}, DialTimeout: time.Minute})
	if !errors.Is(err, clientlib.ErrUnavailable) || !strings.Contains(err.Error(), "coordd's HTTP port") || !strings.Contains(err.Error(), grpcPort) {
		t.Fatalf("clientlib.New on the HTTP port: %v; want ErrUnavailable naming gRPC port %s", err, grpcPort)
	}
	if took := time.Since(t0); took > wait.Bound(30*time.Second) {
		t.Errorf("clientlib.New on the HTTP port took %s: it should not wait for its dial timeout", took)
	}
	call := func(conn *grpc.ClientConn) error {
		_, err := coorddv1.NewClusterServiceClient(conn).WhoAmI(t.Context(), &coorddv1.WhoAmIRequest{})
		return err
	}
	conn, err := grpc.NewClient(d.HTTPAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if err := call(conn); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), d.GRPCAddr()) {
		t.Errorf("a plaintext gRPC call on the HTTP port: %v; want FAILED_PRECONDITION naming %s", err, d.GRPCAddr())
	}
	if r := callHTTP(t, "GET", "http://"+d.HTTPAddr()+"/v1/cluster:whoami"); r != http.StatusOK {
		t.Errorf("REST on the HTTP port after it: %d", r)
	}

	ca := newCA(t, "coordd test CA")
	dir := t.TempDir()
	srvCert, srvKey := issue(t, ca, testcerts.Options{CommonName: "coordd", Server: true})
	cfg := testConfig(t)
	files, err := tlsfiles.Load(writeFile(t, dir, "server.pem", srvCert), writeFile(t, dir, "server-key.pem", srvKey), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSFiles = files
	td := start(t, cfg)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	tconn, err := grpc.NewClient(td.HTTPAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tconn.Close() }()
	if err := call(tconn); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), td.GRPCAddr()) {
		t.Errorf("a gRPC call over TLS on the HTTP port: %v; want FAILED_PRECONDITION naming %s", err, td.GRPCAddr())
	}
}

// callHTTP makes a request with no body and returns its status.
func callHTTP(t *testing.T, method, url string) int {
	t.Helper()
	code, _ := httpAs(t, method, url, "", "")
	return code
}
