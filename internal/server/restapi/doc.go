// Package coorddv1 (directory restapi) is the REST side of coordd's wire
// API v1: the grpc-gateway handlers generated from proto/coordd/v1, and
// the OpenAPI document of the REST API (coordd.swagger.json, served at
// /openapi.json with the routes the gateway serves by hand).
//
// It lives in the server, not beside the API it translates, so that the
// API module, and with it the Go SDK, never compiles grpc-gateway. The
// generator names the package after the API's (coorddv1); import it as
// restapi. Everything here except this file and openapi.go is generated
// by `make generate`; never edit it by hand.
package coorddv1
