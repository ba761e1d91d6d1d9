// Package layout_test keeps the package layout honest: every import
// points down the layers that docs/architecture.md describes, and the
// diagram there is the module's import graph as it is.
package layout_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const (
	module = "github.com/coordd/coordd/"
	doc    = "../../docs/architecture.md"
	begin  = "<!-- import graph: begin (go test ./internal/layout -update) -->"
	end    = "<!-- import graph: end -->"
)

var update = flag.Bool("update", false, "rewrite the import graph in docs/architecture.md")

// A layer may import the layers below it and its own, never one above.
var layers = []struct {
	name     string
	prefixes []string
}{
	{"the API (generated)", []string{"proto/"}},
	{"building blocks", []string{"internal/base/", "internal/shared/configvalue", "internal/shared/keyring"}},
	{"domain", []string{"fencing", "internal/histcheck", "internal/auth", "internal/session", "internal/lock", "internal/election", "internal/barrier", "internal/history", "internal/configcenter", "internal/cluster", "internal/kv", "internal/console"}},
	{"the Go SDK", []string{"clientlib", "internal/verify"}},
	{"the server", []string{"internal/server/"}},
	{"test support", []string{"internal/testkit/", "internal/shared/testkit/", "internal/layout"}},
	{"commands, bench, examples, other clients, end-to-end tests", []string{"cmd/", "bench", "examples/", "clients", "tests/"}},
}

func layerOf(t *testing.T, pkg string) int {
	t.Helper()
	for i, l := range layers {
		for _, p := range l.prefixes {
			if pkg == strings.TrimSuffix(p, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(p, "/")+"/") {
				return i
			}
		}
	}
	t.Fatalf("package %s is in no layer: add it to layers here and to docs/architecture.md", pkg)
	return -1
}

// goList is `go list -json` of every package of the repository's modules
// (the server's and, through go.work, the SDK's, the API's and what they
// share), run once for both tests.
var goList = sync.OnceValues(func() ([]byte, error) {
	cmd := exec.Command("go", "list", "-json", "github.com/coordd/coordd/...")
	cmd.Dir = "../.."
	return cmd.Output()
})

// graph is the module's packages and, for each, the module packages its
// non-test code imports.
func graph(t *testing.T) map[string][]string {
	t.Helper()
	out, err := goList()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, module)
		g[name] = nil
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) {
				g[name] = append(g[name], strings.TrimPrefix(imp, module))
			}
		}
	}
	return g
}

// Every import points to the importer's layer or one below: the building
// blocks know nothing of the domain, the domain nothing of the server or
// the SDK, and no production code imports test support.
func TestImportsPointDown(t *testing.T) {
	for pkg, imps := range graph(t) {
		for _, imp := range imps {
			if from, to := layerOf(t, pkg), layerOf(t, imp); to > from {
				t.Errorf("%s (%s) imports %s (%s), a layer above it", pkg, layers[from].name, imp, layers[to].name)
			}
		}
	}
}

// The import graph in docs/architecture.md is the module's as it is.
func TestArchitectureDiagramIsCurrent(t *testing.T) {
	want := mermaid(t, graph(t))
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no import graph between %q and %q", doc, begin, end)
	}
	got := text[i+len(begin) : j]
	if got == want {
		return
	}
	if !*update {
		t.Fatalf("the import graph in %s is out of date: run go test ./internal/layout -update", doc)
	}
	if err := os.WriteFile(doc, []byte(text[:i+len(begin)]+want+text[j:]), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mermaid draws g as a Mermaid flowchart, one box per layer, top layer
// first, each arrow an import.
func mermaid(t *testing.T, g map[string][]string) string {
	t.Helper()
	id := func(pkg string) string { return strings.NewReplacer("/", "_", "-", "_").Replace(pkg) }
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	var b strings.Builder
	b.WriteString("\n```mermaid\nflowchart TB\n")
	for i := len(layers) - 1; i >= 0; i-- {
		fmt.Fprintf(&b, "  subgraph L%d[\"%s\"]\n", i, layers[i].name)
		for _, p := range pkgs {
			if layerOf(t, p) == i {
				fmt.Fprintf(&b, "    %s[\"%s\"]\n", id(p), p)
			}
		}
		b.WriteString("  end\n")
	}
	for _, p := range pkgs {
		imps := slices.Clone(g[p])
		slices.Sort(imps)
		for _, imp := range imps {
			fmt.Fprintf(&b, "  %s --> %s\n", id(p), id(imp))
		}
	}
	b.WriteString("```\n")
	return b.String()
}
