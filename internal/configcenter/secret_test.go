package configcenter_test

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/keyring"
)

// keys returns a ring of fresh keys, the first primary.
func keys(t *testing.T, ids ...string) *keyring.Ring {
	t.Helper()
	var lines []string
	for _, id := range ids {
		lines = append(lines, keyLine(t, id))
	}
	return ringOf(t, lines...)
}

func keyLine(t *testing.T, id string) string {
	t.Helper()
	l, err := keyring.NewKeyLine(id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ringOf parses key file lines, the first primary.
func ringOf(t *testing.T, lines ...string) *keyring.Ring {
	t.Helper()
	r, err := keyring.Parse([]byte(strings.Join(lines, "")))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// clearIn returns the etcd keys whose values hold text: every key of the
// cluster is read, so a leak anywhere is found.
func clearIn(t *testing.T, cli *clientv3.Client, text string) []string {
	t.Helper()
	resp, err := cli.Get(t.Context(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Value), text) || strings.Contains(string(kv.Key), text) {
			found = append(found, string(kv.Key))
		}
	}
	return found
}

const password = "correct-horse-battery-staple"

// writeSecrets makes releases that set, keep, change and roll back a
// secret, and returns the clear values it stored.
func writeSecrets(t *testing.T, e env) {
	t.Helper()
	ctx := t.Context()
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{
		{Key: "db.password", Value: password, Secret: true}, {Key: "db.host", Value: "db1"},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "pay", "db.password", password+"-2", 0, "", "rotate"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Rollback(ctx, "pay", 1, 0, "", "back"); err != nil {
		t.Fatal(err)
	}
}

func TestSecretValuesAreNeverInEtcdInClear(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	ctx := t.Context()
	writeSecrets(t, e)
	if found := clearIn(t, e.cli, "correct-horse"); len(found) > 0 {
		t.Fatalf("the secret is in clear in etcd at %q", found)
	}
	snap, err := e.s.Snapshot(ctx, "pay", 0)
	if err != nil {
		t.Fatal(err)
	}
	sealed := snap.Content["db.password"]
	if !keyring.IsSealed(sealed) || snap.Content["db.host"] != "db1" {
		t.Fatalf("content %q", snap.Content)
	}
	if plain, err := e.s.OpenValue(ctx, "pay", "db.password", sealed); err != nil || plain != password {
		t.Fatalf("OpenValue = %q, %v; want the value the rollback restored", plain, err)
	}
	// Sealed under its key: the same ciphertext does not open as another.
	if _, err := e.s.OpenValue(ctx, "pay", "db.host", sealed); !errors.Is(err, configcenter.ErrSecretsUnavailable) {
		t.Fatalf("a sealed value moved to another key opened: %v", err)
	}
	// The clear value it has already is still a change: "nothing changed"
	// would tell a writer (without config.read-secret) that a guess is
	// right, by a dry run.
	same, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "db.password", Value: password}}, DryRun: true})
	if err != nil || len(same.Changes) != 1 {
		t.Fatalf("a dry-run put of the same secret = %+v, %v; want a change (no oracle)", same, err)
	}
	// A put without the secret mark keeps it secret.
	r, err := e.s.Put(ctx, "pay", "db.password", "plain-now?", 0, "", "")
	if err != nil || len(r.Changes) != 1 || !keyring.IsSealed(*r.Changes[0].New) || !keyring.IsSealed(*r.Changes[0].Old) {
		t.Fatalf("a put without the mark = %+v, %v: the secret stopped being one", r, err)
	}
	// Deleted, the key is an ordinary key again.
	if _, err := e.s.Delete(ctx, "pay", "db.password", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Put(ctx, "pay", "db.password", "not-secret", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if got, _, err := e.s.Get(ctx, "pay", "db.password", 0); err != nil || got.Value != "not-secret" {
		t.Fatalf("after delete and put: %+v, %v", got, err)
	}
}

// TestTheLeakCheckCatchesClearSecrets switches sealing off: the same
// releases must then leave the secret in etcd, where clearIn finds it
// (else the test above could not fail).
func TestTheLeakCheckCatchesClearSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	configcenter.SetSealingOff(e.s)
	writeSecrets(t, e)
	found := clearIn(t, e.cli, "correct-horse")
	if len(found) < 2 { // the key and its release records
		t.Fatalf("with sealing off, the leak check found only %q", found)
	}
}

func TestSecretsNeedKeysAndRefuseSealedLookalikes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	ctx := t.Context()
	_, err := e.s.Put(ctx, "pay", "ok", "plain", 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "pw", Value: "x", Secret: true}}})
	if !errors.Is(err, configcenter.ErrSecretsUnavailable) || !strings.Contains(err.Error(), "--secret-key-file") {
		t.Fatalf("a secret without keys: %v", err)
	}
	_, err = e.s.Put(ctx, "pay", "fake", keyring.SealedPrefix+"AAAA", 0, "", "")
	if !errors.Is(err, configcenter.ErrInvalid) {
		t.Fatalf("a clear value that looks sealed: %v", err)
	}
	if got := clearIn(t, e.cli, keyring.SealedPrefix); len(got) != 0 {
		t.Fatalf("refused writes left %q", got)
	}
}

func TestSchemaSeesSecretsInClearAndNeverQuotesThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	ctx := t.Context()
	if _, err := e.s.SetSchema(ctx, "pay", `{"type":"object","properties":{"pin":{"type":"integer","maximum":9999}}}`); err != nil {
		t.Fatal(err)
	}
	// Checked in clear: 1234 is an integer, its sealed text is not.
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "pin", Value: "1234", Secret: true}}}); err != nil {
		t.Fatalf("a valid secret: %v", err)
	}
	_, err := e.s.Put(ctx, "pay", "pin", "98765", 0, "", "")
	if !errors.Is(err, configcenter.ErrValidation) || strings.Contains(err.Error(), "98765") || !strings.Contains(err.Error(), "secret value does not match") {
		t.Fatalf("an invalid secret: %v", err)
	}
	// A schema the secret does not match is refused without quoting it.
	_, err = e.s.SetSchema(ctx, "pay", `{"type":"object","properties":{"pin":{"type":"integer","maximum":99}}}`)
	if !errors.Is(err, configcenter.ErrValidation) || strings.Contains(err.Error(), "1234") {
		t.Fatalf("SetSchema = %v", err)
	}
}

func TestGrayReleasesCannotOverrideSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	ctx := t.Context()
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "pw", Value: "x", Secret: true}}}); err != nil {
		t.Fatal(err)
	}
	sel := configcenter.GraySelector{Instances: []string{"a"}}
	for _, ms := range [][]configcenter.Mutation{{{Key: "pw", Value: "y"}}, {{Key: "other", Value: "y", Secret: true}}} {
		_, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: "pay", Selector: &sel, Mutations: ms})
		if !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "secret") {
			t.Fatalf("CreateGray(%+v) = %v", ms, err)
		}
	}
}

func TestRotatingTheKeyRewrapsWithoutResealing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	k1, k2 := keyLine(t, "k1"), keyLine(t, "k2")
	e.s.SetKeys(ringOf(t, k1))
	ctx := t.Context()
	for _, ns := range []string{"a", "b"} {
		if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: ns, Mutations: []configcenter.Mutation{{Key: "pw", Value: "v-" + ns, Secret: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	snap, _ := e.s.Snapshot(ctx, "a", 0)
	before := snap.Content["pw"]
	// A member given only the new key cannot open what k1 wrapped.
	e.s.SetKeys(ringOf(t, k2))
	if _, err := e.s.OpenValue(ctx, "a", "pw", before); !errors.Is(err, configcenter.ErrSecretsUnavailable) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("opened without its key: %v", err)
	}
	// The new key first, the old kept: rewrap, then the old may go.
	e.s.SetKeys(ringOf(t, k2, k1))
	res, err := e.s.RewrapDataKeys(ctx)
	if err != nil || res.Rewrapped != 2 || res.ByKEK["k2"] != 2 || len(res.ByKEK) != 1 || res.Primary != "k2" {
		t.Fatalf("RewrapDataKeys = %+v, %v", res, err)
	}
	if res, err := e.s.RewrapDataKeys(ctx); err != nil || res.Rewrapped != 0 {
		t.Fatalf("a second rewrap = %+v, %v", res, err)
	}
	e.s.SetKeys(ringOf(t, k2))
	snap, _ = e.s.Snapshot(ctx, "a", 0)
	if snap.Content["pw"] != before {
		t.Fatal("the rewrap sealed the value again")
	}
	for _, ns := range []string{"a", "b"} {
		snap, _ = e.s.Snapshot(ctx, ns, 0)
		if plain, err := e.s.OpenValue(ctx, ns, "pw", snap.Content["pw"]); err != nil || plain != "v-"+ns {
			t.Fatalf("%s after rotation: %q, %v", ns, plain, err)
		}
	}
}

// A key a running gray overrides (in clear) cannot become a secret while
// the gray runs (PromoteGray also refuses a secret key, as a last guard).
func TestGrayOverridesAndSecretsStayApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, configcenter.Limits{})
	e.s.SetKeys(keys(t, "k1"))
	ctx := t.Context()
	if _, err := e.s.Put(ctx, "pay", "pw", "a", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	sel := configcenter.GraySelector{Instances: []string{"i"}}
	if _, err := e.s.CreateGray(ctx, configcenter.GrayRequest{Namespace: "pay", Selector: &sel, Mutations: []configcenter.Mutation{{Key: "pw", Value: "b"}}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "pw", Value: "c", Secret: true}}})
	if !errors.Is(err, configcenter.ErrInvalid) || !strings.Contains(err.Error(), "gray release") {
		t.Fatalf("making a gray-overridden key secret = %v", err)
	}
	// Nor deleted and put back as a secret while the gray runs; promoted,
	// the override is a plain value.
	if _, err := e.s.Delete(ctx, "pay", "pw", 0, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Publish(ctx, configcenter.PublishRequest{Namespace: "pay", Mutations: []configcenter.Mutation{{Key: "pw", Value: "d", Secret: true}}}); !errors.Is(err, configcenter.ErrInvalid) {
		t.Fatalf("a secret put of a gray-overridden key after a delete = %v", err)
	}
	if _, rel, err := e.s.PromoteGray(ctx, "pay", 0, "", ""); err != nil || keyring.IsSealed(*rel.Changes[0].New) {
		t.Fatalf("PromoteGray = %+v, %v", rel, err)
	}
}
