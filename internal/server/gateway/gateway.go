// Package gateway serves coordd's HTTP listener: the REST gateway (which
// dials the daemon's own gRPC listener, so every interceptor applies to REST
// too), /healthz, /readyz, /metrics and /openapi.json.
package gateway

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/internal/server/api"
	restapi "github.com/coordd/coordd/internal/server/restapi"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Options configure the HTTP handler.
type Options struct {
	// Conn is a client connection to the daemon's own gRPC listener.
	Conn *grpc.ClientConn
	// MaxRequestBytes caps a request body; larger bodies get 413.
	MaxRequestBytes int64
	// BodyTimeout bounds how long a client may take to send a request
	// body (0: 30 s), so a slow sender cannot hold a connection and a
	// handler indefinitely.
	BodyTimeout time.Duration
	// Ready reports whether the daemon can serve requests (etcd has a
	// leader and answers). It backs /readyz.
	Ready func(ctx context.Context) error
	// Gatherer backs /metrics; it should be the registry etcd uses.
	Gatherer prometheus.Gatherer
	// Pprof serves Go's profiles under /debug/pprof/ (off by default: they
	// reveal internals and cost CPU while they run).
	Pprof bool
	// Forward returns the metadata that carries a request's identity to
	// the daemon (nil: none). Headers for which Forged reports true are
	// never forwarded, so a client cannot claim an identity.
	Forward func(*http.Request) metadata.MD
	Forged  func(header string) bool
	// Guard, if set, is asked before serving /metrics, /openapi.json and
	// pprof (what=the path); an error is answered as the API answers it.
	Guard func(r *http.Request) error
	// ReadyNote is appended to /readyz's answer when ready (e.g. that
	// coordd runs without a policy).
	ReadyNote func() string
	// Console, if set, serves the web console under /ui/ (given the path
	// with /ui stripped); / and /ui redirect to it. Its files are public:
	// the data it shows comes through /v1/ with the caller's own token.
	Console http.Handler
	// Browsers says which other origins and host names browsers may use
	// (see guardBrowsers); the zero value allows coordd's own origin,
	// reached by IP address or localhost.
	Browsers BrowserPolicy
}

// New returns the daemon's HTTP handler.
func New(ctx context.Context, opts Options) (http.Handler, error) {
	gw, err := restGateway(ctx, opts)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", limitBody(opts.MaxRequestBytes, cmp.Or(opts.BodyTimeout, 30*time.Second), gw))
	// A failed write of a response means the client is gone: there is no
	// one left to tell, here and in writeStatus.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := opts.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
		if opts.ReadyNote != nil {
			if note := opts.ReadyNote(); note != "" {
				_, _ = io.WriteString(w, note+"\n")
			}
		}
	})
	guard := func(h http.Handler) http.Handler { return guarded(opts.Guard, h) }
	mux.Handle("GET /metrics", guard(promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{})))
	if opts.Pprof {
		mux.Handle("GET /debug/pprof/", guard(http.HandlerFunc(pprof.Index)))
		mux.Handle("GET /debug/pprof/cmdline", guard(http.HandlerFunc(pprof.Cmdline)))
		mux.Handle("GET /debug/pprof/profile", guard(http.HandlerFunc(pprof.Profile)))
		mux.Handle("GET /debug/pprof/symbol", guard(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("GET /debug/pprof/trace", guard(http.HandlerFunc(pprof.Trace)))
	}
	if opts.Console != nil {
		mux.Handle("GET /ui/", http.StripPrefix("/ui", opts.Console))
		// Relative redirects, so that a path prefix in front of coordd
		// (a reverse proxy's /coordd/) is kept.
		toUI := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "ui/") // not http.Redirect: it makes the URL absolute
			w.WriteHeader(http.StatusFound)
		})
		mux.Handle("GET /ui", toUI)
		mux.Handle("GET /{$}", toUI)
	}
	mux.Handle("GET /openapi.json", guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(restapi.OpenAPI)
	})))
	return guardBrowsers(opts.Browsers, mux), nil
}

// restGateway is grpc-gateway's mux of every service's REST routes, over
// opts.Conn, with coordd's codec and error pages, the identity the request
// authenticated forwarded, and headers that would forge one dropped.
func restGateway(ctx context.Context, opts Options) (*runtime.ServeMux, error) {
	useDurationQueryParser()
	muxOpts := []runtime.ServeMuxOption{
		runtime.WithMarshalerOption(runtime.MIMEWildcard, newCodec()),
		runtime.WithErrorHandler(writeError),
		runtime.WithRoutingErrorHandler(routingError),
	}
	if opts.Forward != nil {
		muxOpts = append(muxOpts, runtime.WithMetadata(func(_ context.Context, r *http.Request) metadata.MD { return opts.Forward(r) }))
	}
	if opts.Forged != nil {
		muxOpts = append(muxOpts, runtime.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			if opts.Forged(key) {
				return "", false
			}
			return runtime.DefaultHeaderMatcher(key)
		}))
	}
	gw := runtime.NewServeMux(muxOpts...)
	for _, register := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		restapi.RegisterSessionServiceHandler,
		restapi.RegisterLockServiceHandler,
		restapi.RegisterBarrierServiceHandler,
		restapi.RegisterHistoryServiceHandler,
		restapi.RegisterTrendServiceHandler,
		restapi.RegisterElectionServiceHandler,
		restapi.RegisterConfigServiceHandler,
		restapi.RegisterClusterServiceHandler,
		restapi.RegisterKVServiceHandler,
	} {
		if err := register(ctx, gw, opts.Conn); err != nil {
			return nil, err
		}
	}
	if err := handleSnapshot(gw, opts.Conn); err != nil {
		return nil, err
	}
	return gw, nil
}

// guarded serves h only to requests that check lets through (all, when
// check is nil); others get the error check returns, as a status.
func guarded(check func(*http.Request) error, h http.Handler) http.Handler {
	if check == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := check(r); err != nil {
			st, _ := api.ToStatus(err)
			writeStatus(w, runtime.HTTPStatusFromCode(st.Code()), st)
			return
		}
		h.ServeHTTP(w, r)
	})
}

type bodyKey struct{}

// countingBody records whether the body limit was hit, so the error handler
// can answer 413 instead of a generic 400.
type countingBody struct {
	io.ReadCloser
	max      int64
	exceeded atomic.Bool
	read     func() // called once, when the whole body is read
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		b.exceeded.Store(true)
	}
	if errors.Is(err, io.EOF) && b.read != nil {
		// The whole body is read: lift its deadline. (After any other
		// error it stays, so that the server, discarding the rest of the
		// body before it reuses the connection, gives up too.)
		b.read()
		b.read = nil
	}
	return n, err
}

// limitBody caps a request body at limit bytes and the time to send it at
// timeout; the deadline is lifted once the body is read, so that a
// streaming response is not cut off by it.
func limitBody(limit int64, timeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			writeStatus(w, http.StatusRequestEntityTooLarge, tooLarge(limit))
			return
		}
		body := &countingBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit), max: limit}
		if hasBody(r) {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
				body.read = func() { _ = rc.SetReadDeadline(time.Time{}) }
			}
		}
		r.Body = body
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyKey{}, body)))
	})
}

func tooLarge(limit int64) *status.Status {
	return api.NewStatus(codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_REQUEST_TOO_LARGE,
		"request body is larger than the limit of "+strconv.FormatInt(limit, 10)+" bytes")
}

// writeError is the gateway's error handler: the body is the google.rpc.Status
// as JSON (code, message, details with ErrorInfo), the HTTP status follows
// grpc-gateway's mapping except for the cases api.HTTPStatus names.
func writeError(ctx context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
	if b, ok := ctx.Value(bodyKey{}).(*countingBody); ok && b.exceeded.Load() {
		writeStatus(w, http.StatusRequestEntityTooLarge, tooLarge(b.max))
		return
	}
	st := status.Convert(err)
	if st.Code() == codes.InvalidArgument && len(st.Details()) == 0 {
		// The gateway itself rejected the request (malformed JSON, unknown
		// field, bad path parameter): give it the coordd reason too.
		st = api.NewStatus(codes.InvalidArgument, coorddv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, requestError(st.Message()))
	}
	writeStatus(w, api.HTTPStatus(st, runtime.HTTPStatusFromCode), st)
}

func routingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	msg := http.StatusText(httpStatus)
	code := codes.NotFound
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		code = codes.Unimplemented
		msg = "method " + r.Method + " is not allowed on " + r.URL.Path
	case http.StatusNotFound:
		msg = "no such endpoint: " + r.URL.Path
	}
	writeStatus(w, httpStatus, api.NewStatus(code, coorddv1.ErrorReason_ERROR_REASON_UNKNOWN_ROUTE, msg))
}

func writeStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	body := errorBody(httpStatus, st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(body, '\n'))
}
