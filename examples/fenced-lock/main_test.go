package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/freeport"
	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
)

// lines collects a process's output lines.
type lines struct {
	mu  sync.Mutex
	all []string
	eof chan struct{} // closed once every line is in all
}

func (l *lines) follow(cmd *exec.Cmd) {
	out, _ := cmd.StdoutPipe()
	l.eof = make(chan struct{})
	go func() {
		defer close(l.eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, sc.Text())
			l.mu.Unlock()
		}
	}()
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.all {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// exit waits for cmd, whose output l follows, to exit, having read all it
// wrote first: exec's Wait closes the pipe, and lines not yet read then
// are lost.
func (l *lines) exit(cmd *exec.Cmd) error {
	<-l.eof
	return cmd.Wait()
}

// build compiles the example into a temp dir.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fenced-lock")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// start runs the example with args, following its output, and kills it
// when the test ends.
func start(t *testing.T, bin string, args ...string) (*exec.Cmd, *lines) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	var l lines
	l.follow(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed and reaped unless the test already waited for it to exit.
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &l
}

type status struct {
	Value, Refused int
	Highest        string // the highest token the store has seen
}

func getStatus(t *testing.T, url string) status {
	t.Helper()
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var s status
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("decoding %s/status: %v", url, err)
	}
	return s
}

// Two worker processes increment the store's counter under the lock. One
// is paused (SIGSTOP) while it holds the lock, for longer than its session
// TTL; the other takes over. When the paused one wakes, its late write is
// refused, and no increment is lost.
func TestPausedWorkerIsFenced(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	srv := httptest.NewServer((&store{}).handler())
	defer srv.Close()
	bin := build(t)
	worker := func(id string, rounds int, work time.Duration) (*exec.Cmd, *lines) {
		return start(t, bin, "-mode", "worker", "-endpoints", d.GRPCAddr, "-store", srv.URL, "-id", id,
			"-rounds", fmt.Sprint(rounds), "-work", work.String(), "-ttl", "2s")
	}
	// Worker a reads the counter with its token, then works for 3s: pause
	// it in the middle, holding the lock.
	a, aOut := worker("a", 1, 3*time.Second)
	// Its own line says the read is done (the store seeing the read is
	// not enough: a pause before a has the answer ends in a lost read).
	wait.Within(t, 30*time.Second, "a to read under the lock", func() bool { return aOut.has("worker a: read counter 0 with token") })
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b, bOut := worker("b", 3, 50*time.Millisecond)
	if err := bOut.exit(b); err != nil {
		t.Fatalf("worker b: %v", err)
	}
	if !bOut.has("counter 2 -> 3") {
		t.Fatalf("worker b: %v", bOut.all)
	}
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := aOut.exit(a); err != nil {
		t.Fatalf("worker a: %v", err)
	}
	if !aOut.has("write refused: stale fencing token") {
		t.Fatalf("worker a's late write was not refused: %v", aOut.all)
	}
	// Each worker names its own PID, the one to signal.
	for _, w := range []struct {
		id  string
		cmd *exec.Cmd
		out *lines
	}{{"a", a, aOut}, {"b", b, bOut}} {
		if want := fmt.Sprintf("worker %s: pid %d", w.id, w.cmd.Process.Pid); !w.out.has(want) {
			t.Errorf("worker %s did not print %q:\n%s", w.id, want, w.out)
		}
	}
	if s := getStatus(t, srv.URL); s.Value != 3 || s.Refused != 1 {
		t.Fatalf("store = %+v, want 3 increments and 1 refusal", s)
	}
}

// A worker started before coordd and the store waits for both (saying
// so) instead of failing on the first refused connection, then works.
func TestWorkerWaitsForCoorddAndStore(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	d.Stop() // its address now refuses connections, until Restart
	bin := build(t)
	storeAddr := freeport.Addr(t)
	w, wOut := start(t, bin, "-mode", "worker", "-endpoints", d.GRPCAddr, "-store", "http://"+storeAddr, "-id", "w",
		"-rounds", "2", "-work", "10ms", "-ttl", "2s", "-wait", "60s")
	wait.Within(t, 30*time.Second, "the worker to wait for coordd", func() bool { return wOut.has("worker w: waiting for coordd") })
	d.Restart(t)
	wait.Within(t, 30*time.Second, "the worker to wait for the store", func() bool { return wOut.has("worker w: waiting for the store") })
	s, sOut := start(t, bin, "-mode", "store", "-listen", storeAddr)
	wait.Within(t, 30*time.Second, "the worker's second increment", func() bool { return wOut.has("counter 1 -> 2") })
	if err := wOut.exit(w); err != nil {
		t.Fatalf("worker: %v; output:\n%s", err, wOut)
	}
	if want := fmt.Sprintf("worker w: pid %d", w.Process.Pid); !wOut.has(want) {
		t.Fatalf("worker did not print %q:\n%s", want, wOut)
	}
	if want := fmt.Sprintf("store: pid %d, listening on http://%s", s.Process.Pid, storeAddr); !sOut.has(want) {
		t.Fatalf("store did not print %q:\n%s", want, sOut)
	}
	if st := getStatus(t, "http://"+storeAddr); st.Value != 2 {
		t.Fatalf("store = %+v, want 2 increments", st)
	}
}

// A worker gives up after -wait when nothing answers.
func TestWorkerGivesUp(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	bin := build(t)
	cmd := exec.Command(bin, "-mode", "worker", "-endpoints", freeport.Addr(t), "-wait", "1500ms")
	began := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "gave up waiting") {
		t.Fatalf("worker: %v\n%s", err, out)
	}
	if took := time.Since(began); took > wait.Bound(10*time.Second) {
		t.Fatalf("worker gave up after %s; -wait was 1.5s", took)
	}
}
