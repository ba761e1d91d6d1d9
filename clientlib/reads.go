package clientlib

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// readMethods are the unary calls that only read: repeating one changes
// nothing, so the client repeats those that fail with UNAVAILABLE (see
// retryReads). The cluster's own status calls are not among them: they
// report a cluster without quorum at once, for an operator to see.
var readMethods = map[string]bool{
	coorddv1.BarrierService_DescribeBarrier_FullMethodName:     true,
	coorddv1.ConfigService_Get_FullMethodName:                  true,
	coorddv1.ConfigService_Snapshot_FullMethodName:             true,
	coorddv1.ConfigService_Poll_FullMethodName:                 true,
	coorddv1.ConfigService_ListReleases_FullMethodName:         true,
	coorddv1.ConfigService_Diff_FullMethodName:                 true,
	coorddv1.ConfigService_GetSchema_FullMethodName:            true,
	coorddv1.ConfigService_ListNamespaces_FullMethodName:       true,
	coorddv1.ConfigService_GetApplyStatus_FullMethodName:       true,
	coorddv1.ConfigService_GetGray_FullMethodName:              true,
	coorddv1.ConfigService_ListGrayReleases_FullMethodName:     true,
	coorddv1.ConfigService_GetApprovalPolicy_FullMethodName:    true,
	coorddv1.ConfigService_ListProposals_FullMethodName:        true,
	coorddv1.ConfigService_GetProposal_FullMethodName:          true,
	coorddv1.ElectionService_Leader_FullMethodName:             true,
	coorddv1.ElectionService_Candidates_FullMethodName:         true,
	coorddv1.ElectionService_ListElections_FullMethodName:      true,
	coorddv1.HistoryService_ListLockHistory_FullMethodName:     true,
	coorddv1.HistoryService_ListElectionHistory_FullMethodName: true,
	coorddv1.KVService_GetKV_FullMethodName:                    true,
	coorddv1.KVService_ListKV_FullMethodName:                   true,
	coorddv1.LockService_DescribeLock_FullMethodName:           true,
	coorddv1.LockService_ListLocks_FullMethodName:              true,
	coorddv1.LockService_ValidateFence_FullMethodName:          true,
	coorddv1.SessionService_GetSession_FullMethodName:          true,
	coorddv1.SessionService_ListSessions_FullMethodName:        true,
}

// orphanMethods are the unary calls that are not reads but whose repeat
// after an answer that was lost can only leave an orphan behind that ends
// by itself: a CreateSession that took effect though its caller heard
// UNAVAILABLE (etcd's leader changed while it was in flight) leaves a
// session that nobody renews, holds nothing and ends with its TTL. So a
// session is created again, as a read is read again (see retryReads),
// rather than making every caller retry a refusal that usually had no
// effect at all (no quorum yet, the member stopping).
var orphanMethods = map[string]bool{
	coorddv1.SessionService_CreateSession_FullMethodName: true,
}

// readRetryFor bounds how long a read is repeated: long enough to ride
// out etcd electing a leader (about a second at etcd's default timings)
// or the client moving to another member; short enough that a cluster
// without quorum is reported as such, not as the caller's deadline.
const readRetryFor = 5 * time.Second

// retryReads is the connection's outer unary interceptor: a read (see
// readMethods) or a CreateSession (see orphanMethods) that fails with UNAVAILABLE (a member stopping, etcd's
// leader changing during the call, no quorum yet, the client leaving a
// silent member) is made again after a short backoff, for up to
// readRetryFor or until ctx ends, whichever is first; then its last
// UNAVAILABLE answer is returned (also when ctx ends during a retry). Every other call goes through once: writes retry
// where they are idempotent (see retry).
func retryReads(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if !readMethods[method] && !orphanMethods[method] {
		return err
	}
	deadline := time.Now().Add(readRetryFor)
	backoff := 50 * time.Millisecond
	for status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		wait := jittered(backoff)
		if time.Now().Add(wait).After(deadline) || !pause(ctx, wait) {
			return err
		}
		backoff = min(2*backoff, time.Second)
		unavailable := err
		if err = invoker(ctx, method, req, reply, cc, opts...); err != nil && ctx.Err() != nil {
			// The caller's deadline cut the retry short: say why it was
			// retried (the member was unavailable), not that time ran out.
			return unavailable
		}
	}
	return err
}
