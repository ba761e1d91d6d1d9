package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/coordd/coordd/internal/auth"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// coorddMethods lists every RPC of coordd's API, from the proto registry.
func coorddMethods(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	_ = coorddv1.File_coordd_v1_session_proto // registers the files
	var out []protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFilesByPackage("coordd.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				out = append(out, svc.Methods().Get(j))
			}
		}
		return true
	})
	if len(out) < 40 {
		t.Fatalf("found only %d RPCs in the registry", len(out))
	}
	return out
}

func fullMethod(m protoreflect.MethodDescriptor) string {
	return "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
}

// Every RPC has a row in the table, and every row is an RPC; WhoAmI alone
// is open to any authenticated caller (authorize says so by name).
func TestEveryRPCIsInTheAuthTable(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range coorddMethods(t) {
		name := fullMethod(m)
		seen[name] = true
		if name == whoAmI {
			continue
		}
		rule, ok := rpcTable[name]
		if !ok {
			t.Errorf("%s is not in rpcTable: say which action it is and which names it acts on", name)
			continue
		}
		if _, ok := auth.Actions[rule.action]; !ok {
			t.Errorf("%s: unknown action %q", name, rule.action)
		}
		// An action about names must read them from the request.
		if auth.Actions[rule.action] != auth.None && rule.names == nil {
			t.Errorf("%s: action %s is about a %s but the table reads no name", name, rule.action, auth.Actions[rule.action])
		}
	}
	for name := range rpcTable {
		if !seen[name] {
			t.Errorf("rpcTable has %s, which is not an RPC", name)
		}
	}
}

// The names a request carries are what the table checks: a request naming
// "a/x" is checked as a/x.
func TestTheTableReadsTheNames(t *testing.T) {
	for _, m := range coorddMethods(t) {
		name := fullMethod(m)
		rule := rpcTable[name]
		if rule.names == nil {
			continue
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
		if err != nil {
			t.Fatal(err)
		}
		msg := mt.New()
		SetNames(msg, "a/x")
		res := rule.names(msg.Interface())
		if len(res) == 0 {
			t.Errorf("%s: no name read from %v", name, msg)
			continue
		}
		for _, r := range res {
			if r.Name != "a/x" || (r.Kind != auth.Actions[rule.action] && !strings.HasSuffix(name, "ValidateFence")) {
				t.Errorf("%s: read %+v from a request naming a/x", name, r)
			}
		}
	}
}
