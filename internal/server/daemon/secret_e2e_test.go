package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	zapobserver "go.uber.org/zap/zaptest/observer"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/keyring"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
)

// alice reads secrets under a/ and manages keys; bob writes under a/ and
// reads, but not secrets.
const secretPolicy = `
rules:
  - principals: [alice]
    actions: [session, config.read, config.write, config.read-secret, cluster.read, cluster.admin]
    namespaces: ["a/*"]
  - principals: [bob]
    actions: [config.read, config.write]
    namespaces: ["a/*"]
  - principals: [carol]
    actions: [config.admin]
    namespaces: ["a/*"]
`

const (
	secretValue = "s3cret-Horse-Battery-9071" // must never appear in clear
	plainValue  = "db1.internal.example"      // a plain value: the positive control
)

// writeKeyFile writes a secret key file of the given lines, mode 600.
func writeKeyFile(t *testing.T, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKeyLine(t *testing.T, id string) string {
	t.Helper()
	l, err := keyring.NewKeyLine(id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSecretsAreNeverShownInClear drives secret values through the SDK,
// REST and subscriptions, then looks for the clear text everywhere coordd
// keeps or tells anything: every etcd key, a snapshot (backup) file, the
// audit log, the daemon's log and /metrics. The plain value written beside
// it is found in etcd and the snapshot, so the search would find a leak.
func TestSecretsAreNeverShownInClear(t *testing.T) {
	t.Parallel()
	cfg := authConfig(t, secretPolicy)
	k1, k2 := newKeyLine(t, "k1"), newKeyLine(t, "k2")
	cfg.SecretKeyFile = filepath.Join(t.TempDir(), "keys")
	writeKeyFile(t, cfg.SecretKeyFile, k1)
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	logs, observed := zapobserver.New(zapcore.InfoLevel)
	cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), logs))
	d := start(t, cfg)
	ctx := t.Context()
	alice, bob := newClientWithToken(t, d.GRPCAddr(), "alice"), newClientWithToken(t, d.GRPCAddr(), "bob")

	// bob may write a secret he may not read back.
	if _, err := bob.ConfigCenter().Put(ctx, "a/app", "db.host", plainValue, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := bob.ConfigCenter().PutSecret(ctx, "a/app", "db.password", secretValue, clientlib.PublishOptions{})
	if err != nil || len(r.Changes) != 1 || !r.Changes[0].Secret || *r.Changes[0].New != "" {
		t.Fatalf("PutSecret = %+v, %v", r, err)
	}
	snap, err := bob.ConfigCenter().Snapshot(ctx, "a/app", 0)
	if err != nil || snap.Values["db.host"] != plainValue || len(snap.Hidden) != 1 || snap.Hidden[0] != "db.password" {
		t.Fatalf("bob's snapshot = %+v, %v", snap, err)
	}
	if _, ok := snap.Values["db.password"]; ok {
		t.Fatal("a hidden secret is in Values")
	}
	if _, _, err := bob.ConfigCenter().Get(ctx, "a/app", "db.password", 0); !errors.Is(err, clientlib.ErrSecretHidden) {
		t.Fatalf("bob's Get = %v, want ErrSecretHidden", err)
	}
	if _, err := bob.ConfigCenter().RevealSecrets().Snapshot(ctx, "a/app", 0); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("bob revealing = %v, want ErrPermissionDenied", err)
	}
	// A refused subscription is refused alone: bob's other one, on the
	// same stream, goes on without a reconnect.
	mine, err := bob.ConfigCenter().Subscribe(ctx, []string{"a/app"}, clientlib.WithStartTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if _, err := bob.ConfigCenter().RevealSecrets().Subscribe(ctx, []string{"a/app"}, clientlib.WithStartTimeout(10*time.Second)); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("bob's revealing subscription = %v, want ErrPermissionDenied", err)
	}
	if _, err := bob.ConfigCenter().Put(ctx, "a/app", "db.port", "5432", clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "bob's subscription to see his change", func() bool { v, _ := mine.Snapshot().Get("a/app", "db.port"); return v == "5432" })
	if st := mine.Status(); st.Reconnects != 0 || st.Relists != 0 {
		t.Fatalf("a refused subscription disturbed the other: %+v", st)
	}
	// A schema's verdict tells of the secrets it checks: setting one where
	// secrets are needs config.read-secret too.
	carol := newClientWithToken(t, d.GRPCAddr(), "carol")
	if err := carol.ConfigCenter().SetSchema(ctx, "a/app", `{"type":"object"}`); !errors.Is(err, clientlib.ErrPermissionDenied) {
		t.Fatalf("carol's schema where secrets are = %v, want ErrPermissionDenied", err)
	}
	if err := carol.ConfigCenter().SetSchema(ctx, "a/plain", `{"type":"object"}`); err != nil {
		t.Fatalf("carol's schema where none are: %v", err)
	}
	// alice reads it in clear, when she asks; an export without a
	// transfer key only names it.
	if exp, err := alice.ConfigCenter().RevealSecrets().Export(ctx, []string{"a/app"}, clientlib.ExportOptions{}); err != nil || len(exp.Namespaces) != 1 ||
		len(exp.Namespaces[0].Hidden) != 1 || exp.Namespaces[0].Values["db.password"] != "" || exp.Namespaces[0].Secrets != nil {
		t.Fatalf("an export without a transfer key = %+v, %v", exp, err)
	}
	if v, _, err := alice.ConfigCenter().RevealSecrets().Get(ctx, "a/app", "db.password", 0); err != nil || v != secretValue {
		t.Fatalf("alice's Get = %q, %v", v, err)
	}
	if s, err := alice.ConfigCenter().RevealSecrets().Snapshot(ctx, "a/app", 0); err != nil || s.Values["db.password"] != secretValue || len(s.Secret) != 1 {
		t.Fatalf("alice's snapshot = %+v, %v", s, err)
	}

	// REST: the same rules.
	base := "http://" + d.HTTPAddr() + "/v1/config:"
	q := "namespace=" + url.QueryEscape("a/app")
	if code, body := httpAs(t, "GET", base+"snapshot?"+q, "bob", ""); code != 200 || !strings.Contains(body, `"secret":true`) || strings.Contains(body, secretValue) {
		t.Fatalf("bob's REST snapshot: %d %s", code, body)
	}
	if code, body := httpAs(t, "GET", base+"get?"+q+"&key=db.password&revealSecrets=true", "bob", ""); code != 403 {
		t.Fatalf("bob's REST reveal: %d %s", code, body)
	}
	if code, body := httpAs(t, "GET", base+"get?"+q+"&key=db.password&revealSecrets=true", "alice", ""); code != 200 || !strings.Contains(body, secretValue) {
		t.Fatalf("alice's REST reveal: %d %s", code, body)
	}

	subscriptionsSeeWhatTheyMay(t, alice)

	// History and diffs say it changed, never to what, even to alice.
	for _, path := range []string{"releases?" + q, "diff?" + q + "&fromRelease=1&toRelease=5"} {
		if code, body := httpAs(t, "GET", base+path, "alice", ""); code != 200 || strings.Contains(body, "s3cret") || !strings.Contains(body, `"secret":true`) {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}

	// Everywhere coordd keeps or tells anything.
	snapshotFile := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(snapshotFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Admin().SaveSnapshot(ctx, f); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	backup, _ := os.ReadFile(snapshotFile)
	if !bytes.Contains(backup, []byte(plainValue)) {
		t.Fatal("the snapshot lacks even the plain value: the search below proves nothing")
	}
	audit, _ := os.ReadFile(cfg.AuditLog)
	if !bytes.Contains(audit, []byte(`"action":"config.read-secret"`)) || !bytes.Contains(audit, []byte(`"principal":"alice"`)) {
		t.Fatalf("the audit log does not say alice read secrets:\n%s", audit)
	}
	_, metrics := httpAs(t, "GET", "http://"+d.HTTPAddr()+"/metrics", "alice", "")
	var logText strings.Builder
	for _, e := range observed.All() {
		logText.WriteString(e.Message)
		for k, v := range e.ContextMap() {
			logText.WriteString(k + "=" + fmt.Sprint(v) + "\n")
		}
	}
	etcdText := allEtcd(t, cfg.EtcdClientURL)
	if !strings.Contains(etcdText, plainValue) {
		t.Fatal("etcd lacks even the plain value: the search below proves nothing")
	}
	for where, text := range map[string]string{"etcd": etcdText, "the snapshot file": string(backup), "the audit log": string(audit), "the log": logText.String(), "/metrics": metrics} {
		for _, clear := range []string{secretValue, "s3cret-Horse", "rotated-" + secretValue} {
			if strings.Contains(text, clear) {
				t.Errorf("%s holds the secret in clear", where)
			}
		}
	}

	rotateTheKeyWhileServing(t, d, cfg.SecretKeyFile, k1, k2, alice)
}

// subscriptionsSeeWhatTheyMay: one client, two subscriptions on one
// stream, one revealing secrets: each sees what it asked for, through a
// change too.
func subscriptionsSeeWhatTheyMay(t *testing.T, alice *clientlib.Client) {
	t.Helper()
	ctx := t.Context()
	plain, err := alice.ConfigCenter().Subscribe(ctx, []string{"a/app"}, clientlib.WithStartTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	revealed, err := alice.ConfigCenter().RevealSecrets().Subscribe(ctx, []string{"a/app"}, clientlib.WithStartTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer revealed.Close()
	if v, ok := revealed.Snapshot().Get("a/app", "db.password"); !ok || v != secretValue {
		t.Fatalf("the revealing subscription has %q, %v", v, ok)
	}
	if _, ok := plain.Snapshot().Get("a/app", "db.password"); ok {
		t.Fatal("the plain subscription has the secret")
	}
	if _, err := alice.ConfigCenter().Put(ctx, "a/app", "db.password", "rotated-"+secretValue, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the revealing subscription to see the change", func() bool {
		v, _ := revealed.Snapshot().Get("a/app", "db.password")
		return v == "rotated-"+secretValue
	})
	wait.For(t, "the plain subscription to reach the change", func() bool { return plain.Snapshot().Release("a/app") == 4 })
	if _, ok := plain.Snapshot().Get("a/app", "db.password"); ok {
		t.Fatal("the plain subscription got the changed secret")
	}
	if _, err := alice.ConfigCenter().Put(ctx, "a/app", "db.password", secretValue, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}

// rotateTheKeyWhileServing puts k2 first, rewraps, drops k1: the secret
// reads on throughout.
func rotateTheKeyWhileServing(t *testing.T, d interface{ Reload() error }, file, k1, k2 string, alice *clientlib.Client) {
	t.Helper()
	ctx := t.Context()
	writeKeyFile(t, file, k2, k1)
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	res, err := alice.ConfigCenter().RewrapSecretKeys(ctx)
	if err != nil || res.Primary != "k2" || res.Rewrapped != 1 || res.ByKey["k2"] != 1 || len(res.ByKey) != 1 {
		t.Fatalf("RewrapSecretKeys = %+v, %v", res, err)
	}
	writeKeyFile(t, file, k2)
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	if v, _, err := alice.ConfigCenter().RevealSecrets().Get(ctx, "a/app", "db.password", 0); err != nil || v != secretValue {
		t.Fatalf("after rotation: %q, %v", v, err)
	}
	// A member given a file without the key that wraps a data key says so.
	writeKeyFile(t, file, newKeyLine(t, "k3"))
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := alice.ConfigCenter().RevealSecrets().Get(ctx, "a/app", "db.password", 0); !errors.Is(err, clientlib.ErrSecretsUnavailable) {
		t.Fatalf("without its key: %v", err)
	}
}

// allEtcd is every key and value in the etcd at endpoint, as text.
func allEtcd(t *testing.T, endpoint string) string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	resp, err := cli.Get(t.Context(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		b.Write(kv.Key)
		b.WriteByte('=')
		b.Write(kv.Value)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestConsoleNeverShowsSecrets: the console shows that a key is a secret
// and that it changed, never its value (the page's whole HTML is
// searched), and can publish a new secret.
func TestConsoleNeverShowsSecrets(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.SecretKeyFile = filepath.Join(t.TempDir(), "keys")
	writeKeyFile(t, cfg.SecretKeyFile, newKeyLine(t, "k1"))
	d := start(t, cfg)
	cc := newClient(t, d.GRPCAddr()).ConfigCenter()
	ctx := t.Context()
	ns := "shop/prod"
	if _, err := cc.Publish(ctx, ns, []clientlib.ConfigMutation{{Key: "db.host", Value: plainValue}, {Key: "db.password", Value: secretValue, Secret: true}}, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.PutSecret(ctx, ns, "db.password", "rotated-"+secretValue, clientlib.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	p := openConsole(t, "http://"+d.HTTPAddr()+"/ui/")
	html := func() string {
		out, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for route, want := range map[string]string{"#/config/" + ns: "secret", "#/config/" + ns + "?tab=history": "Roll back to this", "#/config/" + ns + "?tab=diff&from=1&to=2": "secret"} {
		p.open(route)
		p.see("main table", want)
		if route == "#/config/"+ns {
			p.see("main table", plainValue) // the control: values are on the page
			p.screenshot("config-secret")
		}
		if page := html(); strings.Contains(page, "s3cret") {
			t.Fatalf("%s shows the secret", route)
		}
	}
	// Publishing a secret from the console.
	p.open("#/config/" + ns + "?tab=publish")
	p.run("fill a secret",
		chromedp.SendKeys(chromedp.CSS(`main input[aria-label="Key"]`), "api.token"),
		chromedp.SendKeys(chromedp.CSS(`main textarea[aria-label="Value"]`), "tok-"+secretValue),
		chromedp.Click(chromedp.CSS(`main input[aria-label="Store the value as a secret"]`)),
		chromedp.Click(chromedp.Search(`//button[text()="Preview (dry run)"]`)))
	p.see("main .diff", "secret")
	p.run("publish", chromedp.Click(chromedp.Search(`//button[text()="Publish"]`)))
	wait.For(t, "the console's secret", func() bool {
		v, _, err := cc.RevealSecrets().Get(ctx, ns, "api.token", 0)
		return err == nil && v == "tok-"+secretValue
	})
	if _, _, err := cc.Get(ctx, ns, "api.token", 0); !errors.Is(err, clientlib.ErrSecretHidden) {
		t.Fatalf("the console's value is not a secret: %v", err)
	}
}
