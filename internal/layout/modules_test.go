package layout_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// sdkModules are the modules a program using the Go SDK requires: the SDK,
// the API it speaks, fencing, and the two packages the SDK shares with
// the server (internal/shared). Directories are relative to the root.
var sdkModules = map[string]string{
	"github.com/coordd/coordd/clientlib":       "clientlib",
	"github.com/coordd/coordd/proto":           "proto",
	"github.com/coordd/coordd/fencing":         "fencing",
	"github.com/coordd/coordd/internal/shared": "internal/shared",
}

// sdkRequires is every module the SDK's go.mod may require, directly or
// as indirect: gRPC, protobuf and what they need, the YAML reader config
// binding uses, and goleak for the SDK's own tests. Growing it is a
// decision: a module here lands in every SDK user's go.sum.
var sdkRequires = map[string]bool{
	"github.com/coordd/coordd/fencing":          true,
	"github.com/coordd/coordd/internal/shared":  true,
	"github.com/coordd/coordd/proto":            true,
	"google.golang.org/grpc":                    true,
	"google.golang.org/protobuf":                true,
	"google.golang.org/genproto/googleapis/rpc": true,
	"golang.org/x/net":                          true,
	"golang.org/x/sys":                          true,
	"golang.org/x/text":                         true,
	"go.yaml.in/yaml/v3":                        true,
	"go.uber.org/goleak":                        true,
}

// serverOnly are modules of the server, its tests and its bench that no
// SDK user's module graph may hold.
var serverOnly = []string{
	"github.com/coordd/coordd ", // the root module itself (the server)
	"go.etcd.io/etcd/server",
	"go.etcd.io/etcd/client",
	"go.etcd.io/bbolt",
	"github.com/chromedp/",
	"github.com/redis/",
	"github.com/go-redsync/",
	"github.com/go-zookeeper/",
	"github.com/anishathalye/porcupine",
	"github.com/grpc-ecosystem/grpc-gateway",
	"github.com/prometheus/",
	"go.uber.org/zap",
}

// goCmd runs go in dir outside the workspace (as a user's build would be)
// and returns its standard output. flags is GOFLAGS.
func goCmd(t *testing.T, dir, flags string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS="+flags)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	return string(out)
}

// The SDK's go.mod requires nothing beyond its allow-list.
func TestSDKModuleRequiresOnlyItsAllowList(t *testing.T) {
	var mod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal([]byte(goCmd(t, "../../clientlib", "", "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	for _, r := range mod.Require {
		if !sdkRequires[r.Path] {
			t.Errorf("clientlib/go.mod requires %s, which is not on the SDK's allow-list (internal/layout/modules_test.go): every SDK user would download it", r.Path)
		}
	}
}

// The SDK's module graph holds none of the server's modules. (gRPC's own
// go.mod brings gonum and others into the graph for gRPC's tests; those
// are gRPC's, and no SDK package builds with them: checked below.)
func TestSDKModuleGraphHasNoServerModule(t *testing.T) {
	// go list -m all wants go.sum lines for go.mod files a tidy go.sum
	// leaves out: it writes them into a copy, never into the repository.
	modfile := copyModFile(t, "../../clientlib")
	all := goCmd(t, "../../clientlib", "-mod=mod -modfile="+modfile, "list", "-m", "all")
	for _, line := range strings.Split(all, "\n") {
		for _, bad := range serverOnly {
			if strings.HasPrefix(line+" ", bad) {
				t.Errorf("the SDK's module graph (go list -m all in clientlib) holds %q", line)
			}
		}
	}
	deps := goCmd(t, "../../clientlib", "-mod=mod -modfile="+modfile, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./...")
	seen := map[string]bool{}
	for _, m := range strings.Fields(deps) {
		if !sdkRequires[m] && sdkModules[m] == "" && !seen[m] {
			seen[m] = true
			t.Errorf("an SDK package builds with a package of %s, which is not on the allow-list", m)
		}
	}
}

// A program outside the repository builds against the SDK through replace
// directives to the SDK's modules only, and its go.sum holds no line of
// the server's modules.
func TestSDKBuildsOutsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module example.com/app\n\ngo 1.26.0\n\nrequire github.com/coordd/coordd/clientlib v0.0.0-00010101000000-000000000000\n\nreplace (\n"
	for path, sub := range sdkModules {
		goMod += "\t" + path + " => " + filepath.Join(root, sub) + "\n"
	}
	goMod += ")\n"
	mainGo := `package main

import (
	"context"
	"fmt"

	"github.com/coordd/coordd/clientlib"
	"github.com/coordd/coordd/fencing"
)

func main() {
	c, err := clientlib.New(context.Background(), clientlib.Config{Endpoints: []string{"127.0.0.1:7420"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Println(fencing.Token(1))
}
`
	for name, text := range map[string]string{"go.mod": goMod, "main.go": mainGo} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(t, dir, "-mod=mod", "mod", "tidy")
	goCmd(t, dir, "-mod=mod", "build", "-o", os.DevNull, ".")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(sum), "\n") {
		for _, bad := range serverOnly {
			if strings.HasPrefix(line, bad) {
				t.Errorf("the program's go.sum holds a line of a server module: %s", line)
			}
		}
	}
}

// copyModFile copies the go.mod and go.sum of the module in dir into a
// temporary directory and returns the copy of go.mod, for -modfile.
func copyModFile(t *testing.T, dir string) string {
	t.Helper()
	tmp := t.TempDir()
	for _, name := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(tmp, "go.mod")
}
