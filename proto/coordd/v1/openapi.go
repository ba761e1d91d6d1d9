package coorddv1

import _ "embed"

// OpenAPI is the OpenAPI v2 document of the REST API, generated from the
// protos and coordd.gateway.yaml by `make generate`. The daemon serves it at
// /openapi.json.
//
//go:embed coordd.swagger.json
var OpenAPI []byte
