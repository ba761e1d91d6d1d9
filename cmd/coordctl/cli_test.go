package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
)

// unreachable is an endpoint nobody answers on.
const unreachable = "127.0.0.1:1"

func TestVersion(t *testing.T) {
	t.Parallel()
	if out := must(t, unreachable, "--version"); !strings.HasPrefix(out, "coordctl version ") {
		t.Errorf("coordctl --version = %q", out)
	}
}

func TestUnknownSubcommandIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, group := range [][]string{nil, {"session"}, {"lock"}, {"elect"}, {"config"}, {"cluster"}, {"member"}, {"snapshot"}} {
		path := strings.Join(append([]string{"coordctl"}, group...), " ")
		code, out, errOut := ctl(t, unreachable, "", append(group, "bogus")...)
		if code != exitUsage || out != "" ||
			!strings.Contains(errOut, path+`: unknown command "bogus"`) || !strings.Contains(errOut, "run '"+path+" --help'") {
			t.Errorf("%s bogus = %d, want %d with a hint\nstdout: %s\nstderr: %s", path, code, exitUsage, out, errOut)
		}
	}
	// A near miss gets a suggestion.
	if errOut := exits(t, exitUsage, unreachable, "lock", "stauts"); !strings.Contains(errOut, "did you mean status?") {
		t.Errorf("lock stauts: %s", errOut)
	}
	// A group alone still shows its help.
	if out := must(t, unreachable, "lock"); !strings.Contains(out, "Available Commands") {
		t.Errorf("lock alone:\n%s", out)
	}
}

func TestCompletionOfAnUnsupportedShellIsAUsageError(t *testing.T) {
	t.Parallel()
	errOut := exits(t, exitUsage, unreachable, "completion", "tcsh")
	for _, want := range []string{`unsupported shell "tcsh"`, "bash", "zsh", "fish", "powershell"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("completion tcsh: %q lacks %q", errOut, want)
		}
	}
	if out := must(t, unreachable, "completion", "bash"); !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash:\n%.200s", out)
	}
}

func TestElectCandidates(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	session := func() string {
		var s struct{ ID string }
		jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
		return s.ID
	}
	must(t, ep, "elect", "campaign", "jobs", "host-1", "--session", session())
	if out := must(t, ep, "elect", "candidates", "jobs", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("candidates behind a lone leader: %q, want []", out)
	}

	// Two campaigns wait behind the leader, in the order they came.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, value := range []string{"host-2", "host-3"} {
		id := session()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errOut strings.Builder
			run(ctx, []string{"--endpoints", ep, "elect", "campaign", "jobs", value, "--session", id}, strings.NewReader(""), &out, &errOut)
		}()
		wait.Within(t, 15*time.Second, value+" to stand", func() bool {
			_, out, _ := ctl(t, ep, "", "elect", "candidates", "jobs", "-o", "json")
			var cs []any
			return json.Unmarshal([]byte(out), &cs) == nil && len(cs) == i+1
		})
	}
	var cands []struct {
		Joined    string `json:"joinedRevision"`
		Value     string `json:"value"`
		SessionID string `json:"sessionId"`
	}
	jsonOf(t, must(t, ep, "elect", "candidates", "jobs", "-o", "json"), &cands)
	if len(cands) != 2 || cands[0].Value != "host-2" || cands[1].Value != "host-3" || cands[0].Joined == "" || cands[0].SessionID == "" {
		t.Fatalf("elect candidates -o json = %+v", cands)
	}
	lines := strings.Split(strings.TrimSpace(must(t, ep, "elect", "candidates", "jobs")), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "PRIORITY") || !strings.Contains(lines[1], "host-2") || !strings.Contains(lines[2], "host-3") ||
		!strings.Contains(lines[1], cands[0].SessionID) {
		t.Fatalf("elect candidates:\n%s", strings.Join(lines, "\n"))
	}
	exits(t, exitUsage, ep, "elect", "candidates")
}

// schema is a definition of REST's OpenAPI document.
type schema struct {
	Type                 string             `json:"type"`
	Ref                  string             `json:"$ref"`
	Properties           map[string]*schema `json:"properties"`
	Items                *schema            `json:"items"`
	AdditionalProperties *schema            `json:"additionalProperties"`
	Enum                 []string           `json:"enum"`
}

// UnmarshalJSON also takes a schema that is true or false (as
// additionalProperties can be): no constraint.
func (s *schema) UnmarshalJSON(b []byte) error {
	if string(b) == "true" || string(b) == "false" {
		return nil
	}
	type plain schema
	return json.Unmarshal(b, (*plain)(s))
}

func ref(name string) *schema   { return &schema{Ref: "#/definitions/" + name} }
func arrayOf(s *schema) *schema { return &schema{Type: "array", Items: s} }

// restDefinitions reads REST's definitions from its OpenAPI document.
func restDefinitions(t *testing.T) map[string]*schema {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "internal", "server", "restapi", "coordd.swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions map[string]*schema `json:"definitions"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Definitions
}

// conform lists where v, decoded JSON, is not REST's JSON for s: a null,
// a field REST does not have, or another JSON type (an int64 is a
// string).
func conform(defs map[string]*schema, s *schema, v any, path string) []string {
	if s.Ref != "" {
		name := strings.TrimPrefix(s.Ref, "#/definitions/")
		if s = defs[name]; s == nil {
			return []string{path + ": REST has no definition " + name}
		}
	}
	if v == nil {
		return []string{path + " is null"}
	}
	wrong := []string{fmt.Sprintf("%s = %v (%T) is not REST's %s", path, v, v, s.Type)}
	switch {
	case s.Properties != nil:
		obj, ok := v.(map[string]any)
		if !ok {
			return wrong
		}
		var bad []string
		for k, fv := range obj {
			fs, ok := s.Properties[k]
			if !ok {
				bad = append(bad, fmt.Sprintf("%s.%s: REST has no such field", path, k))
				continue
			}
			bad = append(bad, conform(defs, fs, fv, path+"."+k)...)
		}
		return bad
	case s.Type == "array":
		l, ok := v.([]any)
		if !ok {
			return wrong
		}
		var bad []string
		for i, e := range l {
			bad = append(bad, conform(defs, s.Items, e, fmt.Sprintf("%s[%d]", path, i))...)
		}
		return bad
	case s.AdditionalProperties != nil:
		m, ok := v.(map[string]any)
		if !ok {
			return wrong
		}
		var bad []string
		for k, e := range m {
			bad = append(bad, conform(defs, s.AdditionalProperties, e, path+"."+k)...)
		}
		return bad
	case s.Type == "string" || s.Enum != nil:
		_, ok := v.(string)
		if !ok {
			return wrong
		}
	case s.Type == "integer" || s.Type == "number":
		_, ok := v.(float64)
		if !ok {
			return wrong
		}
	case s.Type == "boolean":
		_, ok := v.(bool)
		if !ok {
			return wrong
		}
	}
	return nil
}

// TestJSONOutputIsRESTs runs commands with -o json and checks each output
// against the REST API's OpenAPI definition of the same object: REST's
// field names, int64s as strings, no nulls (an empty list is []).
func TestJSONOutputIsRESTs(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	defs := restDefinitions(t)
	check := func(s *schema, args ...string) map[string]any {
		t.Helper()
		out := must(t, ep, append(args, "-o", "json")...)
		var v any
		jsonOf(t, out, &v)
		for _, p := range conform(defs, s, v, strings.Join(args, " ")) {
			t.Error(p)
		}
		m, _ := v.(map[string]any)
		return m
	}
	has := func(m map[string]any, what string, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s: no %q in %v", what, k, m)
			}
		}
	}

	s := check(ref("v1Session"), "session", "create", "--label", "team=core")
	has(s, "session create", "id", "ttl", "labels", "createTime")
	id := s["id"].(string)
	has(check(ref("v1Session"), "session", "get", id), "session get", "remainingTtl", "createTime")
	check(arrayOf(ref("v1Session")), "session", "list")
	check(ref("v1KeepAliveResponse"), "session", "keepalive", id)

	g := check(ref("v1LockGrant"), "lock", "acquire", "jobs/nightly", "--session", id)
	has(g, "lock acquire", "token", "revision")
	st := check(ref("v1DescribeLockResponse"), "lock", "status", "jobs/nightly")
	has(st, "lock status", "holders", "waiters", "revision")
	if h, _ := st["holders"].([]any); len(h) != 1 || h[0].(map[string]any)["token"] != g["token"] {
		t.Errorf("lock status holders = %v, want the token %v", st["holders"], g["token"])
	}
	check(ref("v1DescribeLockResponse"), "lock", "status", "nobody/holds/this")
	if w := check(ref("v1DescribeLockResponse"), "lock", "status", "jobs/nightly", "--watch", "--count", "1"); fmt.Sprint(w["holders"]) != fmt.Sprint(st["holders"]) {
		t.Errorf("lock status --watch = %v, want the holders of lock status %v", w, st["holders"])
	}
	if rg := check(ref("v1LockGrant"), "lock", "acquire", "jobs/rw", "--session", id, "--read"); rg["read"] != true {
		t.Errorf("lock acquire --read = %v, want a read grant", rg)
	}
	if rs := check(ref("v1DescribeLockResponse"), "lock", "status", "jobs/rw"); !strings.Contains(fmt.Sprint(rs["holders"]), "read:true") {
		t.Errorf("lock status of a read grant = %v", rs)
	}
	if out := must(t, ep, "lock", "status", "jobs/rw"); !strings.Contains(out, "holder (read)") {
		t.Errorf("lock status of a read grant:\n%s", out)
	}
	fence := []string{"--lock", "jobs/nightly", "--token", g["token"].(string)}
	w := check(ref("v1FencedPutResponse"), append([]string{"kv", "put", "jobs/owner", "host-1"}, fence...)...)
	has(check(ref("v1GetKVResponse"), "kv", "get", "jobs/owner"), "kv get", "kv", "revision")
	if out := must(t, ep, "kv", "get", "jobs/owner"); out != "host-1\n" {
		t.Errorf("kv get = %q, want the value", out)
	}
	check(arrayOf(ref("v1KeyValue")), "kv", "list", "jobs/")
	check(ref("v1KVEvent"), "kv", "watch", "jobs/", "--from", w["revision"].(string), "--count", "1")
	check(ref("v1FencedDeleteResponse"), append([]string{"kv", "delete", "jobs/owner"}, fence...)...)
	exits(t, exitNotFound, ep, "kv", "get", "jobs/owner")
	exits(t, exitUsage, ep, "kv", "put", "jobs/owner", "x", "--lock", "jobs/nightly")
	if out := must(t, ep, "lock", "list", "nothing/", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("lock list of nothing = %q, want []", out)
	}
	// An empty listing says so in a sentence, as every listing does.
	for _, tc := range [][2]string{{"lock", `no lock is held or waited for under "nothing/"`}, {"elect", `no election has a leader or candidates under "nothing/"`}} {
		if out := must(t, ep, tc[0], "list", "nothing/"); strings.TrimSpace(out) != tc[1] {
			t.Errorf("%s list of nothing = %q, want %q", tc[0], out, tc[1])
		}
	}

	has(check(ref("v1Leadership"), "elect", "campaign", "scheduler", "host-1", "--session", id), "elect campaign", "term")
	leader := &schema{Properties: map[string]*schema{"leader": ref("v1ElectionLeader"), "candidates": arrayOf(ref("v1ElectionCandidate"))}}
	l := check(leader, "elect", "leader", "scheduler")
	has(l, "elect leader", "leader", "candidates")
	has(l["leader"].(map[string]any), "elect leader", "term", "since", "proclaims")
	check(arrayOf(ref("v1ElectionCandidate")), "elect", "candidates", "scheduler")
	check(ref("v1ElectionEvent"), "elect", "observe", "scheduler", "--count", "1")

	code, out, errOut := ctl(t, ep, `{"port": 8080, "name": "web"}`, "config", "publish", "svc/prod", "-f", "-", "-o", "json")
	if code != 0 {
		t.Fatalf("publish = %d: %s%s", code, out, errOut)
	}
	check(ref("v1ConfigRelease"), "config", "put", "svc/prod", "port", "9090")
	has(check(ref("v1ConfigRelease"), "config", "delete", "svc/prod", "name"), "config delete", "number", "revision", "rollbackOf", "changes")
	check(ref("v1ConfigRelease"), "config", "rollback", "svc/prod", "1")
	check(arrayOf(ref("v1ConfigRelease")), "config", "history", "svc/prod")
	has(check(ref("v1GetResponse"), "config", "get", "svc/prod", "port"), "config get", "modRevision")
	has(check(ref("v1NamespaceSnapshot"), "config", "snapshot", "svc/prod"), "config snapshot", "release", "revision", "entries")
	check(ref("v1WatchResponse"), "config", "watch", "svc/prod", "--count", "1")
	check(ref("v1GetApplyStatusResponse"), "config", "status", "svc/prod")
	out = must(t, ep, "config", "diff", "svc/prod", "1", "2", "-o", "json")
	if !strings.Contains(out, `"oldValue": "8080"`) || !strings.Contains(out, `"newValue": "9090"`) {
		t.Errorf("config diff -o json:\n%s", out)
	}
	check(arrayOf(ref("v1ConfigChange")), "config", "diff", "svc/prod", "1", "2")
	if out := must(t, ep, "config", "diff", "svc/prod", "1", "1", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty config diff = %q, want []", out)
	}
	gray := check(ref("v1GrayRelease"), "config", "gray", "create", "svc/prod", "--instance", "web-1", "--label", "zone=eu", "--set", "port=7070", "-m", "canary")
	has(gray, "config gray create", "number", "selector", "overrides", "changes", "baseRelease")
	check(ref("v1GrayRelease"), "config", "gray", "update", "svc/prod", "--instance", "web-1", "--percent", "10", "--expect-gray", "1")
	exits(t, exitNotFound, ep, "config", "gray", "abandon", "svc/prod", "--expect-gray", "1")
	exits(t, exitConflict, ep, "config", "gray", "create", "svc/prod", "--percent", "5", "--set", "x=1")
	exits(t, exitUsage, ep, "config", "gray", "create", "svc/prod", "--set", "x=1")
	if out := must(t, ep, "config", "gray", "get", "svc/prod"); !strings.Contains(out, "gray release 2 (update)") || !strings.Contains(out, "10% of instances") || !strings.Contains(out, "~ port = 7070") {
		t.Errorf("config gray get:\n%s", out)
	}
	if out := must(t, ep, "config", "watch", "svc/prod", "--count", "1", "--instance", "web-1"); !strings.Contains(out, "+gray 2") {
		t.Errorf("config watch --instance of a selected instance:\n%s", out)
	}
	if out := must(t, ep, "config", "diff", "svc/prod", "4", "g2"); !strings.Contains(out, "~ port = 7070") {
		t.Errorf("config diff to a gray release:\n%s", out)
	}
	check(ref("v1GrayRelease"), "config", "gray", "abandon", "svc/prod")
	check(arrayOf(ref("v1GrayRelease")), "config", "gray", "history", "svc/prod")
	exits(t, exitNotFound, ep, "config", "gray", "get", "svc/prod")
	has(check(ref("v1GetClusterStatusResponse"), "cluster", "status"), "cluster status", "revision", "members", "dbSizeBytes", "alarms", "quotaBackendBytes")
	check(arrayOf(ref("v1Alarm")), "cluster", "alarms")
	has(check(ref("v1WhoAmIResponse"), "cluster", "whoami"), "cluster whoami", "principal", "groups", "policy")
	if out := must(t, ep, "cluster", "whoami"); !strings.Contains(out, "anonymous; no policy is in force") {
		t.Errorf("cluster whoami without a policy printed %q", out)
	}
	check(arrayOf(ref("v1DefragmentResponse")), "cluster", "defrag")
	added := check(ref("v1AddMemberResponse"), "member", "add", "n9", "--peer-urls", "http://127.0.0.1:1")
	has(added, "member add", "member", "initialCluster", "initialClusterState")
	check(arrayOf(ref("v1ClusterMember")), "member", "list")
	var ms []map[string]any
	jsonOf(t, must(t, ep, "member", "list", "-o", "json"), &ms)
	if len(ms) != 2 {
		t.Fatalf("member list after an add: %v", ms)
	}
	for _, m := range ms {
		if m["name"] != "" { // the added member never started: it has no health
			has(m, "member list", "health")
		}
	}
	has(check(ref("v1ClusterMember"), "member", "remove", added["member"].(map[string]any)["id"].(string)), "member remove", "id", "isLearner")
}

// errorOf reads the one JSON error object an -o json command printed.
func errorOf(t *testing.T, errOut string) errorBodyJSON {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(errOut))
	dec.DisallowUnknownFields()
	var e errorJSON
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("stderr %q is not a JSON error: %v", errOut, err)
	}
	if dec.More() {
		t.Fatalf("stderr %q holds more than one JSON object", errOut)
	}
	return e.Error
}

func TestErrorsAreJSONWithJSONOutput(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	for _, c := range []struct {
		endpoint string
		args     []string
		exit     int
		code     string
		reason   string
	}{
		{ep, []string{"session", "get", "0123456789abcdef"}, exitNotFound, "NOT_FOUND", "SESSION_NOT_FOUND"},
		{ep, []string{"config", "get", "ns", "missing"}, exitNotFound, "NOT_FOUND", "KEY_NOT_FOUND"},
		{ep, []string{"lock", "acquire", "x"}, exitUsage, "USAGE", ""},
		{ep, []string{"lock", "bogus"}, exitUsage, "USAGE", ""},
		{ep, []string{"lock", "status", "--no-such-flag"}, exitUsage, "USAGE", ""},
		{unreachable, []string{"--timeout", "300ms", "session", "list"}, exitUnavailable, "UNAVAILABLE", ""},
	} {
		code, out, errOut := ctl(t, c.endpoint, "", append([]string{"-o", "json"}, c.args...)...)
		if code != c.exit || out != "" {
			t.Errorf("%v = %d, want %d\nstdout: %s\nstderr: %s", c.args, code, c.exit, out, errOut)
			continue
		}
		e := errorOf(t, errOut)
		if e.Code != c.code || e.Reason != c.reason || e.ExitCode != c.exit || e.Message == "" {
			t.Errorf("%v: error %+v, want code %s, reason %q, exit code %d", c.args, e, c.code, c.reason, c.exit)
		}
	}

	// A refused write lists its problems.
	schemaFile := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schemaFile, []byte(`{"type":"object","properties":{"port":{"type":"integer"},"name":{"type":"string"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, ep, "config", "schema", "svc/prod", "--set", schemaFile)
	code, _, errOut := ctl(t, ep, `{"port": "x", "name": 7}`, "config", "publish", "svc/prod", "-f", "-", "-o", "json")
	e := errorOf(t, errOut)
	var keys []string
	for _, p := range e.Problems {
		keys = append(keys, p.Key)
	}
	if k := strings.Join(keys, " "); code != exitError || e.ExitCode != exitError || e.Reason != "VALIDATION_FAILED" ||
		len(keys) != 2 || !strings.Contains(k, "port") || !strings.Contains(k, "name") {
		t.Errorf("publish against the schema = %d, error %+v", code, e)
	}

	// Without -o json an error stays a line of text.
	if errOut := exits(t, exitNotFound, ep, "session", "get", "0123456789abcdef"); !strings.HasPrefix(errOut, "coordctl: ") {
		t.Errorf("text error: %q", errOut)
	}
}

func TestReleasesWithoutAuthorNameTheOSUser(t *testing.T) {
	t.Setenv("USER", "") // the OS user is found without it
	want := "coordctl"
	if u, err := user.Current(); err == nil && u.Username != "" {
		want = u.Username
	}
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	code, out, errOut := ctl(t, ep, `{"port": 1}`, "config", "publish", "svc/prod", "-f", "-", "--author", "ana")
	if code != 0 {
		t.Fatalf("publish = %d: %s%s", code, out, errOut)
	}
	must(t, ep, "config", "put", "svc/prod", "port", "2")
	must(t, ep, "config", "delete", "svc/prod", "port")
	must(t, ep, "config", "rollback", "svc/prod", "1")
	var rels []struct {
		Number string `json:"number"`
		Author string `json:"author"`
	}
	jsonOf(t, must(t, ep, "config", "history", "svc/prod", "-o", "json"), &rels)
	var got []string
	for _, r := range rels {
		got = append(got, r.Number+":"+r.Author)
	}
	if w := []string{"4:" + want, "3:" + want, "2:" + want, "1:ana"}; !slices.Equal(got, w) {
		t.Fatalf("history authors = %v, want %v", got, w)
	}
}

// complete runs cobra's hidden __complete command and returns the
// completions and the directive line.
func complete(t *testing.T, endpoint string, args ...string) ([]string, string) {
	t.Helper()
	code, out, errOut := ctl(t, endpoint, "", append([]string{"__complete"}, args...)...)
	if code != 0 {
		t.Fatalf("__complete %v = %d: %s%s", args, code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

func TestNamesCompleteFromTheServer(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
	must(t, ep, "lock", "acquire", "reports/daily", "--session", s.ID)
	must(t, ep, "lock", "acquire", "other", "--session", s.ID)
	must(t, ep, "config", "put", "payments/prod", "retries", "3")
	must(t, ep, "config", "put", "payments/dev", "retries", "3")
	must(t, ep, "elect", "campaign", "batch/leader", "host-1", "--session", s.ID)
	must(t, ep, "elect", "campaign", "backup/leader", "host-1", "--session", s.ID)
	noFiles := fmt.Sprintf(":%d", 4) // cobra.ShellCompDirectiveNoFileComp
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"lock", "status", "rep"}, []string{"reports/daily"}},
		{[]string{"lock", "release", ""}, []string{"other", "reports/daily"}},
		{[]string{"lock", "run", "r"}, []string{"reports/daily"}},
		{[]string{"lock", "status", "reports/daily", ""}, nil},
		{[]string{"config", "get", "pay"}, []string{"payments/dev", "payments/prod"}},
		{[]string{"config", "history", "payments/p"}, []string{"payments/prod"}},
		{[]string{"config", "watch", "payments/dev", "pay"}, []string{"payments/prod"}},
		{[]string{"elect", "leader", "ba"}, []string{"backup/leader", "batch/leader"}},
		{[]string{"elect", "observe", "bat"}, []string{"batch/leader"}},
	} {
		got, directive := complete(t, ep, c.args...)
		slices.Sort(got)
		if !slices.Equal(got, c.want) || directive != noFiles {
			t.Errorf("completion of %q = %q %s, want %q %s", c.args, got, directive, c.want, noFiles)
		}
	}

	// Unreachable: nothing, quickly, and no error.
	start := time.Now()
	got, directive := complete(t, unreachable, "lock", "status", "rep")
	if len(got) != 0 || directive != noFiles {
		t.Errorf("completion without coordd = %q %s", got, directive)
	}
	if took := time.Since(start); took > wait.Bound(5*time.Second) {
		t.Errorf("completion without coordd took %s", took)
	}
}

// A publish file that is not one JSON object says what it holds instead,
// in the user's terms (no Go type names).
func TestPublishFileThatIsNotAnObject(t *testing.T) {
	for file, want := range map[string]string{
		`["a"]`:        "it holds an array",
		`"x"`:          "it holds a string",
		``:             "it holds nothing",
		`{"a": 1,}`:    "not valid JSON at byte 9",
		`{"a": "b"} x`: "", // trailing text after the object is ignored, as before
	} {
		ms, err := mutationsFromJSON([]byte(file), valueFlags{})
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", file, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Go value")):
			t.Errorf("%q: %v (%d mutations); want an error saying %q", file, err, len(ms), want)
		}
	}
}

// A publish file's value is the text the user gave: a string without its
// quotes (unless bare it would read as another type), a number or a
// boolean as its text; an object or an array is refused unless
// --json-values asks for JSON text.
func TestPublishFileValuesAreTheirText(t *testing.T) {
	file := `{"timeout": "5s", "retries": 3, "on": true, "port": "8080", "quoted": "\"x\"", "url": "postgres://db:5432/a?b=<c>&d", "ratio": 1.50, "gone": null}`
	ms, err := mutationsFromJSON([]byte(file), valueFlags{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range ms {
		if m.Delete {
			got[m.Key] = "(deleted)"
			continue
		}
		got[m.Key] = m.Value
	}
	want := map[string]string{
		"timeout": "5s", "retries": "3", "on": "true", "port": `"8080"`, "quoted": `"\"x\""`,
		"url": "postgres://db:5432/a?b=<c>&d", "ratio": "1.50", "gone": "(deleted)",
	}
	if !maps.Equal(got, want) {
		t.Errorf("values = %q\nwant %q", got, want)
	}
	for _, nested := range []string{`{"limits": {"cpu": 1}}`, `{"hosts": ["a", "b"]}`} {
		if _, err := mutationsFromJSON([]byte(nested), valueFlags{}); err == nil || !strings.Contains(err.Error(), "--json-values") {
			t.Errorf("%s: %v; want a refusal naming --json-values", nested, err)
		}
	}
	ms, err = mutationsFromJSON([]byte(`{"timeout": "5s", "limits": {"cpu": 1}}`), valueFlags{jsonValues: true})
	if err != nil || len(ms) != 2 || ms[0].Value != `{"cpu":1}` || ms[1].Value != `"5s"` {
		t.Errorf("--json-values: %+v, %v; want JSON text, quotes included", ms, err)
	}
}

// Against a stopped daemon (nothing listens at the endpoint) a command
// fails at once, says so, and asks whether coordd runs, instead of waiting
// its --timeout.
func TestStoppedDaemonFailsAtOnce(t *testing.T) {
	t.Parallel()
	stopped := freeport.Addr(t) // reserved, then released: nothing listens
	t0 := time.Now()
	errOut := exits(t, exitUnavailable, stopped, "--timeout", "20s", "session", "list")
	if took := time.Since(t0); took > wait.Bound(5*time.Second) || !strings.Contains(errOut, "connection refused") || !strings.Contains(errOut, "is coordd running") {
		t.Errorf("after %s: %q; want at once, saying the connection was refused and asking whether coordd runs", took, errOut)
	}
}

// A table with no rows says so in a sentence instead of printing a bare
// header.
func TestEmptyResultsSaySo(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"elect", "candidates", "x"}, "no candidate waits in x"},
		{[]string{"config", "status", "a/b"}, "no instance has reported on a/b (subscribers report unless they opt out)"},
		{[]string{"config", "history", "a/b"}, "a/b has no release yet"},
		{[]string{"config", "gray", "history", "a/b"}, "a/b has had no gray release"},
		{[]string{"session", "list"}, "no live session"},
		{[]string{"lock", "status", "x"}, "nobody holds or waits"},
		{[]string{"kv", "list"}, "no key"},
	} {
		if out := must(t, ep, c.args...); strings.TrimSpace(out) != c.want {
			t.Errorf("%v = %q, want %q", c.args, out, c.want)
		}
	}
}

// --request-id makes lock acquire and elect campaign idempotent: run again
// with the same session and id, each returns the grant or term it already
// has instead of queueing behind it.
func TestRequestIDResumes(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
	var first, again struct{ Token, Term, RequestID string }
	jsonOf(t, must(t, ep, "lock", "acquire", "x", "--session", s.ID, "--request-id", "job-7", "-o", "json"), &first)
	jsonOf(t, must(t, ep, "lock", "acquire", "x", "--session", s.ID, "--request-id", "job-7", "--wait", "5s", "-o", "json"), &again)
	if first.Token == "" || again.Token != first.Token || first.RequestID != "job-7" {
		t.Errorf("lock acquire twice with one request id: %+v then %+v, want one grant with request id job-7", first, again)
	}
	if out := must(t, ep, "lock", "status", "x", "-o", "json"); strings.Count(out, s.ID) != 1 {
		t.Errorf("lock status after the retry holds the session more than once: %s", out)
	}
	jsonOf(t, must(t, ep, "elect", "campaign", "jobs", "host-1", "--session", s.ID, "--request-id", "c-1", "-o", "json"), &first)
	jsonOf(t, must(t, ep, "elect", "campaign", "jobs", "host-1", "--session", s.ID, "--request-id", "c-1", "--wait", "5s", "-o", "json"), &again)
	if first.Term == "" || again.Term != first.Term {
		t.Errorf("elect campaign twice with one request id: %+v then %+v, want one term", first, again)
	}
}

// config poll answers with the snapshot once a release after --after
// exists, and exits 124 with nothing on stdout when none came in --wait.
func TestConfigPoll(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	must(t, ep, "config", "put", "app/prod", "k", "v1")
	var snap struct {
		Release         string `json:"release"`
		ChangedRevision string `json:"changedRevision"`
		Entries         []struct{ Key, Value string }
	}
	jsonOf(t, must(t, ep, "config", "poll", "app/prod", "-o", "json"), &snap)
	if snap.Release != "1" || len(snap.Entries) != 1 || snap.Entries[0].Value != "v1" {
		t.Fatalf("config poll --after 0 = %+v, want release 1 with k=v1", snap)
	}
	code, out, errOut := ctl(t, ep, "", "config", "poll", "app/prod", "--after", snap.ChangedRevision, "--wait", "300ms")
	if code != 124 || out != "" || !strings.Contains(errOut, "no release after revision "+snap.ChangedRevision) {
		t.Fatalf("config poll with nothing new = %d %q %q, want 124, no output and a sentence saying so", code, out, errOut)
	}

	// A release while the poll waits ends it with that release.
	done := make(chan string, 1)
	go func() {
		_, out, errOut := ctl(t, ep, "", "config", "poll", "app/prod", "--after", snap.ChangedRevision, "--wait", "1m")
		done <- out + errOut
	}()
	must(t, ep, "config", "put", "app/prod", "k", "v2")
	select {
	case got := <-done:
		if !strings.Contains(got, "release 2") || !slices.Contains(strings.Fields(got), "v2") {
			t.Fatalf("config poll across a release printed %q, want release 2 with k=v2", got)
		}
	case <-time.After(wait.Bound(30 * time.Second)):
		t.Fatal("config poll did not answer within 30 s of a release")
	}
}

// config render: --once renders and exits; a render that fails says the
// file was kept and exits non-zero; without --once it follows releases
// and runs the command after each change.
func TestConfigRender(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	dir := t.TempDir()
	tmpl, out, ran := filepath.Join(dir, "app.tmpl"), filepath.Join(dir, "app.conf"), filepath.Join(dir, "ran")
	if err := os.WriteFile(tmpl, []byte(`port={{ key "web" "port" }}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, ep, "config", "put", "web", "port", "8080")
	if got := must(t, ep, "config", "render", "--template", tmpl, "--out", out, "--once", "--mode", "0640"); !strings.Contains(got, "rendered "+out+" (web release 1)") {
		t.Fatalf("render --once printed %q", got)
	}
	if b, _ := os.ReadFile(out); string(b) != "port=8080\n" {
		t.Fatalf("rendered %q", b)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o640 {
		t.Errorf("--mode 0640 gave %v", fi.Mode().Perm())
	}
	must(t, ep, "config", "delete", "web", "port")
	code, _, errOut := ctl(t, ep, "", "config", "render", "--template", tmpl, "--out", out, "--once")
	if code == 0 || !strings.Contains(errOut, `key "port" is not in namespace web`) || !strings.Contains(errOut, "kept as it was") {
		t.Fatalf("a failing render --once = %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(out); string(b) != "port=8080\n" {
		t.Fatalf("a failing render changed the file to %q", b)
	}
	if errOut := exits(t, exitUsage, ep, "config", "render", "--out", out); !strings.Contains(errOut, "--template and --out are both needed") {
		t.Errorf("render without --template: %q", errOut)
	}

	// Following: each release renders, the command runs after each change.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	var stdout, stderr strings.Builder
	wg.Go(func() {
		var o, e bytes.Buffer
		run(ctx, []string{"--endpoints", ep, "config", "render", "--template", tmpl, "--out", out, "--exec", "echo x >> " + ran, "--debounce", "10ms"}, strings.NewReader(""), &o, &e)
		stdout.WriteString(o.String())
		stderr.WriteString(e.String())
	})
	must(t, ep, "config", "put", "web", "port", "9090")
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	wait.Within(t, 10*time.Second, "the render of release 3", func() bool { return read(out) == "port=9090\n" && read(ran) == "x\n" })
	must(t, ep, "config", "put", "web", "port", "9191")
	wait.Within(t, 10*time.Second, "the render of release 4", func() bool { return read(out) == "port=9191\n" && read(ran) == "x\nx\n" })
	cancel()
	wg.Wait()
	// (The command of the last render may be cut by the stop: only the
	// render is certain to be reported.)
	if !strings.Contains(stdout.String(), "rendered "+out+" (web release 4)") {
		t.Errorf("render's output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// config export and import: every namespace with its schema to one file,
// a dry run that prints the diff and changes nothing, then an import that
// makes the other cluster's namespaces exactly the file's (a key only the
// target had is deleted, unless --merge), one release each.
func TestConfigExportImport(t *testing.T) {
	t.Parallel()
	src, dst := coorddtest.Start(t).GRPCAddr, coorddtest.Start(t).GRPCAddr
	dir := t.TempDir()
	file := filepath.Join(dir, "export.json")
	schema := filepath.Join(dir, "schema.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"port":{"type":"integer","maximum":65535}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, src, "config", "put", "shop/web", "port", "8080")
	must(t, src, "config", "put", "shop/web", "color", "blue")
	must(t, src, "config", "schema", "shop/web", "--set", schema)
	must(t, src, "config", "put", "shop/db", "url", "postgres://a")
	must(t, src, "config", "put", "other/x", "k", "v")
	must(t, src, "config", "export", "--prefix", "shop/", "--out", file)
	var exp struct {
		Format     string
		Revision   int64
		Namespaces []struct {
			Name    string
			Release int64
			Values  map[string]string
			Schema  string
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	jsonOf(t, string(b), &exp)
	if exp.Format != "coordd-config-export/1" || len(exp.Namespaces) != 2 || exp.Namespaces[0].Name != "shop/db" || exp.Namespaces[1].Name != "shop/web" ||
		exp.Namespaces[1].Values["port"] != "8080" || exp.Namespaces[1].Values["color"] != "blue" || !strings.Contains(exp.Namespaces[1].Schema, "65535") {
		t.Fatalf("export: %s", b)
	}

	// The target has a key the export lacks, and a value the export's
	// schema refuses (so the schema can only be set after the release).
	must(t, dst, "config", "put", "shop/web", "port", "none")
	must(t, dst, "config", "put", "shop/web", "legacy", "1")
	dry := must(t, dst, "config", "import", file, "--dry-run")
	for _, want := range []string{"shop/db: would change 1 keys", "+ url = postgres://a", "shop/web: would change 3 keys, and its schema", "~ port = 8080 (was none)", "+ color = blue", "- legacy (was 1)"} {
		if !strings.Contains(dry, want) {
			t.Errorf("dry run lacks %q:\n%s", want, dry)
		}
	}
	if got := must(t, dst, "config", "get", "shop/web", "port"); strings.TrimSpace(got) != "none" {
		t.Fatalf("a dry run changed port to %q", got)
	}
	if got := must(t, dst, "config", "import", file); !strings.Contains(got, "shop/web: release 3 at revision") || !strings.Contains(got, "shop/db: release 1") {
		t.Fatalf("import printed:\n%s", got)
	}
	var snap struct {
		Release string
		Entries []struct{ Key, Value string }
	}
	jsonOf(t, must(t, dst, "config", "snapshot", "shop/web", "-o", "json"), &snap)
	got := map[string]string{}
	for _, e := range snap.Entries {
		got[e.Key] = e.Value
	}
	if snap.Release != "3" || len(got) != 2 || got["port"] != "8080" || got["color"] != "blue" {
		t.Fatalf("shop/web after the import: release %s, %v; want release 3 with exactly the export's port=8080 color=blue", snap.Release, got)
	}
	if s := must(t, dst, "config", "schema", "shop/web"); !strings.Contains(s, "65535") {
		t.Errorf("the schema was not imported: %q", s)
	}
	// Imported again: nothing to do; with --merge a key of the target stays.
	if again := must(t, dst, "config", "import", file); !strings.Contains(again, "shop/web: unchanged") || !strings.Contains(again, "shop/db: unchanged") {
		t.Errorf("a second import:\n%s", again)
	}
	must(t, dst, "config", "put", "shop/db", "pool", "5")
	must(t, dst, "config", "import", file, "--merge", "--namespace", "shop/db")
	if got := must(t, dst, "config", "get", "shop/db", "pool"); strings.TrimSpace(got) != "5" {
		t.Errorf("--merge dropped a key of the target: %q", got)
	}
	if errOut := exits(t, exitUsage, dst, "config", "import", file, "--namespace", "nope"); !strings.Contains(errOut, "has no namespace nope") {
		t.Errorf("--namespace of a namespace not in the file: %q", errOut)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"format":"something-else","namespaces":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if errOut := exits(t, exitUsage, dst, "config", "import", bad); !strings.Contains(errOut, "not a coordd config export") {
		t.Errorf("import of a foreign file: %q", errOut)
	}
}

// An export with --history keeps who changed what and why: the import
// makes the releases again, with their authors and messages; importing the
// same file again makes no release; a refused import says only why.
func TestConfigExportImportKeepsHistory(t *testing.T) {
	t.Parallel()
	src, dst := coorddtest.Start(t).GRPCAddr, coorddtest.Start(t).GRPCAddr
	file := filepath.Join(t.TempDir(), "export.json")
	if code, out, errOut := ctl(t, src, `{"timeout": "5s", "retries": 3}`, "config", "publish", "shop/h", "-f", "-", "--author", "ana", "-m", "first cut"); code != 0 {
		t.Fatalf("publish: %s%s", out, errOut)
	}
	must(t, src, "config", "put", "shop/h", "retries", "5", "--author", "bo", "-m", "more retries")
	must(t, src, "config", "delete", "shop/h", "timeout", "--author", "cy", "-m", "the default is fine")
	must(t, src, "config", "export", "shop/h", "--out", file, "--history", "2")

	must(t, dst, "config", "put", "shop/h", "legacy", "1", "--author", "old")
	got := must(t, dst, "config", "import", file)
	if !strings.Contains(got, "shop/h: release 4 at revision") || !strings.Contains(got, "replayed 3 releases of its history") {
		t.Fatalf("import printed:\n%s", got)
	}
	var hist []struct {
		Number, Author, Message string
		Changes                 []struct{ Key, OldValue, NewValue string }
	}
	jsonOf(t, must(t, dst, "config", "history", "shop/h", "-o", "json"), &hist)
	if len(hist) != 4 {
		t.Fatalf("history after the import: %+v; want 4 releases", hist)
	}
	type rel struct{ number, author, message string }
	want := []rel{
		{"4", "cy", "the default is fine [release 3 of shop/h, "},
		{"3", "bo", "more retries [release 2 of shop/h, "},
		{"2", "", "imported from export.json [the content before release 2 of shop/h]"},
	}
	for i, w := range want {
		h := hist[i]
		if h.Number != w.number || (w.author != "" && h.Author != w.author) || !strings.HasPrefix(h.Message, w.message) {
			t.Errorf("release %s: by %q, %q; want release %s by %q, %q...", h.Number, h.Author, h.Message, w.number, w.author, w.message)
		}
	}
	if !strings.HasSuffix(hist[0].Message, "; imported from export.json]") {
		t.Errorf("a replayed release's message does not say where it came from: %q", hist[0].Message)
	}
	if v := must(t, dst, "config", "snapshot", "shop/h", "-o", "json"); !strings.Contains(v, `"retries"`) || strings.Contains(v, `"timeout"`) || strings.Contains(v, `"legacy"`) {
		t.Errorf("content after the import: %s", v)
	}

	if again := must(t, dst, "config", "import", file); !strings.Contains(again, "shop/h: unchanged") {
		t.Errorf("a second import:\n%s", again)
	}
	if h := must(t, dst, "config", "history", "shop/h", "-o", "json"); !strings.Contains(h, `"number": "4"`) || strings.Contains(h, `"number": "5"`) {
		t.Errorf("a second import made a release:\n%s", h)
	}

	// Refused by the server before any namespace was imported: stderr says
	// why, and stdout does not claim the file was empty.
	must(t, dst, "config", "approval", "shop/h", "--require")
	must(t, src, "config", "put", "shop/h", "retries", "6")
	must(t, src, "config", "export", "shop/h", "--out", file)
	code, out, errOut := ctl(t, dst, "", "config", "import", file)
	if code == 0 || out != "" || !strings.Contains(errOut, "approv") {
		t.Errorf("an import refused: exit %d, stdout %q, stderr %q; want a failure, nothing on stdout, the refusal on stderr", code, out, errOut)
	}
}

// verify: a healthy daemon passes (exit 0) with its figures; sabotaged it
// fails with exit 7 and names the violations.
func TestVerify(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	out := must(t, ep, "verify", "--duration", "1s")
	for _, want := range []string{"verify PASSED", "lock:", "election:", "refused by the fence", "no violation"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify's report lacks %q:\n%s", want, out)
		}
	}
	var rep struct {
		Passed bool
		Lock   struct{ Grants, LateWrites, LateRefused int }
	}
	jsonOf(t, must(t, ep, "verify", "--duration", "1s", "--candidates", "0", "-o", "json"), &rep)
	if !rep.Passed || rep.Lock.Grants == 0 || rep.Lock.LateRefused != rep.Lock.LateWrites {
		t.Errorf("verify -o json: %+v", rep)
	}
	code, out, errOut := ctl(t, ep, "", "verify", "--duration", "1s", "--sabotage", "unfenced")
	if code != exitViolation || !strings.Contains(out, "verify FAILED") || !strings.Contains(out, "violation:") || !strings.Contains(errOut, "violations") {
		t.Errorf("sabotaged verify = %d\n%s\n%s", code, out, errOut)
	}
	if errOut := exits(t, exitUsage, ep, "verify", "--sabotage", "other"); !strings.Contains(errOut, `the only mode is "unfenced"`) {
		t.Errorf("verify --sabotage other: %q", errOut)
	}
}

// lock acquire-all: one grant per lock, sorted by name; --wait running out
// behind a held lock exits 124 and leaves none of the set held.
func TestLockAcquireAll(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	session := func() string {
		var s struct{ ID string }
		jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
		return s.ID
	}
	s1, s2 := session(), session()
	out := must(t, ep, "lock", "acquire-all", "jobs/b", "jobs/a", "--session", s1)
	if !strings.Contains(out, "jobs/a") || strings.Index(out, "jobs/a") > strings.Index(out, "jobs/b") {
		t.Fatalf("acquire-all printed:\n%s", out)
	}
	code, _, errOut := ctl(t, ep, "", "lock", "acquire-all", "jobs/c", "jobs/b", "--session", s2, "--wait", "200ms")
	if code != exitTimeout {
		t.Fatalf("acquire-all behind a held lock = %d %s, want %d", code, errOut, exitTimeout)
	}
	if st := must(t, ep, "lock", "status", "jobs/c", "-o", "json"); strings.Contains(st, s2) {
		t.Errorf("the failed set left jobs/c with session %s: %s", s2, st)
	}
}

// barrier: enter (count 1 opens at once), status, leave; a wait that runs
// out exits 124 and takes the participant out.
func TestBarrierCommands(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
	if out := must(t, ep, "barrier", "enter", "batch/go", "--count", "1", "--session", s.ID); !strings.Contains(out, "batch/go is open (1 participants in)") {
		t.Errorf("barrier enter: %q", out)
	}
	if out := must(t, ep, "barrier", "status", "batch/go"); !strings.Contains(out, "batch/go is open, 1 participants in") || !strings.Contains(out, s.ID) {
		t.Errorf("barrier status:\n%s", out)
	}
	if out := must(t, ep, "barrier", "leave", "batch/go", "--session", s.ID); !strings.Contains(out, "everyone has left") {
		t.Errorf("barrier leave: %q", out)
	}
	exits(t, exitTimeout, ep, "barrier", "enter", "batch/two", "--count", "2", "--session", s.ID, "--wait", "200ms")
	// The server takes the participant out once it sees the call end.
	wait.Within(t, 10*time.Second, "the participant taken out", func() bool {
		return strings.Contains(must(t, ep, "barrier", "status", "batch/two"), "closed, 0 participants")
	})
	must(t, ep, "barrier", "open", "batch/two")
	if out := must(t, ep, "barrier", "enter", "batch/two", "--count", "2", "--session", s.ID); !strings.Contains(out, "is open") {
		t.Errorf("entering an opened barrier: %q", out)
	}
}

// lock history and elect history: every grant and its end, in a table
// that names the reason, and as REST's JSON; an empty one says so.
func TestHistoryCommands(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "--owner", "nightly", "-o", "json"), &s)
	var g struct{ Token string }
	jsonOf(t, must(t, ep, "lock", "acquire", "jobs/h", "--session", s.ID, "-o", "json"), &g)
	must(t, ep, "lock", "release", "jobs/h", g.Token, "--session", s.ID)
	var l struct{ Term string }
	jsonOf(t, must(t, ep, "elect", "campaign", "jobs/e", "host-1", "--session", s.ID, "-o", "json"), &l)
	must(t, ep, "session", "close", s.ID, "--owner")
	var evs []struct{ Type, Token, Owner, Reason string }
	wait.For(t, "the lock's grant and release in its history", func() bool {
		jsonOf(t, must(t, ep, "lock", "history", "jobs/h", "--since", "1h", "-o", "json"), &evs)
		return len(evs) == 2
	})
	if evs[0].Type != "HISTORY_EVENT_TYPE_GRANTED" || evs[0].Token != g.Token || evs[0].Owner != "nightly" || evs[1].Reason != "released" {
		t.Fatalf("lock history = %+v", evs)
	}
	if out := must(t, ep, "lock", "history", "jobs/h", "--newest-first", "--limit", "1"); !strings.Contains(out, "RELEASED") || strings.Contains(out, "GRANTED") {
		t.Fatalf("lock history --newest-first --limit 1:\n%s", out)
	}
	var out string
	wait.For(t, "the leadership's end", func() bool {
		out = must(t, ep, "elect", "history", "jobs/e")
		return strings.Contains(out, "SESSION_CLOSED")
	})
	if !strings.Contains(out, "ELECTED") || !strings.Contains(out, l.Term) || !strings.Contains(out, "session was closed") {
		t.Fatalf("elect history:\n%s", out)
	}
	if out := must(t, ep, "lock", "history", "nothing/here"); !strings.Contains(out, "no history of lock nothing/here") {
		t.Fatalf("an empty history printed %q", out)
	}
}

// Secrets from the shell: put --secret from stdin, read only with
// --reveal, (secret) in snapshots and history; exported sealed with a
// transfer key and imported into a cluster with other keys; rewrap-keys.
func TestConfigSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := func(name string) string {
		t.Helper()
		out, err := exec.Command(coorddtest.Build(t), "keygen", "--id", name).Output()
		if err != nil || !strings.HasPrefix(string(out), name+" ") {
			t.Fatalf("coordd keygen: %q, %v", out, err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	src := coorddtest.Start(t, "--secret-key-file", keyFile("src")).GRPCAddr
	dst := coorddtest.Start(t, "--secret-key-file", keyFile("dst")).GRPCAddr
	const secret = "pa55-W0rd-never-in-clear"
	if code, out, errOut := ctl(t, src, secret, "config", "put", "shop/db", "password", "-", "--secret"); code != 0 || !strings.Contains(out, "+ password = (secret)") || strings.Contains(out+errOut, secret) {
		t.Fatalf("put --secret: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := ctl(t, src, `{"host":"db1","user":"app","token":"tok-`+secret+`"}`, "config", "publish", "shop/db", "-f", "-", "--secret", "token"); code != 0 ||
		!strings.Contains(out, "+ token = (secret)") || !strings.Contains(out, "+ user = app") || strings.Contains(out+errOut, secret) {
		t.Fatalf("publish --secret: %d %q %q", code, out, errOut)
	}
	if errOut := exits(t, exitUsage, src, "config", "get", "shop/db", "password"); !strings.Contains(errOut, "--reveal") {
		t.Fatalf("get of a secret without --reveal: %q", errOut)
	}
	if got := must(t, src, "config", "get", "shop/db", "password", "--reveal"); strings.TrimSpace(got) != secret {
		t.Fatalf("get --reveal = %q", got)
	}
	for _, args := range [][]string{{"snapshot", "shop/db"}, {"history", "shop/db", "-o", "json"}, {"diff", "shop/db", "0", "2"}} {
		out := must(t, src, append([]string{"config"}, args...)...)
		if (!strings.Contains(out, "(secret)") && !strings.Contains(out, `"secret": true`)) || strings.Contains(out, secret) {
			t.Errorf("config %v:\n%s", args, out)
		}
	}

	if errOut := exits(t, exitUsage, src, "config", "get", "shop/db", "token"); !strings.Contains(errOut, "--reveal") {
		t.Fatalf("the published secret: %q", errOut)
	}
	// Export: without a transfer key the secret is only named; with one
	// it is sealed.
	plain, sealed := filepath.Join(dir, "plain.json"), filepath.Join(dir, "sealed.json")
	must(t, src, "config", "export", "shop/db", "--out", plain)
	must(t, src, "config", "export", "shop/db", "--out", sealed, "--secrets-key", keyFile("transfer"), "--history", "5")
	for file, want := range map[string]string{plain: `"hidden_secrets"`, sealed: `"secrets_key": "transfer"`} {
		b, _ := os.ReadFile(file)
		if strings.Contains(string(b), secret) || !strings.Contains(string(b), want) {
			t.Fatalf("%s:\n%s", file, b)
		}
	}
	if errOut := exits(t, exitUsage, dst, "config", "import", sealed); !strings.Contains(errOut, "--secrets-key") {
		t.Fatalf("import of secrets without the key: %q", errOut)
	}
	dry := must(t, dst, "config", "import", sealed, "--secrets-key", filepath.Join(dir, "transfer"), "--dry-run")
	if !strings.Contains(dry, "+ password = (secret)") || strings.Contains(dry, secret) {
		t.Fatalf("dry run:\n%s", dry)
	}
	if out := must(t, dst, "config", "import", sealed, "--secrets-key", filepath.Join(dir, "transfer")); !strings.Contains(out, "replayed 1 release of its history") {
		t.Fatalf("import with history:\n%s", out)
	}
	if got := must(t, dst, "config", "get", "shop/db", "password", "--reveal"); strings.TrimSpace(got) != secret {
		t.Fatalf("the imported secret = %q", got)
	}
	// The history's releases (the secrets' values are not in it) came
	// first, then one release set the secrets; again, nothing changes.
	if h := must(t, dst, "config", "history", "shop/db", "-o", "json"); !strings.Contains(h, `"number": "2"`) || strings.Contains(h, `"number": "3"`) || strings.Contains(h, secret) {
		t.Errorf("history after an import with secrets:\n%s", h)
	}
	if out := must(t, dst, "config", "import", sealed, "--secrets-key", filepath.Join(dir, "transfer")); !strings.Contains(out, "shop/db: unchanged") {
		t.Fatalf("a second import of the sealed export:\n%s", out)
	}
	// An import without the secrets keeps the target's.
	if out := must(t, dst, "config", "import", plain); !strings.Contains(out, "shop/db: unchanged") {
		t.Fatalf("import of the plain export:\n%s", out)
	}
	if got := must(t, dst, "config", "rewrap-keys"); !strings.Contains(got, "rewrapped 0 data keys with key dst") || !regexp.MustCompile(`dst +wraps 1 data keys`).MatchString(got) {
		t.Fatalf("rewrap-keys:\n%s", got)
	}
}

// Approval from the shell, on a daemon without authentication, where the
// author names who proposes and approves: a required namespace refuses
// a put (exit 6), a proposal waits, its proposer cannot approve it (exit
// 6), another author can.
func TestConfigApproval(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	must(t, ep, "config", "put", "shop/prod", "limit", "10")
	if out := must(t, ep, "config", "approval", "shop/prod", "--require", "--ttl", "2h"); !strings.Contains(out, "proposals expire after 2h0m0s") {
		t.Fatalf("approval --require: %q", out)
	}
	if errOut := exits(t, exitDenied, ep, "config", "put", "shop/prod", "limit", "20"); !strings.Contains(errOut, "approved proposals") {
		t.Fatalf("a put in a gated namespace: %q", errOut)
	}
	code, out, errOut := ctl(t, ep, `{"limit": 20, "burst": 5}`, "config", "propose", "shop/prod", "-f", "-", "--author", "ann", "-m", "raise it")
	if code != 0 || !strings.Contains(out, "shop/prod proposal 1: PENDING, by ann, on release 1") || !strings.Contains(out, "~ limit = 20 (was 10)") || !strings.Contains(out, "+ burst = 5") {
		t.Fatalf("propose: %d %q %q", code, out, errOut)
	}
	if errOut := exits(t, exitDenied, ep, "config", "approve", "shop/prod", "1", "--author", "ann"); !strings.Contains(errOut, "four eyes") {
		t.Fatalf("self-approval: %q", errOut)
	}
	if out := must(t, ep, "config", "proposals", "shop/prod"); !strings.Contains(out, "PENDING") || !strings.Contains(out, "raise it") {
		t.Fatalf("proposals:\n%s", out)
	}
	if out := must(t, ep, "config", "approve", "shop/prod", "1", "--author", "bo", "-m", "ok"); !strings.Contains(out, "shop/prod release 2 at revision") {
		t.Fatalf("approve:\n%s", out)
	}
	var rels []struct{ ProposedBy, ApprovedBy, Proposal string }
	jsonOf(t, must(t, ep, "config", "history", "shop/prod", "-o", "json"), &rels)
	if len(rels) != 2 || rels[0].ProposedBy != "ann" || rels[0].ApprovedBy != "bo" || rels[0].Proposal != "1" {
		t.Fatalf("history: %+v", rels)
	}
	if out := must(t, ep, "config", "proposal", "shop/prod", "1"); !strings.Contains(out, "APPROVED by bo") || !strings.Contains(out, "made release 2") {
		t.Fatalf("proposal 1:\n%s", out)
	}
	exits(t, exitConflict, ep, "config", "approve", "shop/prod", "1", "--author", "cy")
	exits(t, exitNotFound, ep, "config", "proposal", "shop/prod", "9")
	must(t, ep, "config", "propose", "shop/prod", "--rollback-to", "1", "--author", "ann")
	if out := must(t, ep, "config", "withdraw", "shop/prod", "2", "--author", "ann"); !strings.Contains(out, "WITHDRAWN") {
		t.Fatalf("withdraw:\n%s", out)
	}
	// The policy travels in an export.
	exp := filepath.Join(t.TempDir(), "exp.json")
	must(t, ep, "config", "export", "shop/prod", "--out", exp)
	if b, _ := os.ReadFile(exp); !strings.Contains(string(b), `"approval": {`) || !strings.Contains(string(b), `"proposal_ttl": "2h0m0s"`) {
		t.Fatalf("the export lacks the approval policy:\n%s", b)
	}
	// Turning it off takes two: the first one's --off waits for a second.
	if out := must(t, ep, "config", "approval", "shop/prod", "--off", "--author", "ana"); !strings.Contains(out, "ana asked to turn approval off") {
		t.Fatalf("a first approval --off: %q", out)
	}
	if code, _, _ := ctl(t, ep, "", "config", "approval", "shop/prod", "--off", "--author", "ana"); code == 0 {
		t.Fatal("the same admin's second --off succeeded")
	}
	if out := must(t, ep, "config", "approval", "shop/prod", "--off", "--author", "bo"); !strings.Contains(out, "no approval required") {
		t.Fatalf("a second admin's approval --off: %q", out)
	}
	if out := must(t, ep, "config", "import", exp); !strings.Contains(out, "approval policy") {
		t.Fatalf("import of the policy:\n%s", out)
	}
	if out := must(t, ep, "config", "approval", "shop/prod"); !strings.Contains(out, "expire after 2h0m0s") {
		t.Fatalf("after the import: %q", out)
	}
	must(t, ep, "config", "approval", "shop/prod", "--off", "--author", "ana")
	must(t, ep, "config", "approval", "shop/prod", "--off", "--author", "bo")
	must(t, ep, "config", "put", "shop/prod", "limit", "30")
}

// Shared namespaces from the shell: inherit, a shared release reaching
// the heir as one release, where each value comes from, and --off.
func TestConfigInherit(t *testing.T) {
	t.Parallel()
	ep := coorddtest.Start(t).GRPCAddr
	must(t, ep, "config", "put", "common/db", "host", "db1")
	must(t, ep, "config", "put", "web/prod", "host", "db-web")
	must(t, ep, "config", "put", "common/db", "pool", "10")
	if out := must(t, ep, "config", "inherit", "web/prod", "common/db"); !strings.Contains(out, "+ pool = 10") || !strings.Contains(out, "(with common/db release 2)") {
		t.Fatalf("inherit:\n%s", out)
	}
	must(t, ep, "config", "put", "common/db", "pool", "20")
	snap := must(t, ep, "config", "snapshot", "web/prod")
	if !strings.Contains(snap, "# inherits from common/db") || !regexp.MustCompile(`pool +20 +\(from common/db\)`).MatchString(snap) || !regexp.MustCompile(`host +db-web\n`).MatchString(snap) {
		t.Fatalf("snapshot:\n%s", snap)
	}
	var rels []struct{ InheritedFrom, InheritedRelease, Number string }
	jsonOf(t, must(t, ep, "config", "history", "web/prod", "-o", "json"), &rels)
	if len(rels) != 3 || rels[0].InheritedFrom != "common/db" || rels[0].InheritedRelease != "3" || rels[0].Number != "3" {
		t.Fatalf("history: %+v", rels)
	}
	// An export keeps the heir's own keys and what it inherits; imported
	// into another cluster, the heir inherits there too.
	exp := filepath.Join(t.TempDir(), "exp.json")
	must(t, ep, "config", "export", "web/prod", "common/db", "--out", exp)
	if b, _ := os.ReadFile(exp); !strings.Contains(string(b), `"inherits": "common/db"`) {
		t.Fatalf("the export:\n%s", b)
	}
	other := coorddtest.Start(t).GRPCAddr
	if out := must(t, other, "config", "import", exp); !strings.Contains(out, "what it inherits") {
		t.Fatalf("import:\n%s", out)
	}
	if snap := must(t, other, "config", "snapshot", "web/prod"); !regexp.MustCompile(`pool +20 +\(from common/db\)`).MatchString(snap) || !regexp.MustCompile(`host +db-web\n`).MatchString(snap) {
		t.Fatalf("the imported heir:\n%s", snap)
	}
	if out := must(t, other, "config", "import", exp); !strings.Contains(out, "web/prod: unchanged") {
		t.Fatalf("a second import:\n%s", out)
	}
	if errOut := exits(t, exitUsage, ep, "config", "inherit", "web/prod"); !strings.Contains(errOut, "--off") {
		t.Fatalf("inherit without SHARED: %q", errOut)
	}
	if out := must(t, ep, "config", "inherit", "web/prod", "--off"); !strings.Contains(out, "- pool (was 20)") {
		t.Fatalf("inherit --off:\n%s", out)
	}
}
