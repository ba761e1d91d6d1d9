package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/shared/testkit/wait"
	"github.com/coordd/coordd/internal/testkit/coorddtest"
)

type proc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	at    []time.Time
}

func (p *proc) find(re *regexp.Regexp) (string, time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, l := range p.lines {
		if re.MatchString(l) {
			return l, p.at[i], true
		}
	}
	return "", time.Time{}, false
}

var leading = regexp.MustCompile(`leading \(term (\d+)\)`)

// Two workers: one leads and works, the other stands by; kill -9 the
// leader and the other takes over within the session TTL (plus etcd's
// expiry check), with a higher term.
func TestFailOverOnKill(t *testing.T) {
	t.Parallel()
	d := coorddtest.Start(t)
	bin := filepath.Join(t.TempDir(), "leader-worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	const ttl = 2 * time.Second
	start := func(id string) *proc {
		p := &proc{cmd: exec.Command(bin, "-endpoints", d.GRPCAddr, "-id", id, "-ttl", ttl.String(), "-step", "100ms")}
		p.cmd.Stderr = os.Stderr
		out, _ := p.cmd.StdoutPipe()
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				p.mu.Lock()
				p.lines, p.at = append(p.lines, sc.Text()), append(p.at, time.Now())
				p.mu.Unlock()
			}
		}()
		// a may be gone already: the test kills it.
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
		return p
	}
	a := start("a")
	wait.Within(t, 30*time.Second, "a to lead", func() bool { _, _, ok := a.find(leading); return ok })
	// The worker names its own PID, the one to kill.
	if _, _, ok := a.find(regexp.MustCompile(`^worker a: pid ` + strconv.Itoa(a.cmd.Process.Pid) + `$`)); !ok {
		t.Fatalf("a did not print its pid %d", a.cmd.Process.Pid)
	}
	b := start("b")
	wait.Within(t, 30*time.Second, "b to stand by", func() bool { _, _, ok := b.find(regexp.MustCompile("standing by")); return ok })
	wait.Within(t, 30*time.Second, "a to work", func() bool { _, _, ok := a.find(regexp.MustCompile("batch step 3")); return ok })
	if _, _, ok := b.find(regexp.MustCompile("batch step")); ok {
		t.Fatal("b worked while a led")
	}
	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wait.Within(t, 30*time.Second, "b to take over", func() bool { _, _, ok := b.find(leading); return ok })
	line, at, _ := b.find(leading)
	// TTL, plus up to 0.5s for etcd's expiry check, plus slack for a busy
	// machine.
	if took := at.Sub(killed); took > ttl+2*time.Second {
		t.Fatalf("b took over %s after the kill; TTL is %s", took, ttl)
	} else {
		t.Logf("b took over %s after a was killed (TTL %s)", took.Round(time.Millisecond), ttl)
	}
	aLine, _, _ := a.find(leading)
	ta, _ := strconv.Atoi(leading.FindStringSubmatch(aLine)[1])
	tb, _ := strconv.Atoi(leading.FindStringSubmatch(line)[1])
	if tb <= ta {
		t.Fatalf("terms %d then %d", ta, tb)
	}
	wait.Within(t, 30*time.Second, "b to work", func() bool {
		_, _, ok := b.find(regexp.MustCompile(`batch step 2 \(term ` + strconv.Itoa(tb)))
		return ok
	})
}
