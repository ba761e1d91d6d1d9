package api

import (
	"context"
	"errors"
	"runtime/debug"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"

	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// UnaryArrival notes in each call's context that the call arrived now, with
// arrived (groupcommit.Committer.Arrived), before any other interceptor can
// make it wait: an acquisition or campaign takes over only an entry written
// before it arrived.
func UnaryArrival(arrived func(context.Context) context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(arrived(ctx), req)
	}
}

// UnaryErrors maps handler errors through ToStatus, logs each error once
// (Internal at error level, the rest at debug), and turns a panic into
// Internal so no request can crash the daemon.
func UnaryErrors(lg *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				lg.Error("panic in handler", zap.String("method", info.FullMethod), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				resp, err = nil, errInternal().Err()
			}
		}()
		resp, err = handler(ctx, req)
		return afterward(resp, err, func(resp any, err error) (any, error) {
			if err != nil {
				err = mapAndLog(lg, info.FullMethod, err)
			}
			return resp, err
		})
	}
}

// StreamErrors is UnaryErrors for streaming calls.
func StreamErrors(lg *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				lg.Error("panic in stream handler", zap.String("method", info.FullMethod), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				err = errInternal().Err()
			}
		}()
		if err = handler(srv, ss); err != nil {
			if cerr := ss.Context().Err(); cerr != nil {
				// The client left (it cancelled the stream or closed its
				// connection): what the handler ran into then, such as a
				// send on the closing transport, is its leaving.
				err = cerr
			}
			err = mapAndLog(lg, info.FullMethod, err)
		}
		return err
	}
}

func mapAndLog(lg *zap.Logger, method string, err error) error {
	st, internal := ToStatus(err)
	if internal {
		lg.Error("request failed", zap.String("method", method), zap.Error(err))
	} else if ce := lg.Check(zap.DebugLevel, "request failed"); ce != nil {
		ce.Write(zap.String("method", method), zap.String("code", st.Code().String()), zap.Error(err))
	}
	return st.Err()
}

func errInternal() *status.Status {
	return NewStatus(codes.Internal, coorddv1.ErrorReason_ERROR_REASON_INTERNAL, "internal error; the daemon logged the details")
}

// UnaryRequireLeader ends a call with ErrNoQuorum when lost() is (or
// becomes) done: the member lost its etcd leader, and waiting on it would
// hang. Place it inside UnaryErrors so the error gets its status.
func UnaryRequireLeader(lost func() context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, healthService) {
			return handler(ctx, req) // it answers NOT_SERVING itself
		}
		ctx, done, err := requireLeader(ctx, lost())
		if err != nil {
			return nil, err
		}
		resp, err := handler(ctx, req)
		if l, ok := resp.(*later); ok && err == nil {
			// A parked call's wait ends with its stream, which ends with
			// ErrNoQuorum too (StreamRequireLeader): nothing to keep.
			_ = done(nil)
			return l, nil
		}
		return resp, done(err)
	}
}

// healthService is the gRPC health service's method prefix. Its calls are
// never ended for a missing leader: the status they report (NOT_SERVING
// while the member has no leader) is how clients learn it.
const healthService = "/grpc.health.v1.Health/"

// IsReflection reports whether method is gRPC server reflection's (v1 or
// v1alpha): what grpcurl and other tools ask for the services and
// messages. It reads only the daemon's compiled-in schema.
func IsReflection(method string) bool {
	return strings.HasPrefix(method, "/grpc.reflection.v1.ServerReflection/") ||
		strings.HasPrefix(method, "/grpc.reflection.v1alpha.ServerReflection/")
}

// StreamRequireLeader is UnaryRequireLeader for streams.
func StreamRequireLeader(lost func() context.Context) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, healthService) {
			return handler(srv, ss) // Watch reports NOT_SERVING itself
		}
		if IsReflection(info.FullMethod) {
			return handler(srv, ss) // the schema needs no etcd
		}
		ctx, done, err := requireLeader(ss.Context(), lost())
		if err != nil {
			return err
		}
		return done(handler(srv, &ctxStream{ServerStream: ss, ctx: ctx}))
	}
}

// requireLeader derives a context that ends when lost does, and returns a
// func that turns the call's error into ErrNoQuorum if that is why it ended
// (and releases the context).
func requireLeader(ctx, lost context.Context) (context.Context, func(error) error, error) {
	if lost.Err() != nil {
		return nil, nil, ErrNoQuorum
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lost, func() { cancel(ErrNoQuorum) })
	return ctx, func(err error) error {
		stop()
		if err != nil && errors.Is(context.Cause(ctx), ErrNoQuorum) {
			err = ErrNoQuorum
		}
		cancel(nil)
		return err
	}, nil
}

// ctxStream replaces a server stream's context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
