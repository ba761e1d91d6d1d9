package gateway

import (
	"errors"
	"io"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// snapshotPath is SaveSnapshot's REST route. grpc-gateway would answer a
// server stream as newline-separated JSON with the bytes in base64; a
// backup is a file, so this route streams the raw bytes instead.
const snapshotPath = "/v1/cluster/snapshot"

// handleSnapshot registers GET /v1/cluster/snapshot on gw: the backup as
// application/octet-stream, exactly the bytes coordctl snapshot save
// writes. It goes through the daemon's own gRPC listener, as every REST
// route does (the same identity, policy check and audit line).
//
// An error before the first byte is an ordinary error body. One after it
// (the member failed mid-backup) aborts the response, so that the client
// sees a broken transfer (curl exits 18), never a short file that looks
// complete.
func handleSnapshot(gw *runtime.ServeMux, conn *grpc.ClientConn) error {
	cluster := coorddv1.NewClusterServiceClient(conn)
	return gw.HandlePath(http.MethodGet, snapshotPath, func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		ctx, err := runtime.AnnotateContext(r.Context(), gw, r, "/coordd.v1.ClusterService/SaveSnapshot", runtime.WithHTTPPathPattern(snapshotPath))
		if err != nil {
			runtime.HTTPError(r.Context(), gw, nil, w, r, err)
			return
		}
		stream, err := cluster.SaveSnapshot(ctx, &coorddv1.SaveSnapshotRequest{})
		if err != nil {
			runtime.HTTPError(ctx, gw, nil, w, r, err)
			return
		}
		first, err := stream.Recv()
		if err != nil && !errors.Is(err, io.EOF) {
			runtime.HTTPError(ctx, gw, nil, w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="coordd-snapshot.db"`)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		for msg := first; msg != nil; {
			if _, err := w.Write(msg.GetData()); err != nil {
				return // the client is gone
			}
			if msg, err = stream.Recv(); errors.Is(err, io.EOF) {
				return
			} else if err != nil {
				panic(http.ErrAbortHandler)
			}
		}
	})
}
