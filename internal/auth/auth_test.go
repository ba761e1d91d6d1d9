package auth_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/auth"
)

const examplePolicy = `
groups:
  batch: [worker-1, worker-2]
rules:
  - principals: [payments]
    actions: [session, lock.acquire, lock.release, lock.describe, kv.fenced]
    locks: ["payments/*"]
    keys: ["payments/*"]
  - groups: [batch]
    actions: [session, election.*]
    elections: [nightly-report]
  - principals: ["*"]
    actions: [config.read]
    namespaces: ["public/*"]
  - groups: [admins]
    actions: ["*"]
    locks: ["*"]
    elections: ["*"]
    namespaces: ["*"]
    keys: ["*"]
`

func TestPolicyAllows(t *testing.T) {
	pol, err := auth.ParsePolicy([]byte(examplePolicy))
	if err != nil {
		t.Fatal(err)
	}
	payments := auth.Principal{Name: "payments"}
	worker := auth.Principal{Name: "worker-2"}
	admin := auth.Principal{Name: "ops", Groups: []string{"admins"}}
	lock := func(n string) auth.Resource { return auth.Resource{Kind: auth.Lock, Name: n} }
	for _, c := range []struct {
		p    auth.Principal
		a    auth.Action
		res  auth.Resource
		want bool
	}{
		{payments, auth.LockAcquire, lock("payments/ledger"), true},
		{payments, auth.LockAcquire, lock("payments"), false}, // the glob needs the slash
		{payments, auth.LockAcquire, lock("billing/ledger"), false},
		{payments, auth.Session, auth.Resource{}, true},
		{payments, auth.ClusterRead, auth.Resource{}, false},
		{payments, auth.KVFenced, auth.Resource{Kind: auth.Key, Name: "payments/balance"}, true},
		{payments, auth.ElectionCampaign, auth.Resource{Kind: auth.Election, Name: "payments/x"}, false}, // no election patterns
		{payments, auth.LockDescribe, auth.Resource{Kind: auth.Lock, Name: "payments/", Prefix: true}, true},
		{payments, auth.LockDescribe, auth.Resource{Kind: auth.Lock, Name: "", Prefix: true}, false}, // listing everything
		{worker, auth.ElectionCampaign, auth.Resource{Kind: auth.Election, Name: "nightly-report"}, true},
		{worker, auth.ElectionObserve, auth.Resource{Kind: auth.Election, Name: "nightly-report"}, true},
		{worker, auth.ElectionCampaign, auth.Resource{Kind: auth.Election, Name: "nightly-report-2"}, false},
		{worker, auth.ConfigRead, auth.Resource{Kind: auth.Namespace, Name: "public/flags"}, true},
		{worker, auth.ConfigWrite, auth.Resource{Kind: auth.Namespace, Name: "public/flags"}, false},
		{auth.Anonymous, auth.ConfigRead, auth.Resource{Kind: auth.Namespace, Name: "public/flags"}, false}, // "*" is any authenticated principal
		{admin, auth.ClusterAdmin, auth.Resource{}, true},
		{admin, auth.LockDescribe, auth.Resource{Kind: auth.Lock, Prefix: true}, true},
	} {
		got, why := pol.Allows(c.p, c.a, c.res)
		if got != c.want {
			t.Errorf("%q %s %+v = %v (%s), want %v", c.p.Name, c.a, c.res, got, why, c.want)
		}
		if !got && why == "" {
			t.Errorf("%q %s %+v: denied without a reason", c.p.Name, c.a, c.res)
		}
	}
}

func TestBadPoliciesAreRefusedWhole(t *testing.T) {
	for _, c := range []struct{ policy, want string }{
		{"", "no rules"},
		{"rules: []", "no rules"},
		{"rules:\n  - actions: [session]", "names no principals"},
		{"rules:\n  - principals: [a]\n    actions: [lock.grab]", `unknown action "lock.grab"`},
		{"rules:\n  - principals: [a]\n    actions: [nope.*]", `unknown action "nope.*"`},
		{"rules:\n  - principals: [a]", "no actions"},
		{"rules:\n  - principals: [a]\n    actions: [session]\n    locks: ['']", "empty name pattern"},
		{"rules:\n  - principals: [a]\n    actions: [session]\n    lock: [x]", "field lock not found"},
		{"rules: {", "policy:"},
	} {
		_, err := auth.ParsePolicy([]byte(c.policy))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParsePolicy(%q) = %v, want an error containing %q", c.policy, err, c.want)
		}
	}
}

func TestReloadKeepsThePolicyOnError(t *testing.T) {
	a := auth.NewAuthorizer(nil)
	if !a.Open() {
		t.Fatal("no policy: want open mode")
	}
	if ok, _ := a.Allows(auth.Anonymous, auth.ClusterAdmin, auth.Resource{}); !ok {
		t.Fatal("open mode denied")
	}
	if err := a.Load([]byte(examplePolicy)); err != nil {
		t.Fatal(err)
	}
	if err := a.Load([]byte("rules: [")); err == nil {
		t.Fatal("a bad policy was accepted")
	}
	if a.Open() {
		t.Fatal("a bad reload dropped the policy")
	}
	if ok, _ := a.Allows(auth.Principal{Name: "payments"}, auth.LockAcquire, auth.Resource{Kind: auth.Lock, Name: "payments/x"}); !ok {
		t.Fatal("the policy in force changed after a refused reload")
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pat, name string
		want      bool
	}{
		{"*", "", true}, {"*", "a/b/c", true}, {"a/*", "a/", true}, {"a/*", "a", false},
		{"a/*/c", "a/b/x/c", true}, {"a?c", "abc", true}, {"a?c", "ac", false},
		{"*b*", "aaabaaa", true}, {"*b", "aaa", false}, {"exact", "exact", true}, {"exact", "exact2", false},
		{strings.Repeat("*a", 30), strings.Repeat("a", 29), false}, // no exponential backtracking
	} {
		if got := auth.Glob(c.pat, c.name); got != c.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", c.pat, c.name, got, c.want)
		}
	}
}

func TestTokens(t *testing.T) {
	file := "tokens:\n  - principal: payments\n    groups: [services]\n    sha256: " + auth.HashToken("s3cret-token") + "\n"
	toks, err := auth.ParseTokens([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := toks.Lookup("s3cret-token"); !ok || p.Name != "payments" || len(p.Groups) != 1 {
		t.Fatalf("Lookup = %+v, %v", p, ok)
	}
	for _, bad := range []string{"", "s3cret-token2", "S3CRET-TOKEN"} {
		if _, ok := toks.Lookup(bad); ok {
			t.Errorf("Lookup(%q) found a principal", bad)
		}
	}
	for _, c := range []struct{ file, want string }{
		{"tokens: []", "no tokens"},
		{"tokens:\n  - principal: a\n    sha256: abc", "64 hex digits"},
		{"tokens:\n  - principal: ''\n    sha256: " + auth.HashToken("x"), "principal"},
		{"tokens:\n  - principal: a\n    sha256: " + auth.HashToken("x") + "\n  - principal: b\n    sha256: " + auth.HashToken("x"), "the same token as a's"},
		{"tokens:\n  - principal: a\n    token: x", "field token not found"},
	} {
		if _, err := auth.ParseTokens([]byte(c.file)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseTokens(%q) = %v, want an error containing %q", c.file, err, c.want)
		}
	}
}

func FuzzParsePolicy(f *testing.F) {
	f.Add(examplePolicy)
	f.Add("rules:\n  - principals: [a]\n    actions: ['*']\n    locks: ['*?*']")
	f.Add("groups: {g: [a]}\nrules: [{groups: [g], actions: [lock.*], locks: ['x/*']}]")
	f.Fuzz(func(_ *testing.T, policy string) {
		pol, err := auth.ParsePolicy([]byte(policy))
		if err != nil {
			return
		}
		// A policy that parses answers every question without panicking.
		for a := range auth.Actions {
			pol.Allows(auth.Principal{Name: "a", Groups: []string{"g"}}, a, auth.Resource{Kind: auth.Actions[a], Name: "x/y"})
			pol.Allows(auth.Principal{Name: "a"}, a, auth.Resource{Kind: auth.Actions[a], Name: "x/", Prefix: true})
		}
	})
}

func FuzzParseTokens(f *testing.F) {
	f.Add("tokens:\n  - principal: payments\n    groups: [services]\n    sha256: " + auth.HashToken("t") + "\n")
	f.Add("tokens: [{principal: a, sha256: '" + strings.Repeat("A", 64) + "'}]")
	f.Fuzz(func(_ *testing.T, file string) {
		toks, err := auth.ParseTokens([]byte(file))
		if err != nil {
			return
		}
		toks.Lookup("t")
	})
}

// A principal's groups are its token's and the policy's, once each.
func TestGroupsComeFromTokensAndThePolicy(t *testing.T) {
	open := auth.NewAuthorizer(nil)
	if g, inForce := open.Groups(auth.Principal{Name: "worker-1", Groups: []string{"ops"}}); inForce || !slices.Equal(g, []string{"ops"}) {
		t.Errorf("open mode: %v, %v; want the token's groups [ops], no policy", g, inForce)
	}
	pol, err := auth.ParsePolicy([]byte(examplePolicy))
	if err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthorizer(pol)
	for _, c := range []struct {
		p    auth.Principal
		want []string
	}{
		{auth.Principal{Name: "worker-1"}, []string{"batch"}},
		{auth.Principal{Name: "worker-2", Groups: []string{"ops", "batch"}}, []string{"batch", "ops"}},
		{auth.Principal{Name: "payments"}, nil},
		{auth.Anonymous, nil},
	} {
		if g, inForce := a.Groups(c.p); !inForce || !slices.Equal(g, c.want) {
			t.Errorf("Groups(%+v) = %v, %v; want %v, true", c.p, g, inForce, c.want)
		}
	}
}
