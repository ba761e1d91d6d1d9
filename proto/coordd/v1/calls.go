package coorddv1

import (
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A Calls stream carries the requests of unary RPCs, each in its own field
// of CallsRequest.call, and answers with their responses in
// CallsResponse.result. NewCall, Request, NewAnswer and Response wrap and
// unwrap them by message type, so that neither the server nor the SDK
// keeps a list of its own beside the proto's.
//
// The descriptors are read at first use: the generated code builds them in
// its init, after package variables are set.
var calls = sync.OnceValue(func() (c struct {
	callOneof, resultOneof   protoreflect.OneofDescriptor
	callFields, resultFields map[protoreflect.FullName]protoreflect.FieldDescriptor
}) {
	c.callOneof = (&CallsRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("call")
	c.resultOneof = (&CallsResponse{}).ProtoReflect().Descriptor().Oneofs().ByName("result")
	c.callFields, c.resultFields = fieldsByMessage(c.callOneof), fieldsByMessage(c.resultOneof)
	return c
})

// fieldsByMessage maps the message type of each field of o to the field.
func fieldsByMessage(o protoreflect.OneofDescriptor) map[protoreflect.FullName]protoreflect.FieldDescriptor {
	out := make(map[protoreflect.FullName]protoreflect.FieldDescriptor, o.Fields().Len())
	for i := range o.Fields().Len() {
		f := o.Fields().Get(i)
		out[f.Message().FullName()] = f
	}
	return out
}

// NewCall wraps req as call id; nil when no field of CallsRequest.call
// holds a message of req's type.
func NewCall(id uint64, req proto.Message) *CallsRequest {
	f, ok := calls().callFields[req.ProtoReflect().Descriptor().FullName()]
	if !ok {
		return nil
	}
	out := &CallsRequest{CallId: id}
	out.ProtoReflect().Set(f, protoreflect.ValueOfMessage(req.ProtoReflect()))
	return out
}

// Request is the message in x's call field (a CancelCall for a cancel),
// or nil when none is set.
func (x *CallsRequest) Request() proto.Message {
	return oneofMessage(x.ProtoReflect(), calls().callOneof)
}

// NewAnswer wraps resp as the answer to call id; nil when no field of
// CallsResponse.result holds a message of resp's type.
func NewAnswer(id uint64, resp proto.Message) *CallsResponse {
	f, ok := calls().resultFields[resp.ProtoReflect().Descriptor().FullName()]
	if !ok {
		return nil
	}
	out := &CallsResponse{CallId: id}
	out.ProtoReflect().Set(f, protoreflect.ValueOfMessage(resp.ProtoReflect()))
	return out
}

// Response is the message in x's result field (a CallStatus for an
// error), or nil when none is set.
func (x *CallsResponse) Response() proto.Message {
	return oneofMessage(x.ProtoReflect(), calls().resultOneof)
}

func oneofMessage(m protoreflect.Message, o protoreflect.OneofDescriptor) proto.Message {
	f := m.WhichOneof(o)
	if f == nil {
		return nil
	}
	return m.Get(f).Message().Interface()
}
