package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/internal/shared/testkit/tcpproxy"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
)

// ctl runs coordctl in-process against endpoint and returns its exit code
// and output.
func ctl(t *testing.T, endpoint, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), append([]string{"--endpoints", endpoint}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// must runs coordctl and fails the test unless it exits 0.
func must(t *testing.T, endpoint string, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, endpoint, "", args...)
	if code != 0 {
		t.Fatalf("coordctl %v = %d\n%s%s", args, code, out, errOut)
	}
	return out
}

// exits checks an exit code.
func exits(t *testing.T, want int, endpoint string, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, endpoint, "", args...)
	if code != want {
		t.Fatalf("coordctl %v = %d, want %d\n%s%s", args, code, want, out, errOut)
	}
	return errOut
}

func jsonOf(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("output %q is not JSON: %v", s, err)
	}
}

func TestSessionCommands(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	var s struct{ ID, TTL, Owner string }
	jsonOf(t, must(t, ep, "session", "create", "--ttl", "20s", "--owner", "ops", "--label", "team=core", "-o", "json"), &s)
	if s.ID == "" || s.TTL != "20s" || s.Owner != "ops" {
		t.Fatalf("session create = %+v", s)
	}
	if out := must(t, ep, "session", "list"); !strings.Contains(out, s.ID) || !strings.Contains(out, "team=core") {
		t.Fatalf("session list:\n%s", out)
	}
	if out := must(t, ep, "session", "get", s.ID); !strings.Contains(out, "REMAINING") {
		t.Fatalf("session get:\n%s", out)
	}
	if out := must(t, ep, "session", "keepalive", s.ID); !strings.Contains(out, "renewed for 20s") {
		t.Fatalf("session keepalive: %s", out)
	}
	must(t, ep, "session", "close", s.ID)
	exits(t, exitNotFound, ep, "session", "get", s.ID)
	exits(t, exitUsage, ep, "session", "create", "--label", "novalue")
}

func TestLockCommands(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
	var g struct{ Name, Token string }
	jsonOf(t, must(t, ep, "lock", "acquire", "jobs/nightly", "--session", s.ID, "--metadata", "from a shell", "-o", "json"), &g)
	if g.Token == "" {
		t.Fatalf("acquire: %+v", g)
	}
	var s2 struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s2)
	exits(t, exitConflict, ep, "lock", "acquire", "jobs/nightly", "--session", s2.ID, "--try")
	exits(t, exitTimeout, ep, "lock", "acquire", "jobs/nightly", "--session", s2.ID, "--wait", "200ms")
	if out := must(t, ep, "lock", "status", "jobs/nightly"); !strings.Contains(out, "holder") || !strings.Contains(out, g.Token) || !strings.Contains(out, "from a shell") {
		t.Fatalf("lock status:\n%s", out)
	}
	var st struct {
		Holders []struct {
			Token     string `json:"token"`
			SessionID string `json:"sessionId"`
		} `json:"holders"`
	}
	jsonOf(t, must(t, ep, "lock", "status", "jobs/nightly", "-o", "json"), &st)
	if len(st.Holders) != 1 || st.Holders[0].Token != g.Token || st.Holders[0].SessionID != s.ID {
		t.Fatalf("lock status -o json = %+v", st)
	}
	if out := must(t, ep, "lock", "list", "jobs/"); strings.TrimSpace(out) != "jobs/nightly" {
		t.Fatalf("lock list: %q", out)
	}
	must(t, ep, "lock", "validate", "jobs/nightly", g.Token)
	// From outside, with nobody to answer (the acquiring process is gone):
	// it ends at the bound, and says so.
	if out := must(t, ep, "lock", "release", "jobs/nightly", g.Token, "--within", "100ms"); !strings.Contains(out, "did not answer") {
		t.Fatalf("lock release from outside: %q", out)
	}
	exits(t, exitConflict, ep, "lock", "validate", "jobs/nightly", g.Token)
	exits(t, exitConflict, ep, "lock", "release", "jobs/nightly", g.Token, "--session", s.ID)
	exits(t, exitUsage, ep, "lock", "release", "jobs/nightly", "zero")
	exits(t, exitUsage, ep, "lock", "acquire", "x")
}

func TestLockRunPassesTheTokenAndTheExitCode(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	out := filepath.Join(t.TempDir(), "env")
	code, stdout, stderr := ctl(t, d.GRPCAddr, "", "lock", "run", "deploy", "--ttl", "5s", "--",
		"sh", "-c", `echo "$COORDD_LOCK_NAME $COORDD_LOCK_TOKEN $COORDD_SESSION $COORDD_DEADLINE" > `+out+`; exit 7`)
	if code != 7 {
		t.Fatalf("lock run = %d, want the command's 7\n%s%s", code, stdout, stderr)
	}
	data, err := os.ReadFile(out)
	f := strings.Fields(string(data))
	if err != nil || len(f) != 4 || f[0] != "deploy" || f[1] == "" || f[2] == "" {
		t.Fatalf("the command's environment: %q, %v", data, err)
	}
	if _, err := time.Parse(time.RFC3339Nano, f[3]); err != nil {
		t.Fatalf("COORDD_DEADLINE %q: %v", f[3], err)
	}
	// Released after the command: the lock is free again.
	must(t, d.GRPCAddr, "lock", "run", "deploy", "--wait", "2s", "--", "true")
	if code, _, _ := ctl(t, d.GRPCAddr, "", "lock", "run", "deploy", "--", "/no/such/command"); code != 127 {
		t.Fatalf("lock run of a missing command = %d, want 127", code)
	}
}

// TestLockRunStopsTheCommandWhenTheLockIsLost cuts coordctl off from
// coordd while its command runs. The command ignores SIGTERM, so only the
// SIGKILL before the session's local deadline stops it; it must be dead
// before anyone else is granted the lock, and coordctl exits 125.
func TestLockRunStopsTheCommandWhenTheLockIsLost(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	proxy := tcpproxy.Start(t, d.GRPCAddr)
	dir := t.TempDir()
	beats, marks := filepath.Join(dir, "beats"), filepath.Join(dir, "marks")
	script := fmt.Sprintf(`trap 'echo term >> %s' TERM; while true; do date +%%s%%N >> %s; sleep 0.02; done`, marks, beats)
	done := make(chan int, 1)
	go func() {
		code, _, _ := ctl(t, proxy.Addr(), "", "lock", "run", "db-migration", "--ttl", "3s", "--", "sh", "-c", script)
		done <- code
	}()
	wait.Within(t, 15*time.Second, "the command to run", func() bool { data, _ := os.ReadFile(beats); return len(data) > 0 })

	c, err := clientlib.New(t.Context(), clientlib.Config{Endpoints: []string{d.GRPCAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	other, err := c.NewSession(t.Context(), clientlib.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	l, err := other.Lock(t.Context(), "db-migration")
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	var code int
	select {
	case code = <-done:
	case <-time.After(wait.Bound(15 * time.Second)):
		t.Fatal("lock run did not return")
	}
	proxy.Thaw()
	if code != exitLost {
		t.Fatalf("lock run = %d, want %d", code, exitLost)
	}
	data, _ := os.ReadFile(beats)
	lines := strings.Fields(string(data))
	last, _ := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if lastBeat := time.Unix(0, last); !lastBeat.Before(granted) {
		t.Fatalf("the command still ran %s after the lock was granted to another", lastBeat.Sub(granted))
	} else {
		t.Logf("the command's last beat was %s before the next grant", granted.Sub(lastBeat).Round(time.Millisecond))
	}
	if m, _ := os.ReadFile(marks); !strings.Contains(string(m), "term") {
		t.Fatal("the command got no SIGTERM before the SIGKILL")
	}
}

func TestElectCommands(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	var s struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s)
	var camp struct{ Term string }
	jsonOf(t, must(t, ep, "elect", "campaign", "scheduler", "host-1", "--session", s.ID, "-o", "json"), &camp)
	if out := must(t, ep, "elect", "leader", "scheduler"); !strings.Contains(out, "host-1") || !strings.Contains(out, camp.Term) {
		t.Fatalf("elect leader:\n%s", out)
	}
	must(t, ep, "elect", "proclaim", "scheduler", camp.Term, "host-1b")
	var ev struct {
		Type   string `json:"type"`
		Leader struct {
			Value string `json:"value"`
			Term  string `json:"term"`
		} `json:"leader"`
	}
	jsonOf(t, must(t, ep, "elect", "observe", "scheduler", "--count", "1", "-o", "json"), &ev)
	if ev.Type != "ELECTED" || ev.Leader.Value != "host-1b" || ev.Leader.Term != camp.Term {
		t.Fatalf("elect observe = %+v", ev)
	}
	must(t, ep, "lock", "validate", "--election", "scheduler", camp.Term)

	// A candidate of higher priority asks the leader to step down, and
	// the leader hands the seat over to it: a new term, one commit.
	var s2 struct{ ID string }
	jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s2)
	next := make(chan string, 1)
	go func() {
		_, out, _ := ctl(t, ep, "", "elect", "campaign", "scheduler", "host-2", "--session", s2.ID, "--priority", "5", "--preempt", "-o", "json")
		next <- out
	}()
	wait.Within(t, 15*time.Second, "host-2 to wait", func() bool {
		_, out, _ := ctl(t, ep, "", "elect", "candidates", "scheduler")
		return strings.Contains(out, "host-2")
	})
	type event struct {
		Type string `json:"type"`
		By   struct {
			SessionID string `json:"sessionId"`
			Priority  int32  `json:"priority"`
		} `json:"by"`
	}
	var asked []event
	for _, line := range strings.Split(strings.TrimSpace(must(t, ep, "elect", "observe", "scheduler", "--count", "2", "-o", "json")), "\n") {
		var ev event
		jsonOf(t, line, &ev)
		asked = append(asked, ev)
	}
	if len(asked) != 2 || asked[1].Type != "PREEMPT_REQUESTED" || asked[1].By.SessionID != s2.ID || asked[1].By.Priority != 5 {
		t.Fatalf("elect observe = %+v, want the request by %s", asked, s2.ID)
	}
	exits(t, exitNotFound, ep, "elect", "transfer", "scheduler", camp.Term, "00000000000000ff")
	var handed struct{ Term string }
	jsonOf(t, must(t, ep, "elect", "transfer", "scheduler", camp.Term, s2.ID, "-o", "json"), &handed)
	var won struct{ Term string }
	jsonOf(t, <-next, &won)
	if handed.Term == "" || won.Term != handed.Term {
		t.Fatalf("elect transfer printed term %q, host-2's campaign %q", handed.Term, won.Term)
	}
	exits(t, exitConflict, ep, "elect", "transfer", "scheduler", camp.Term, s2.ID)
	exits(t, exitConflict, ep, "elect", "resign", "scheduler", camp.Term)
	must(t, ep, "elect", "resign", "scheduler", handed.Term, "--session", s2.ID) // the leader's own
	exits(t, exitNotFound, ep, "elect", "leader", "scheduler")

	// elect run: one leads, the other stands by until the first's command
	// ends; each command's code comes back.
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	order := filepath.Join(dir, "order")
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`echo "%d $COORDD_TERM" >> %s; while [ ! -e %s ]; do sleep 0.02; done; exit %d`, i, order, release, 10+i)
			codes[i], _, _ = ctl(t, ep, "", "elect", "run", "worker", "--ttl", "5s", "--", "sh", "-c", script)
		}()
		wait.Within(t, 15*time.Second, "the first command to start", func() bool { data, _ := os.ReadFile(order); return len(data) > 0 })
	}
	wait.Within(t, 15*time.Second, "a standby candidate", func() bool {
		_, out, _ := ctl(t, ep, "", "elect", "leader", "worker")
		return strings.Count(out, "candidate") == 1
	})
	if data, _ := os.ReadFile(order); strings.Count(string(data), "\n") != 1 {
		t.Fatalf("two commands ran at once: %q", data)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	data, _ := os.ReadFile(order)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 || codes[0] != 10 || codes[1] != 11 {
		t.Fatalf("elect run: order %q, codes %v", data, codes)
	}
	t1, _ := strconv.Atoi(strings.Fields(lines[0])[1])
	t2, _ := strconv.Atoi(strings.Fields(lines[1])[1])
	if t2 <= t1 {
		t.Fatalf("terms %d then %d: not increasing", t1, t2)
	}
}

func TestConfigCommands(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	code, out, errOut := ctl(t, ep, `{"port": 8080, "name": "web", "gone": null}`, "config", "publish", "svc/prod", "-f", "-", "-m", "first", "--author", "ana")
	if code != 0 || !strings.Contains(out, "release 1") || !strings.Contains(out, "+ name = web\n") {
		t.Fatalf("publish = %d\n%s%s", code, out, errOut)
	}
	if out := must(t, ep, "config", "get", "svc/prod", "port"); strings.TrimSpace(out) != "8080" {
		t.Fatalf("get: %q", out)
	}
	must(t, ep, "config", "put", "svc/prod", "port", "9090")
	exits(t, exitNotFound, ep, "config", "delete", "svc/prod", "nope")
	must(t, ep, "config", "delete", "svc/prod", "name")
	var snap struct {
		Release string `json:"release"`
		Entries []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"entries"`
	}
	jsonOf(t, must(t, ep, "config", "snapshot", "svc/prod", "-o", "json"), &snap)
	if snap.Release != "3" || len(snap.Entries) != 1 || snap.Entries[0].Key != "port" || snap.Entries[0].Value != "9090" {
		t.Fatalf("snapshot = %+v", snap)
	}
	if out := must(t, ep, "config", "history", "svc/prod"); !strings.Contains(out, "first") || strings.Count(out, "\n") != 4 {
		t.Fatalf("history:\n%s", out)
	}
	if out := must(t, ep, "config", "diff", "svc/prod", "1", "3"); !strings.Contains(out, "~ port = 9090 (was 8080)") || !strings.Contains(out, "- name (was web)") {
		t.Fatalf("diff:\n%s", out)
	}
	must(t, ep, "config", "rollback", "svc/prod", "1")
	if out := must(t, ep, "config", "get", "svc/prod", "name"); strings.TrimSpace(out) != "web" {
		t.Fatalf("after rollback: %q", out)
	}
	exits(t, exitConflict, ep, "config", "put", "svc/prod", "port", "1", "--expect", "1")
	schema := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"port":{"type":"integer"},"name":{"type":"string"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, ep, "config", "schema", "svc/prod", "--set", schema)
	if out := must(t, ep, "config", "schema", "svc/prod"); !strings.Contains(out, `"integer"`) {
		t.Fatalf("schema: %s", out)
	}
	code, _, errOut = ctl(t, ep, `{"port": "x", "name": 7}`, "config", "publish", "svc/prod", "-f", "-")
	if code != exitError || !strings.Contains(errOut, "port:") || !strings.Contains(errOut, "name:") {
		t.Fatalf("publish against the schema = %d: %s", code, errOut)
	}
	if out := must(t, ep, "config", "watch", "svc/prod", "--count", "1"); !strings.Contains(out, "SNAPSHOT svc/prod@4") {
		t.Fatalf("watch: %s", out)
	}
	if out := must(t, ep, "config", "namespaces"); strings.TrimSpace(out) != "svc/prod" {
		t.Fatalf("namespaces: %q", out)
	}
	must(t, ep, "config", "status", "svc/prod")
}

func TestClusterCommands(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	var st struct {
		ClusterID string `json:"clusterId"`
		LeaderID  string `json:"leaderId"`
		Members   []struct {
			Name     string `json:"name"`
			IsLeader bool   `json:"isLeader"`
		} `json:"members"`
		Revision string `json:"revision"`
	}
	jsonOf(t, must(t, d.GRPCAddr, "cluster", "status", "-o", "json"), &st)
	if st.ClusterID == "" || st.LeaderID == "" || len(st.Members) != 1 || !st.Members[0].IsLeader || st.Revision == "" {
		t.Fatalf("cluster status = %+v", st)
	}
	if out := must(t, d.GRPCAddr, "cluster", "alarms"); !strings.Contains(out, "no alarm is active") {
		t.Errorf("cluster alarms = %q", out)
	}
	if out := must(t, d.GRPCAddr, "cluster", "defrag"); !strings.Contains(out, st.Members[0].Name) {
		t.Errorf("cluster defrag = %q, want the member %s", out, st.Members[0].Name)
	}
	if out := exits(t, exitUsage, d.GRPCAddr, "cluster", "defrag", "--member", "nope"); !strings.Contains(out, `--member "nope" is none of the members at --endpoints (`+st.Members[0].Name+")") {
		t.Errorf("cluster defrag --member nope = %q", out)
	}
	file := filepath.Join(t.TempDir(), "backup.db")
	must(t, d.GRPCAddr, "snapshot", "save", file)
	if fi, err := os.Stat(file); err != nil || fi.Size() == 0 {
		t.Fatalf("backup: %v, %v", fi, err)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	exits(t, exitUsage, d.GRPCAddr, "no-such-command")
	exits(t, exitUsage, d.GRPCAddr, "-o", "yaml", "session", "list")
	exits(t, exitNotFound, d.GRPCAddr, "config", "get", "ns", "missing")
	exits(t, exitUnavailable, "127.0.0.1:1", "--timeout", "300ms", "session", "list")
}

// elect run --again: a term resigned from elsewhere stops the command
// (the holder is told at once), and coordctl campaigns again and reruns it
// with a greater term instead of exiting 125.
func TestElectRunAgainAfterALoss(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	dir := t.TempDir()
	terms, release := filepath.Join(dir, "terms"), filepath.Join(dir, "release")
	script := fmt.Sprintf(`echo "$COORDD_TERM" >> %s; while [ ! -e %s ]; do sleep 0.02; done`, terms, release)
	done := make(chan int, 1)
	go func() {
		code, _, _ := ctl(t, ep, "", "elect", "run", "again", "--again", "--ttl", "30s", "--", "sh", "-c", script)
		done <- code
	}()
	termsSeen := func() []string {
		data, _ := os.ReadFile(terms)
		return strings.Fields(string(data))
	}
	wait.Within(t, 15*time.Second, "the first term's command", func() bool { return len(termsSeen()) == 1 })
	first := termsSeen()[0]
	must(t, ep, "elect", "resign", "again", first)
	// The session lives 30s: only the server's report of the resignation
	// ends the first run this soon.
	wait.Within(t, 10*time.Second, "the command to run again", func() bool { return len(termsSeen()) == 2 })
	t1, _ := strconv.Atoi(first)
	t2, _ := strconv.Atoi(termsSeen()[1])
	if t2 <= t1 {
		t.Fatalf("terms %d then %d: not increasing", t1, t2)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("elect run --again = %d, want the command's 0", code)
		}
	case <-time.After(wait.Bound(15 * time.Second)):
		t.Fatal("elect run --again did not return after its command exited")
	}
}

// elect run --yield: a candidate of higher priority that asks gets the
// leadership. The command is stopped, coordctl resigns and exits 125, and
// the asker's campaign answers with the next term. Without --yield the
// request is only recorded: the command runs on.
func TestElectRunYieldsWhenAsked(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	ep := d.GRPCAddr
	for _, yield := range []bool{true, false} {
		t.Run(fmt.Sprint("yield=", yield), func(t *testing.T) {
			name := fmt.Sprint("yielding-", yield)
			dir := t.TempDir()
			started, stopped, release := filepath.Join(dir, "started"), filepath.Join(dir, "stopped"), filepath.Join(dir, "release")
			script := fmt.Sprintf(`trap 'touch %s; exit 0' TERM; echo "$COORDD_TERM" > %s; while [ ! -e %s ]; do sleep 0.02; done`, stopped, started, release)
			args := []string{"elect", "run", name, "--ttl", "30s"}
			if yield {
				args = append(args, "--yield")
			}
			done := make(chan [2]string, 1)
			go func() {
				code, _, stderr := ctl(t, ep, "", append(args, "--", "sh", "-c", script)...)
				done <- [2]string{fmt.Sprint(code), stderr}
			}()
			wait.Within(t, 15*time.Second, "the leader's command", func() bool {
				b, _ := os.ReadFile(started)
				return len(strings.TrimSpace(string(b))) > 0
			})
			b, _ := os.ReadFile(started)
			first, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			var s2 struct{ ID string }
			jsonOf(t, must(t, ep, "session", "create", "-o", "json"), &s2)
			if !yield {
				// The asker waits: the leader does not step down.
				code, _, _ := ctl(t, ep, "", "elect", "campaign", name, "asker", "--session", s2.ID, "--priority", "5", "--preempt", "--wait", "3s")
				if code != 124 {
					t.Fatalf("the asker's campaign = exit %d, want 124 (it waited 3 s)", code)
				}
				if _, err := os.Stat(stopped); err == nil {
					t.Fatal("the command was stopped without --yield")
				}
				select {
				case r := <-done:
					t.Fatalf("elect run returned (%v) without --yield", r)
				default:
				}
				if err := os.WriteFile(release, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				select {
				case r := <-done:
					if r[0] != "0" {
						t.Fatalf("elect run = exit %s (%q) after its command finished, want 0", r[0], r[1])
					}
				case <-time.After(wait.Bound(15 * time.Second)):
					t.Fatal("elect run did not return after its command exited")
				}
				return
			}
			var camp struct{ Term string }
			jsonOf(t, must(t, ep, "elect", "campaign", name, "asker", "--session", s2.ID, "--priority", "5", "--preempt", "--wait", "20s", "-o", "json"), &camp)
			next, _ := strconv.Atoi(camp.Term)
			if next <= first {
				t.Fatalf("the asker's term %d is not after the yielding leader's %d", next, first)
			}
			select {
			case r := <-done:
				if r[0] != "125" || !strings.Contains(r[1], "asked it to step down") || !strings.Contains(r[1], "priority 5") {
					t.Fatalf("elect run --yield = exit %s, %q; want 125 saying who asked", r[0], r[1])
				}
			case <-time.After(wait.Bound(15 * time.Second)):
				t.Fatal("elect run --yield did not return after stepping down")
			}
			if _, err := os.Stat(stopped); err != nil {
				t.Fatal("the command was not sent SIGTERM")
			}
		})
	}
}
