package gateway

import (
	"encoding/json"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/internal/server/api"
)

// restError is the body of every REST error, unary or on a stream, in
// Google's JSON error style:
//
//	{"error":{"code":409,"status":"ABORTED","reason":"STALE_TOKEN","message":"…","details":[…]}}
//
// code is the HTTP status; status the gRPC code's name; reason coordd's
// (api.Reason: present on every error); details the google.rpc details
// (ErrorInfo, BadRequest's field violations, RetryInfo), each with its
// "@type".
type restError struct {
	Error restErrorBody `json:"error"`
}

type restErrorBody struct {
	Code    int               `json:"code"`
	Status  string            `json:"status"`
	Reason  string            `json:"reason"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

var detailMarshaler = protojson.MarshalOptions{}

// errorBody is st as a REST error body (without its final newline).
func errorBody(httpStatus int, st *status.Status) []byte {
	e := restErrorBody{
		Code:    httpStatus,
		Status:  code.Code_name[int32(st.Code())],
		Reason:  api.Reason(st),
		Message: st.Message(),
		Details: []json.RawMessage{},
	}
	if e.Status == "" {
		e.Status = code.Code_UNKNOWN.String()
	}
	for _, d := range st.Proto().GetDetails() {
		if b, err := detailMarshaler.Marshal(d); err == nil {
			e.Details = append(e.Details, b)
		}
	}
	b, err := json.Marshal(restError{e})
	if err != nil {
		// Cannot happen (strings, ints and valid JSON); answer in the same shape.
		return []byte(`{"error":{"code":500,"status":"INTERNAL","reason":"INTERNAL","message":"failed to encode an error","details":[]}}`)
	}
	return b
}

// streamError is the error body of chunk, a stream's error line as
// grpc-gateway makes it ({"error": <google.rpc.Status>}), or false if
// chunk is not one.
func streamError(chunk any) ([]byte, bool) {
	m, ok := chunk.(map[string]proto.Message)
	if !ok || len(m) != 1 {
		return nil, false
	}
	sp, ok := m["error"].(*spb.Status)
	if !ok {
		return nil, false
	}
	st := status.FromProto(sp)
	return errorBody(api.HTTPStatus(st, runtime.HTTPStatusFromCode), st), true
}
