package coorddv1

import (
	_ "embed"
	"encoding/json"
)

// OpenAPI is the OpenAPI v2 document of the REST API, generated from the
// protos and coordd.gateway.yaml by `make generate`, with the routes the
// gateway serves by hand (handPaths) added. The daemon serves it at
// /openapi.json.
var OpenAPI = withPaths(generatedOpenAPI, handPaths)

//go:embed coordd.swagger.json
var generatedOpenAPI []byte

// handPaths are the REST routes that the gateway serves itself rather
// than through grpc-gateway, in OpenAPI v2 (kept beside the handlers'
// docs: internal/server/gateway).
const handPaths = `{
  "/v1/cluster/snapshot": {
    "get": {
      "summary": "A backup of the cluster's etcd data, as a file (SaveSnapshot streamed as raw bytes, exactly what coordctl snapshot save writes). Needs cluster.admin. An error after the first byte aborts the transfer, never a short file that looks complete.",
      "operationId": "ClusterService_SaveSnapshotFile",
      "produces": ["application/octet-stream"],
      "responses": {
        "200": {"description": "The snapshot (Content-Disposition: attachment; filename=\"coordd-snapshot.db\").", "schema": {"type": "file"}},
        "default": {"description": "An unexpected error response.", "schema": {"$ref": "#/definitions/rpcStatus"}}
      },
      "tags": ["ClusterService"]
    }
  }
}`

// withPaths returns doc with paths added to its "paths"; doc as it is if
// either does not parse (a test checks that both do).
func withPaths(doc []byte, paths string) []byte {
	var d map[string]json.RawMessage
	var have, add map[string]json.RawMessage
	if json.Unmarshal(doc, &d) != nil || json.Unmarshal(d["paths"], &have) != nil || json.Unmarshal([]byte(paths), &add) != nil {
		return doc
	}
	for p, item := range add {
		have[p] = item
	}
	merged, err := json.Marshal(have)
	if err != nil {
		return doc
	}
	d["paths"] = merged
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return doc
	}
	return out
}
