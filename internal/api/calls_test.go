package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Every call a CallsRequest can carry has a route, to the unary RPC of its
// name, and its response has a place in CallsResponse: a call added to
// the proto and not to the server fails here, not in a client.
func TestEveryCallHasARoute(t *testing.T) {
	s := NewCallServer(&LockServer{}, &ElectionServer{}, nil, nil, nil, false)
	req := (&coorddv1.CallsRequest{}).ProtoReflect()
	oneof := req.Descriptor().Oneofs().ByName("call")
	resp := (&coorddv1.CallsResponse{}).ProtoReflect().Descriptor().Oneofs().ByName("result")
	seen := map[callCase]bool{}
	for i := range oneof.Fields().Len() {
		f := oneof.Fields().Get(i)
		if f.Name() == "cancel" {
			continue
		}
		msg := req.Type().New()
		msg.Set(f, protoreflect.ValueOfMessage(msg.NewField(f).Message()))
		c, inner := route(msg.Interface().(*coorddv1.CallsRequest))
		r, ok := s.routes[c]
		if !ok || inner == nil {
			t.Fatalf("call %s has no route", f.Name())
		}
		if seen[c] {
			t.Fatalf("call %s shares a route", f.Name())
		}
		seen[c] = true
		// The route's RPC is the one this request is for.
		if rpc := "/" + strings.TrimSuffix(string(f.Message().Name()), "Request"); !strings.HasSuffix(r.method, rpc) {
			t.Fatalf("call %s (%s) routes to %s", f.Name(), f.Message().Name(), r.method)
		}
		if resp.Fields().ByName(f.Name()) == nil {
			t.Fatalf("call %s has no field in CallsResponse.result", f.Name())
		}
	}
	if len(seen) != len(s.routes) {
		t.Fatalf("%d calls in the proto, %d routes", len(seen), len(s.routes))
	}
}
