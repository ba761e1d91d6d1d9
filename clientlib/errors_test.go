package clientlib

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

func statusErr(t *testing.T, code codes.Code, reason string) error {
	t.Helper()
	st := status.New(code, "msg")
	if reason != "" {
		var err error
		if st, err = st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "coordd"}); err != nil {
			t.Fatal(err)
		}
	}
	return st.Err()
}

func TestConvert(t *testing.T) {
	tests := []struct {
		code   codes.Code
		reason string
		want   error
	}{
		{codes.NotFound, "SESSION_NOT_FOUND", ErrSessionNotFound},
		{codes.InvalidArgument, "INVALID_ARGUMENT", ErrInvalidArgument},
		{codes.InvalidArgument, "VALUE_TOO_LARGE", ErrValueTooLarge},
		{codes.InvalidArgument, "REQUEST_TOO_LARGE", ErrRequestTooLarge},
		{codes.Aborted, "LOCK_HELD", ErrLockHeld},
		{codes.Aborted, "STALE_TOKEN", ErrStaleToken},
		{codes.FailedPrecondition, "NOT_HOLDER", ErrNotHolder},
		{codes.OutOfRange, "COMPACTED", ErrCompacted},
		{codes.Unavailable, "UNAVAILABLE", ErrUnavailable},
		{codes.Unavailable, "", ErrUnavailable},           // a transport failure has no reason
		{codes.ResourceExhausted, "", ErrRequestTooLarge}, // gRPC's own message size limit
		{codes.Internal, "INTERNAL", ErrInternal},
	}
	for _, tt := range tests {
		t.Run(tt.code.String()+"/"+tt.reason, func(t *testing.T) {
			err := convert(context.Background(), statusErr(t, tt.code, tt.reason))
			if !errors.Is(err, tt.want) {
				t.Fatalf("convert = %v, want errors.Is %v", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tt.code {
				t.Fatalf("convert = %#v, want *Error with code %s", err, tt.code)
			}
			if errors.Is(err, ErrInternal) != errors.Is(tt.want, ErrInternal) {
				t.Fatalf("%v matches the wrong sentinel", err)
			}
		})
	}

	// The caller's own deadline comes back as the context error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := convert(ctx, status.Error(codes.Canceled, "context canceled")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call = %v, want context.Canceled", err)
	}
}

// pastDeadline is a context whose deadline has passed but whose own timer
// has not fired yet: what a caller sees when the server's RST_STREAM for
// the deadline arrives first.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// The server may end a call for the caller's deadline before the caller's
// timer fires; that is still a deadline, never a cancel.
func TestConvertDeadlineSeenByServerFirst(t *testing.T) {
	rst := status.Error(codes.Canceled, "stream terminated by RST_STREAM with error code: CANCEL")
	if err := convert(pastDeadline{context.Background()}, rst); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("convert = %v, want context.DeadlineExceeded", err)
	}
	// Without a passed deadline a server-side cancel stays what it is.
	future, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := convert(future, rst); errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("convert with a live context = %v, want the server's error", err)
	}
}

// Every reason the server can send has a sentinel, and each sentinel
// matches only its own reason.
func TestEveryReasonHasASentinel(t *testing.T) {
	for v, name := range coorddv1.ErrorReason_name {
		if coorddv1.ErrorReason(v) == coorddv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			continue
		}
		reason := strings.TrimPrefix(name, "ERROR_REASON_")
		var match []error
		for _, s := range reasonSentinels {
			if errors.Is(convert(context.Background(), statusErr(t, codes.Unknown, reason)), s) {
				match = append(match, s)
			}
		}
		if len(match) != 1 {
			t.Errorf("reason %s matches %d sentinels %v, want exactly 1", reason, len(match), match)
		}
	}
}
