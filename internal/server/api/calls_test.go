package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Every call a CallsRequest can carry has a route, to the unary RPC whose
// request it is, and that RPC's response has a place in CallsResponse: a
// call added to the proto and not to the server fails here, not in a
// client.
func TestEveryCallHasARoute(t *testing.T) {
	s := NewCallServer(CallOptions{Locks: &LockServer{}, Elections: &ElectionServer{}, Barriers: &BarrierServer{}})
	fields := (&coorddv1.CallsRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("call").Fields()
	calls := 0
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.Name() == "cancel" {
			continue
		}
		calls++
		r, ok := s.routes[f.Message().FullName()]
		if !ok {
			t.Fatalf("call %s has no route", f.Name())
		}
		// The route's RPC is the one this request is for.
		name := strings.ReplaceAll(strings.TrimPrefix(r.method, "/"), "/", ".")
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatalf("call %s routes to %s: %v", f.Name(), r.method, err)
		}
		m := d.(protoreflect.MethodDescriptor)
		if m.Input().FullName() != f.Message().FullName() {
			t.Fatalf("call %s (%s) routes to %s, which takes %s", f.Name(), f.Message().FullName(), r.method, m.Input().FullName())
		}
		resp, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
		if err != nil {
			t.Fatal(err)
		}
		if coorddv1.NewAnswer(1, resp.New().Interface()) == nil {
			t.Fatalf("%s's response %s has no field in CallsResponse.result", r.method, m.Output().FullName())
		}
		in, err := protoregistry.GlobalTypes.FindMessageByName(f.Message().FullName())
		if err != nil {
			t.Fatal(err)
		}
		req := coorddv1.NewCall(1, in.New().Interface())
		if req == nil || req.Request().ProtoReflect().Descriptor() != f.Message() {
			t.Fatalf("call %s does not wrap and unwrap", f.Name())
		}
	}
	if calls != len(s.routes) {
		t.Fatalf("%d calls in the proto, %d routes", calls, len(s.routes))
	}
}
