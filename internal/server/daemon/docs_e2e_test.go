package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/shared/keyring"
)

// The shell blocks of the README and of docs/*.md are run as written,
// against a real daemon, so that a walk-through a newcomer pastes works.
// A block that cannot run here (it installs packages, starts a cluster on
// fixed ports, needs systemd or Docker) says so with a comment on the line
// before it: <!-- not run: why -->. Every other block runs: the README's,
// then docs/config-center.md's (it goes on from the README's config
// walk-through) on one daemon, each other page on a daemon of its own.
//
// A block fails when a command fails (bash -e), when a command that
// states its output (a comment "# prints: `line` `line`") prints anything
// else, or when an answer is an internal error, an unimplemented call or
// an unknown route. Streams that the walk-throughs leave open end after a
// few seconds.
func TestDocsShellBlocksRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("COORDD_REQUIRE_TOOLS") != "" {
				t.Fatalf("%s is not installed and COORDD_REQUIRE_TOOLS is set", tool)
			}
			t.Skipf("%s is not installed; skipping the docs' shell blocks", tool)
		}
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string][]string{"README.md": {"README.md", "docs/config-center.md"}}
	for _, p := range pages {
		if rel, _ := filepath.Rel(root, p); rel != "docs/config-center.md" {
			runs[rel] = []string{rel}
		}
	}
	for name, files := range runs {
		var script strings.Builder
		for _, f := range files {
			blocks, err := shellBlocks(filepath.Join(root, f))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range blocks {
				script.WriteString(b)
			}
		}
		if script.Len() == 0 {
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runShell(t, root, script.String())
		})
	}
}

// notRun marks a block the test does not run, with the reason.
var notRun = regexp.MustCompile(`^<!-- not run: .+ -->$`)

// shellBlocks returns the sh blocks of a Markdown file that are to run.
func shellBlocks(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var blocks []string
	lines := strings.Split(string(data), "\n")
	prev := "" // the last non-empty line before the block
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```sh" {
			if strings.TrimSpace(lines[i]) != "" {
				prev = strings.TrimSpace(lines[i])
			}
			continue
		}
		var b strings.Builder
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			b.WriteString(lines[i] + "\n")
		}
		if !notRun.MatchString(prev) {
			blocks = append(blocks, b.String())
		}
		prev = ""
	}
	return blocks, nil
}

// runShell runs script with bash from the repository's root against a
// daemon of its own, the walk-throughs' addresses pointed at it.
func runShell(t *testing.T, root, script string) {
	cfg := testConfig(t)
	// The walk-throughs' secrets need a key file, as the README says.
	cfg.SecretKeyFile = filepath.Join(t.TempDir(), "coordd-secret.keys")
	line, err := keyring.NewKeyLine("k1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.SecretKeyFile, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, cfg)
	script = checkPrinted(strings.NewReplacer(
		"localhost:7421", d.HTTPAddr(), "127.0.0.1:7421", d.HTTPAddr(), "127.0.0.1:7420", d.GRPCAddr(),
	).Replace(script))
	prelude := `set -e
cd "$COORDD_DOCS_ROOT"
# Streams left open (watch, observe) end after a few seconds; a job that
# ended already is no error to kill.
curl() { local rc=0; command curl --max-time 3 "$@" || rc=$?; [ "$rc" = 28 ] && rc=0; return "$rc"; }
kill() { command kill "$@" 2>/dev/null || true; }
`
	cmd := exec.CommandContext(t.Context(), "bash", "-c", prelude+script+"\nwait\n")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "COORDD_DOCS_ROOT="+root, "COORDD_ENDPOINTS="+d.GRPCAddr(), "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the shell blocks failed: %v\n%s", err, out)
	}
	if bad := badOutput.Find(out); bad != nil {
		t.Errorf("the shell blocks' output has %q:\n%s", bad, out)
	}
}

// printsComment is a command's stated output: "cmd   # prints: `a` `b`"
// says that cmd prints the lines a and b, and nothing else.
var (
	printsComment = regexp.MustCompile("^(.*?)\\s+# prints: ((?:`[^`]*`\\s*)+)$")
	printedLine   = regexp.MustCompile("`([^`]*)`")
)

// checkPrinted rewrites each command that states its output into one that
// fails unless it prints exactly that.
func checkPrinted(script string) string {
	lines := strings.Split(script, "\n")
	for i, l := range lines {
		m := printsComment.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var want []string
		for _, w := range printedLine.FindAllStringSubmatch(m[2], -1) {
			want = append(want, "'"+strings.ReplaceAll(w[1], "'", `'\''`)+"'")
		}
		lines[i] = fmt.Sprintf(`got=$(%s); want=$(printf '%%s\n' %s); [ "$got" = "$want" ] || { printf 'documented output differs:\n%%s\nwant:\n%%s\n' "$got" "$want"; exit 1; }`,
			m[1], strings.Join(want, " "))
	}
	return strings.Join(lines, "\n")
}

// badOutput is what no walk-through should print: an internal error, an
// unimplemented call or method, an unknown route, a missing command.
var badOutput = regexp.MustCompile(`"status":\s*"UNIMPLEMENTED"|UNKNOWN_ROUTE|no such endpoint|"message":\s*"Not Found"|command not found|INTERNAL`)
