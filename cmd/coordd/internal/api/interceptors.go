package api

import (
	"context"
	"runtime/debug"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"go.uber.org/zap"
	"google.golang.org/grpc"
)

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
		if err != nil {
			err = mapAndLog(lg, info.FullMethod, err)
		}
		return resp, err
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
