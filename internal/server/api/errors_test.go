package api

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

func TestToStatus(t *testing.T) {
	tests := []struct {
		name         string
		err          error
		code         codes.Code
		reason       string
		internal     bool
		httpStatus   int
		keepsMessage bool
	}{
		{"invalid", fmt.Errorf("%w: ttl", session.ErrInvalid), codes.InvalidArgument, "INVALID_ARGUMENT", false, 400, true},
		{"too large", fmt.Errorf("%w: owner", session.ErrTooLarge), codes.InvalidArgument, "VALUE_TOO_LARGE", false, 400, true},
		{"not found", fmt.Errorf("%w: 12", session.ErrNotFound), codes.NotFound, "SESSION_NOT_FOUND", false, 404, true},
		{"no leader", fmt.Errorf("%w: nobody leads", election.ErrNoLeader), codes.NotFound, "NO_LEADER", false, 404, true},
		{"not leader", fmt.Errorf("%w: term 5", election.ErrNotLeader), codes.FailedPrecondition, "NOT_LEADER", false, 400, true},
		{"stale term", fmt.Errorf("%w: term 5", election.ErrStaleTerm), codes.Aborted, "STALE_TOKEN", false, 409, true},
		{"already leader", fmt.Errorf("%w: x", election.ErrAlreadyLeader), codes.FailedPrecondition, "ALREADY_LEADER", false, 400, true},
		{"config compacted", fmt.Errorf("%w: revision 3", configcenter.ErrCompacted), codes.OutOfRange, "COMPACTED", false, 410, true},
		{"config revision mismatch", fmt.Errorf("%w: x", configcenter.ErrRevisionMismatch), codes.FailedPrecondition, "REVISION_MISMATCH", false, 400, true},
		{"release not found", fmt.Errorf("%w: 9", configcenter.ErrReleaseNotFound), codes.NotFound, "RELEASE_NOT_FOUND", false, 404, true},
		{"config behind", fmt.Errorf("%w: at 3", configcenter.ErrBehind), codes.Unavailable, "UNAVAILABLE", false, 503, true},
		{"stopping", ErrStopping, codes.Unavailable, "UNAVAILABLE", false, 503, true},
		{"caller deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "DEADLINE_EXCEEDED", false, 504, true},
		{"wait ran out", context.DeadlineExceeded, codes.DeadlineExceeded, "DEADLINE_EXCEEDED", false, 504, false},
		{"caller cancel", context.Canceled, codes.Canceled, "", false, 499, true},
		{"etcd no leader", fmt.Errorf("session: get: %w", rpctypes.ErrNoLeader), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		{"etcd timeout", rpctypes.ErrGRPCTimeout, codes.Unavailable, "UNAVAILABLE", false, 503, false},
		// As the in-process client returns it while members elect a leader
		// (a daemon's start read the page token key so, and retries it).
		{"etcd timeout, client error", fmt.Errorf("page token key: %w", rpctypes.ErrTimeout), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		{"etcd no space", fmt.Errorf("session: grant lease: %w", rpctypes.ErrGRPCNoSpace), codes.ResourceExhausted, "NO_SPACE", false, 507, false},
		{"etcd no space, client error", fmt.Errorf("lock: enqueue: %w", rpctypes.ErrNoSpace), codes.ResourceExhausted, "NO_SPACE", false, 507, false},
		{"etcd overloaded", rpctypes.ErrGRPCRequestTooManyRequests, codes.Unavailable, "UNAVAILABLE", false, 503, false},
		// As the etcd client returns it (found closing 10,000 sessions at once).
		{"etcd overloaded, client error", fmt.Errorf("session: close 1: %w", rpctypes.ErrTooManyRequests), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		// As the in-process etcd client returns it while its member stops.
		{"etcd raft stopped", fmt.Errorf("session: grant lease: %w", status.Error(codes.Unknown, "raft: stopped")), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		{"etcd raft proposal dropped", fmt.Errorf("lock: release: %w", status.Error(codes.Unknown, "raft proposal dropped")), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		// A set's acquisition whose giving back failed too: the retry
		// with the same request id resumes the grants left behind.
		{"etcd raft proposal dropped, twice", fmt.Errorf("lock: taking %q of a set of 2: %w (and giving back the locks of the set already taken failed: %w)", "b",
			status.Error(codes.Unknown, "raft proposal dropped"), status.Error(codes.Unknown, "raft proposal dropped")), codes.Unavailable, "UNAVAILABLE", false, 503, false},
		{"adapter status kept", NewStatus(codes.ResourceExhausted, 3, "message too large").Err(), codes.ResourceExhausted, "REQUEST_TOO_LARGE", false, 429, false},
		{"unexpected", errors.New("boom: disk on fire"), codes.Internal, "INTERNAL", true, 500, false},
		{"compacted", NewStatus(codes.OutOfRange, 12, "compacted").Err(), codes.OutOfRange, "COMPACTED", false, 410, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, internal := ToStatus(tt.err)
			if st.Code() != tt.code || internal != tt.internal {
				t.Fatalf("ToStatus(%v) = %s internal=%v, want %s internal=%v", tt.err, st.Code(), internal, tt.code, tt.internal)
			}
			if got := reasonOf(st); got != tt.reason {
				t.Errorf("reason = %q, want %q", got, tt.reason)
			}
			if got := HTTPStatus(st, runtime.HTTPStatusFromCode); got != tt.httpStatus {
				t.Errorf("HTTP status = %d, want %d", got, tt.httpStatus)
			}
			if internal && st.Message() == tt.err.Error() {
				t.Errorf("internal error leaked its details to the caller: %q", st.Message())
			}
			if tt.keepsMessage && st.Message() != tt.err.Error() && tt.code != codes.OutOfRange {
				t.Errorf("message = %q, want %q", st.Message(), tt.err.Error())
			}
		})
	}
}

func TestUnaryErrorsRecoversPanics(t *testing.T) {
	intercept := UnaryErrors(zap.NewNop())
	_, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"},
		func(context.Context, any) (any, error) { panic("bad input reached a nil map") })
	if status.Code(err) != codes.Internal || reasonOf(status.Convert(err)) != "INTERNAL" {
		t.Fatalf("panicking handler returned %v, want Internal/INTERNAL", err)
	}
	_, err = intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"},
		func(context.Context, any) (any, error) { return nil, session.ErrNotFound })
	if status.Code(err) != codes.NotFound {
		t.Fatalf("domain error mapped to %v, want NotFound", err)
	}
}

// Every kind has one row in the status table, and every ErrorReason is sent
// by some path: a row, or the statuses built outside the table (INTERNAL by
// the interceptors, REQUEST_TOO_LARGE by the gateway, DEADLINE_EXCEEDED by
// ToStatus for context deadlines, NO_SPACE by ToStatus for etcd's).
func TestErrorTableCoversEveryKindAndReason(t *testing.T) {
	rows := map[*errkind.Kind]int{}
	sent := map[coorddv1.ErrorReason]bool{
		coorddv1.ErrorReason_ERROR_REASON_INTERNAL:          true,
		coorddv1.ErrorReason_ERROR_REASON_REQUEST_TOO_LARGE: true,
		coorddv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED: true,
		coorddv1.ErrorReason_ERROR_REASON_NO_SPACE:          true,
		coorddv1.ErrorReason_ERROR_REASON_UNKNOWN_ROUTE:     true,
	}
	for _, r := range codeReasons {
		sent[r] = true
	}
	for _, row := range errorTable {
		rows[row.kind]++
		sent[row.reason] = true
	}
	for _, k := range errkind.All {
		if rows[k] != 1 {
			t.Errorf("kind %q has %d rows in errorTable, want 1", k, rows[k])
		}
	}
	for v, name := range coorddv1.ErrorReason_name {
		r := coorddv1.ErrorReason(v)
		if r != coorddv1.ErrorReason_ERROR_REASON_UNSPECIFIED && !sent[r] {
			t.Errorf("reason %s is never sent: add a kind and a row for it, or remove it", name)
		}
	}
}

// Every domain sentinel reaches callers with its own reason, whichever
// package returned it.
func TestDomainSentinelsMapToTheirReason(t *testing.T) {
	tests := []struct {
		err    error
		reason string
	}{
		{session.ErrInvalid, "INVALID_ARGUMENT"},
		{session.ErrTooLarge, "VALUE_TOO_LARGE"},
		{session.ErrNotFound, "SESSION_NOT_FOUND"},
		{lock.ErrInvalid, "INVALID_ARGUMENT"},
		{lock.ErrTooLarge, "VALUE_TOO_LARGE"},
		{lock.ErrSessionNotFound, "SESSION_NOT_FOUND"},
		{lock.ErrHeld, "LOCK_HELD"},
		{lock.ErrStaleToken, "STALE_TOKEN"},
		{lock.ErrNotHolder, "NOT_HOLDER"},
		{lock.ErrLimitMismatch, "LIMIT_MISMATCH"},
		{election.ErrInvalid, "INVALID_ARGUMENT"},
		{election.ErrTooLarge, "VALUE_TOO_LARGE"},
		{election.ErrSessionNotFound, "SESSION_NOT_FOUND"},
		{election.ErrNoLeader, "NO_LEADER"},
		{election.ErrNotLeader, "NOT_LEADER"},
		{election.ErrStaleTerm, "STALE_TOKEN"},
		{election.ErrAlreadyLeader, "ALREADY_LEADER"},
		{configcenter.ErrInvalid, "INVALID_ARGUMENT"},
		{configcenter.ErrTooLarge, "VALUE_TOO_LARGE"},
		{configcenter.ErrValidation, "VALIDATION_FAILED"},
		{configcenter.ErrRevisionMismatch, "REVISION_MISMATCH"},
		{configcenter.ErrKeyNotFound, "KEY_NOT_FOUND"},
		{configcenter.ErrReleaseNotFound, "RELEASE_NOT_FOUND"},
		{configcenter.ErrCompacted, "COMPACTED"},
		{configcenter.ErrBehind, "UNAVAILABLE"},
		{configcenter.ErrStopped, "UNAVAILABLE"},
		{ErrStopping, "UNAVAILABLE"},
		{ErrNoQuorum, "UNAVAILABLE"},
		{ErrLeaderChanged, "UNAVAILABLE"},
		{invalid("page_size must be 1 to 100"), "INVALID_ARGUMENT"},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			st, internal := ToStatus(fmt.Errorf("call: %w", tt.err))
			if internal || reasonOf(st) != tt.reason {
				t.Fatalf("ToStatus(%v) = %s %q internal=%v, want reason %q", tt.err, st.Code(), reasonOf(st), internal, tt.reason)
			}
		})
	}
}

// fakeStream is a server stream with only a context.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

// A stream handler that fails because its client left (a send on the
// closing transport) ends Canceled and logs nothing at error level; the
// same failure while the client is there is an internal error, logged.
func TestStreamErrorsAfterTheClientLeft(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	interceptor := StreamErrors(zap.New(core))
	info := &grpc.StreamServerInfo{FullMethod: "/coordd.v1.SessionService/KeepAliveStream"}
	closing := func(any, grpc.ServerStream) error {
		return errors.New("connection error: desc = \"transport is closing\"")
	}

	left, cancel := context.WithCancel(t.Context())
	cancel()
	if err := interceptor(nil, fakeStream{ctx: left}, info, closing); status.Code(err) != codes.Canceled {
		t.Fatalf("after the client left: %v, want Canceled", err)
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("after the client left: %d error lines logged, want none: %v", n, logs.All())
	}
	if err := interceptor(nil, fakeStream{ctx: t.Context()}, info, closing); status.Code(err) != codes.Internal {
		t.Fatalf("with the client there: %v, want Internal", err)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("with the client there: %d error lines logged, want 1", n)
	}
}

// The Unknown errors mapped by message are raft's own: a raft upgrade that
// renamed them would turn a member's graceful stop into INTERNAL errors.
func TestRaftMessagesAreRafts(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{raft.ErrStopped, raftStopped},
		{raft.ErrProposalDropped, raftProposalDropped},
	} {
		if c.err.Error() != c.want {
			t.Errorf("raft's message is %q, the mapping expects %q", c.err.Error(), c.want)
		}
	}
}
