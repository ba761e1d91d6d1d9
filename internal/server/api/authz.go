package api

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/base/errkind"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// rpcRule says which action an RPC is and which names it acts on.
type rpcRule struct {
	action auth.Action
	// names returns the resources a request message names (nil for
	// actions about no name). Streams are checked message by message.
	names func(msg any) []auth.Resource
	// owned, when set, names the session whose things the request acts
	// on: only that session's principal (or one allowed cluster.admin)
	// may make it.
	owned func(msg any) ownedRef
	// reveals, when set, says whether a request asks for secret config
	// values in clear: it then needs config.read-secret on every name as
	// well, and is audited as that action.
	reveals func(msg any) bool
	// refusesOne says that a message the policy refuses ends only what it
	// asked for, not the stream: RecvMsg returns a *MessageRefused, which
	// the handler reports for that message and reads on.
	refusesOne bool
	// perCall says that each message of the stream is a call of another
	// RPC (SessionService.Calls), which the stream's handler runs through
	// the unary interceptors, so it is authorized, rate limited and
	// audited as that RPC: the stream itself is authenticated, and
	// authorized for its action, once, as it opens.
	perCall bool
}

// ownedRef is what a request acts on that belongs to a session: the
// session itself, or the grant or term a token names.
type ownedRef struct {
	session        string
	batch          []string // more sessions (a batch of renewals)
	lock, election string
	token          int64
	// gone is the answer when the grant or term that token names does not
	// hold at the check: the call's own answer to it. Letting such a call
	// through would let a caller name a token before it is granted: tokens
	// are predictable revisions, and one granted to another principal
	// between the check and the call would be acted on unchecked.
	gone *errkind.Kind
}

func bySession[T any](id func(T) string) func(any) ownedRef {
	return func(msg any) ownedRef {
		m, _ := msg.(T)
		return ownedRef{session: id(m)}
	}
}

// renewedSessions names the sessions a keep-alive stream message renews
// or watches: its session_id and its batch.
func renewedSessions(msg any) ownedRef {
	m, _ := msg.(*coorddv1.KeepAliveStreamRequest)
	return ownedRef{session: m.GetSessionId(), batch: m.GetSessionIds()}
}

// byFence names the grant or term a fenced write's token is.
func byFence[T interface {
	GetLock() string
	GetElection() string
	GetToken() int64
}](msg any) ownedRef {
	m, ok := msg.(T)
	if !ok {
		return ownedRef{}
	}
	if m.GetElection() != "" {
		return ownedRef{election: m.GetElection(), token: m.GetToken(), gone: errkind.StaleToken}
	}
	return ownedRef{lock: m.GetLock(), token: m.GetToken(), gone: errkind.StaleToken}
}

// named builds a names func for requests of type T naming one resource.
func named[T any](kind auth.Kind, name func(T) string) func(any) []auth.Resource {
	return func(msg any) []auth.Resource {
		m, ok := msg.(T)
		if !ok {
			return nil
		}
		return []auth.Resource{{Kind: kind, Name: name(m)}}
	}
}

// listed builds a names func for listings of the names under a prefix.
func listed[T any](kind auth.Kind, prefix func(T) string) func(any) []auth.Resource {
	return func(msg any) []auth.Resource {
		m, ok := msg.(T)
		if !ok {
			return nil
		}
		return []auth.Resource{{Kind: kind, Name: prefix(m), Prefix: true}}
	}
}

// historyOf names what a history listing reads: its lock or election, or
// with no name every one of its kind.
func historyOf[T any](kind auth.Kind, name func(T) string) func(any) []auth.Resource {
	return func(msg any) []auth.Resource {
		m, ok := msg.(T)
		if !ok {
			return nil
		}
		if n := name(m); n != "" {
			return []auth.Resource{{Kind: kind, Name: n}}
		}
		return []auth.Resource{{Kind: kind, Prefix: true}}
	}
}

// namespaces builds a names func for requests naming several namespaces.
func namespaces[T any](names func(T) []string) func(any) []auth.Resource {
	return func(msg any) []auth.Resource {
		m, ok := msg.(T)
		if !ok {
			return nil
		}
		ns := names(m)
		out := make([]auth.Resource, 0, len(ns))
		for _, n := range ns {
			out = append(out, auth.Resource{Kind: auth.Namespace, Name: n})
		}
		return out
	}
}

// fence names what a fenced call is checked against: its lock, or its
// election.
func fence(lock, election string) auth.Resource {
	if election != "" {
		return auth.Resource{Kind: auth.Election, Name: election}
	}
	return auth.Resource{Kind: auth.Lock, Name: lock}
}

const (
	sessionSvc  = "/coordd.v1.SessionService/"
	lockSvc     = "/coordd.v1.LockService/"
	barrierSvc  = "/coordd.v1.BarrierService/"
	historySvc  = "/coordd.v1.HistoryService/"
	trendSvc    = "/coordd.v1.TrendService/"
	electionSvc = "/coordd.v1.ElectionService/"
	configSvc   = "/coordd.v1.ConfigService/"
	clusterSvc  = "/coordd.v1.ClusterService/"
	kvSvc       = "/coordd.v1.KVService/"
)

func rule(a auth.Action, names func(any) []auth.Resource, owned ...func(any) ownedRef) rpcRule {
	r := rpcRule{action: a, names: names}
	if len(owned) > 0 {
		r.owned = owned[0]
	}
	return r
}

// revealing marks a rule's requests of type T that ask for secrets in
// clear.
func revealing[T any](r rpcRule, reveal func(T) bool) rpcRule {
	r.reveals = func(msg any) bool {
		m, ok := msg.(T)
		return ok && reveal(m)
	}
	return r
}

func refusingOne(r rpcRule) rpcRule {
	r.refusesOne = true
	return r
}

// MessageRefused is what a stream's RecvMsg returns for a message the
// policy refused, on a stream whose rule refuses one message at a time:
// Msg (decoded) was refused with Err, and the stream goes on.
type MessageRefused struct {
	Msg any
	Err error
}

func (e *MessageRefused) Error() string { return e.Err.Error() }
func (e *MessageRefused) Unwrap() error { return e.Err }

// rpcTable maps every RPC of coordd's API to its action and the names it
// acts on. It is the only place where that is decided; a test fails when an
// RPC is missing from it, and an RPC missing from it is denied once a
// policy is in force.
var rpcTable = map[string]rpcRule{
	sessionSvc + "CreateSession":   {action: auth.Session},
	sessionSvc + "GetSession":      {action: auth.Session},
	sessionSvc + "ListSessions":    {action: auth.Session},
	sessionSvc + "KeepAlive":       {action: auth.Session, owned: bySession((*coorddv1.KeepAliveRequest).GetSessionId)},
	sessionSvc + "KeepAliveStream": {action: auth.Session, owned: renewedSessions},
	sessionSvc + "CloseSession":    {action: auth.Session, owned: bySession((*coorddv1.CloseSessionRequest).GetSessionId)},
	sessionSvc + "Calls":           {action: auth.Session, perCall: true},

	lockSvc + "Acquire":    rule(auth.LockAcquire, named(auth.Lock, (*coorddv1.AcquireRequest).GetName), bySession((*coorddv1.AcquireRequest).GetSessionId)),
	lockSvc + "TryAcquire": rule(auth.LockAcquire, named(auth.Lock, (*coorddv1.TryAcquireRequest).GetName), bySession((*coorddv1.TryAcquireRequest).GetSessionId)),
	// A lock's history needs the right to describe it; without a name,
	// every lock's (an election's: to observe it).
	historySvc + "ListLockHistory":     rule(auth.LockDescribe, historyOf(auth.Lock, (*coorddv1.ListLockHistoryRequest).GetName)),
	historySvc + "ListElectionHistory": rule(auth.ElectionObserve, historyOf(auth.Election, (*coorddv1.ListElectionHistoryRequest).GetName)),
	// A barrier's rights are those of the lock of its name.
	barrierSvc + "EnterBarrier":    rule(auth.LockAcquire, named(auth.Lock, (*coorddv1.EnterBarrierRequest).GetName), bySession((*coorddv1.EnterBarrierRequest).GetSessionId)),
	barrierSvc + "LeaveBarrier":    rule(auth.LockAcquire, named(auth.Lock, (*coorddv1.LeaveBarrierRequest).GetName), bySession((*coorddv1.LeaveBarrierRequest).GetSessionId)),
	barrierSvc + "OpenBarrier":     rule(auth.LockAcquire, named(auth.Lock, (*coorddv1.OpenBarrierRequest).GetName)),
	barrierSvc + "DescribeBarrier": rule(auth.LockDescribe, named(auth.Lock, (*coorddv1.DescribeBarrierRequest).GetName)),
	// Every lock of the set must be allowed.
	lockSvc + "AcquireAll": rule(auth.LockAcquire, func(msg any) []auth.Resource {
		m, _ := msg.(*coorddv1.AcquireAllRequest)
		out := make([]auth.Resource, 0, len(m.GetNames()))
		for _, n := range m.GetNames() {
			out = append(out, auth.Resource{Kind: auth.Lock, Name: n})
		}
		return out
	}, bySession((*coorddv1.AcquireAllRequest).GetSessionId)),
	// A release that names its session and request id (the SDK always
	// does) can only remove that session's entry, so the session is
	// checked; any other release acts on whoever holds the token, so the
	// grant's session is read and checked, whatever session it names.
	lockSvc + "Release": rule(auth.LockRelease, named(auth.Lock, (*coorddv1.ReleaseRequest).GetName), func(msg any) ownedRef {
		m, _ := msg.(*coorddv1.ReleaseRequest)
		if m.GetSessionId() != "" && m.GetRequestId() != "" {
			return ownedRef{session: m.GetSessionId()}
		}
		return ownedRef{lock: m.GetName(), token: m.GetToken(), gone: errkind.NotHolder}
	}),
	lockSvc + "DescribeLock": rule(auth.LockDescribe, named(auth.Lock, (*coorddv1.DescribeLockRequest).GetName)),
	lockSvc + "WatchLock":    rule(auth.LockDescribe, named(auth.Lock, (*coorddv1.WatchLockRequest).GetName)),
	lockSvc + "ListLocks":    rule(auth.LockDescribe, listed(auth.Lock, (*coorddv1.ListLocksRequest).GetPrefix)),
	// Validating a token says whether it holds: a read of the lock or
	// the election.
	lockSvc + "ValidateFence": rule(auth.LockDescribe, func(msg any) []auth.Resource {
		m, _ := msg.(*coorddv1.ValidateFenceRequest)
		if m.GetElection() != "" {
			return []auth.Resource{fence("", m.GetElection())}
		}
		return []auth.Resource{fence(m.GetName(), "")}
	}),
	// A fenced write is judged on its key, and its token must be a grant
	// or term of the caller's own session: a token alone (read from a
	// log, say) is not a capability.
	lockSvc + "FencedPut":    rule(auth.KVFenced, named(auth.Key, (*coorddv1.FencedPutRequest).GetKey), byFence[*coorddv1.FencedPutRequest]),
	lockSvc + "FencedDelete": rule(auth.KVFenced, named(auth.Key, (*coorddv1.FencedDeleteRequest).GetKey), byFence[*coorddv1.FencedDeleteRequest]),

	kvSvc + "GetKV":   rule(auth.KVRead, named(auth.Key, (*coorddv1.GetKVRequest).GetKey)),
	kvSvc + "ListKV":  rule(auth.KVRead, listed(auth.Key, (*coorddv1.ListKVRequest).GetPrefix)),
	kvSvc + "WatchKV": rule(auth.KVRead, listed(auth.Key, (*coorddv1.WatchKVRequest).GetPrefix)),

	electionSvc + "Campaign": rule(auth.ElectionCampaign, named(auth.Election, (*coorddv1.CampaignRequest).GetName), bySession((*coorddv1.CampaignRequest).GetSessionId)),
	electionSvc + "Proclaim": rule(auth.ElectionCampaign, named(auth.Election, (*coorddv1.ProclaimRequest).GetName), func(msg any) ownedRef {
		m, _ := msg.(*coorddv1.ProclaimRequest)
		return ownedRef{election: m.GetName(), token: m.GetTerm(), gone: errkind.NotLeader}
	}),
	// As Release: the hinted session and request id, whose key the
	// resignation compares, or else the term's session.
	electionSvc + "Resign": rule(auth.ElectionCampaign, named(auth.Election, (*coorddv1.ResignRequest).GetName), func(msg any) ownedRef {
		m, _ := msg.(*coorddv1.ResignRequest)
		if m.GetSessionId() != "" && m.GetRequestId() != "" {
			return ownedRef{session: m.GetSessionId()}
		}
		return ownedRef{election: m.GetName(), token: m.GetTerm(), gone: errkind.NotLeader}
	}),
	// By the term alone: the hint only tells the stream to stop following.
	electionSvc + "Transfer": rule(auth.ElectionCampaign, named(auth.Election, (*coorddv1.TransferRequest).GetName), func(msg any) ownedRef {
		m, _ := msg.(*coorddv1.TransferRequest)
		return ownedRef{election: m.GetName(), token: m.GetTerm(), gone: errkind.NotLeader}
	}),
	electionSvc + "Leader":        rule(auth.ElectionObserve, named(auth.Election, (*coorddv1.LeaderRequest).GetName)),
	electionSvc + "Candidates":    rule(auth.ElectionObserve, named(auth.Election, (*coorddv1.CandidatesRequest).GetName)),
	electionSvc + "ListElections": rule(auth.ElectionObserve, listed(auth.Election, (*coorddv1.ListElectionsRequest).GetPrefix)),
	electionSvc + "Observe":       rule(auth.ElectionObserve, named(auth.Election, (*coorddv1.ObserveRequest).GetName)),

	configSvc + "Put":              rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.PutRequest).GetNamespace)),
	configSvc + "Delete":           rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.DeleteRequest).GetNamespace)),
	configSvc + "Publish":          rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.PublishRequest).GetNamespace)),
	configSvc + "Get":              revealing(rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetRequest).GetNamespace)), (*coorddv1.GetRequest).GetRevealSecrets),
	configSvc + "Snapshot":         revealing(rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.SnapshotRequest).GetNamespace)), (*coorddv1.SnapshotRequest).GetRevealSecrets),
	configSvc + "Poll":             revealing(rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.PollRequest).GetNamespace)), (*coorddv1.PollRequest).GetRevealSecrets),
	configSvc + "ListReleases":     rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.ListReleasesRequest).GetNamespace)),
	configSvc + "Diff":             rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.DiffRequest).GetNamespace)),
	configSvc + "Rollback":         rule(auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.RollbackRequest).GetNamespace)),
	configSvc + "GetSchema":        rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetSchemaRequest).GetNamespace)),
	configSvc + "SetSchema":        rule(auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.SetSchemaRequest).GetNamespace)),
	configSvc + "CreateGray":       rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.CreateGrayRequest).GetNamespace)),
	configSvc + "UpdateGray":       rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.UpdateGrayRequest).GetNamespace)),
	configSvc + "PromoteGray":      rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.PromoteGrayRequest).GetNamespace)),
	configSvc + "AbandonGray":      rule(auth.ConfigWrite, named(auth.Namespace, (*coorddv1.AbandonGrayRequest).GetNamespace)),
	configSvc + "GetGray":          rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetGrayRequest).GetNamespace)),
	configSvc + "ListGrayReleases": rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.ListGrayReleasesRequest).GetNamespace)),
	configSvc + "ListNamespaces":   rule(auth.ConfigRead, listed(auth.Namespace, (*coorddv1.ListNamespacesRequest).GetPrefix)),
	// A subscriber reports what it applied of namespaces it reads.
	configSvc + "ReportStatus": rule(auth.ConfigRead, namespaces(func(m *coorddv1.ReportStatusRequest) []string {
		out := make([]string, 0, len(m.GetNamespaces()))
		for _, n := range m.GetNamespaces() {
			out = append(out, n.GetNamespace())
		}
		return out
	})),
	configSvc + "GetApplyStatus": rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetApplyStatusRequest).GetNamespace)),
	configSvc + "Watch":          revealing(rule(auth.ConfigRead, namespaces((*coorddv1.WatchRequest).GetNamespaces)), (*coorddv1.WatchRequest).GetRevealSecrets),
	// Each start message of the stream names its namespaces; a stop
	// names none.
	// A refused start refuses that watch alone: the stream's other
	// watches go on.
	configSvc + "WatchMany": refusingOne(revealing(rule(auth.ConfigRead, namespaces(func(m *coorddv1.WatchManyRequest) []string { return m.GetStart().GetNamespaces() })),
		func(m *coorddv1.WatchManyRequest) bool { return m.GetStart().GetRevealSecrets() })),
	// Rewrapping the namespaces' data keys is key management: an
	// operator's.
	configSvc + "RewrapSecretKeys": {action: auth.ClusterAdmin},
	// Four eyes: who proposes and who approves are different rights; the
	// store refuses a proposer's approval of their own.
	configSvc + "SetApprovalPolicy": rule(auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.SetApprovalPolicyRequest).GetNamespace)),
	configSvc + "GetApprovalPolicy": rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetApprovalPolicyRequest).GetNamespace)),
	configSvc + "ProposeRelease":    rule(auth.ConfigPropose, named(auth.Namespace, (*coorddv1.ProposeReleaseRequest).GetNamespace)),
	configSvc + "ListProposals":     rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.ListProposalsRequest).GetNamespace)),
	configSvc + "GetProposal":       rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetProposalRequest).GetNamespace)),
	configSvc + "ApproveProposal":   rule(auth.ConfigApprove, named(auth.Namespace, (*coorddv1.ApproveProposalRequest).GetNamespace)),
	configSvc + "RejectProposal":    rule(auth.ConfigApprove, named(auth.Namespace, (*coorddv1.RejectProposalRequest).GetNamespace)),
	configSvc + "WithdrawProposal":  rule(auth.ConfigPropose, named(auth.Namespace, (*coorddv1.WithdrawProposalRequest).GetNamespace)),
	// On the heir; the adapter checks config.read on the shared one.
	configSvc + "SetInheritance": rule(auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.SetInheritanceRequest).GetNamespace)),

	clusterSvc + "GetClusterStatus": {action: auth.ClusterRead},

	trendSvc + "GetClusterTrends":   {action: auth.ClusterRead},
	trendSvc + "GetLockTrends":      rule(auth.LockDescribe, named(auth.Lock, (*coorddv1.GetLockTrendsRequest).GetName)),
	trendSvc + "GetElectionTrends":  rule(auth.ElectionObserve, named(auth.Election, (*coorddv1.GetElectionTrendsRequest).GetName)),
	trendSvc + "GetNamespaceTrends": rule(auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetNamespaceTrendsRequest).GetNamespace)),

	clusterSvc + "ListAlarms":    {action: auth.ClusterRead},
	clusterSvc + "ListMembers":   {action: auth.ClusterRead},
	clusterSvc + "SaveSnapshot":  {action: auth.ClusterAdmin},
	clusterSvc + "DisarmAlarms":  {action: auth.ClusterAdmin},
	clusterSvc + "Defragment":    {action: auth.ClusterAdmin},
	clusterSvc + "AddMember":     {action: auth.ClusterAdmin},
	clusterSvc + "PromoteMember": {action: auth.ClusterAdmin},
	clusterSvc + "RemoveMember":  {action: auth.ClusterAdmin},
}

// Authn finds the principal of a call (see authn.go).
type Authn interface {
	Principal(ctx context.Context) (auth.Principal, error)
	// Origin is where a call came from and the request id its transport
	// carried, as the daemon observed them, for the audit log.
	Origin(ctx context.Context) (source, requestID string)
}

// principalKey carries the call's principal in its context.
type principalKey struct{}

// PrincipalFrom returns the principal of the call ctx belongs to.
func PrincipalFrom(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	return p
}

// authorize checks one message of method against the policy, then that
// the caller owns the session it acts on.
func (a Auth) authorize(ctx context.Context, p auth.Principal, method string, msg any) error {
	if err := a.policy(ctx, p, method, msg); err != nil {
		return err
	}
	rule, ok := rpcTable[method]
	if !ok || a.Limits == nil {
		return nil
	}
	var spaces []string
	if rule.names != nil && auth.Actions[rule.action] == auth.Namespace {
		for _, r := range rule.names(msg) {
			spaces = append(spaces, r.Name)
		}
	}
	if lim := a.Limits.Allow(p, rule.action, writes(method, rule), spaces); lim != nil {
		a.Metrics.rateLimited(lim.What)
		return rateLimited{error: errkind.RateLimited.New(lim.Error()), after: lim.RetryAfter}
	}
	return nil
}

// rateLimited is a refusal for rate that says when to retry.
type rateLimited struct {
	error
	after time.Duration
}

func (e rateLimited) Unwrap() error             { return e.error }
func (e rateLimited) RetryDelay() time.Duration { return e.after }

// whoAmI is the one RPC any authenticated caller may make: it names them.
const whoAmI = "/coordd.v1.ClusterService/WhoAmI"

// policy checks the policy and session ownership (nothing in open mode).
func (a Auth) policy(ctx context.Context, p auth.Principal, method string, msg any) error {
	az, owners := a.Authz, a.Owners
	if az.Open() {
		return nil
	}
	rule, ok := rpcTable[method]
	if !ok {
		if strings.HasPrefix(method, healthService) {
			return nil // health checks carry no data
		}
		if IsReflection(method) {
			// The schema, as /openapi.json gives it: to whoever may read
			// the cluster's state.
			if ok, why := az.Allows(p, auth.ClusterRead, auth.Resource{}); !ok {
				if p.IsAnonymous() {
					return errkind.Unauthenticated.New("auth: " + why)
				}
				return errkind.PermissionDenied.New("auth: " + why + " (server reflection needs cluster.read)")
			}
			return nil
		}
		if method == whoAmI {
			if p.IsAnonymous() {
				return errkind.Unauthenticated.New("auth: sign in (a bearer token or a client certificate) to be named")
			}
			return nil // anyone known may learn its own name
		}
		return errkind.PermissionDenied.New(method + " is not in coordd's table of RPCs and actions: denied")
	}
	var names []auth.Resource
	if rule.names != nil {
		names = rule.names(msg)
	}
	if len(names) == 0 {
		names = []auth.Resource{{Kind: auth.Actions[rule.action]}}
	}
	actions := []auth.Action{rule.action}
	if rule.reveals != nil && rule.reveals(msg) {
		actions = append(actions, auth.ConfigReadSecret)
	}
	for _, act := range actions {
		for _, res := range names {
			if ok, why := az.Allows(p, act, res); !ok {
				if p.IsAnonymous() {
					return errkind.Unauthenticated.New("auth: " + why)
				}
				return errkind.PermissionDenied.New("auth: " + why)
			}
		}
	}
	if rule.owned != nil && owners != nil {
		return owners.check(ctx, az, p, rule.owned(msg))
	}
	return nil
}

// Auth is what the auth interceptors consult.
type Auth struct {
	Authn  Authn
	Authz  *auth.Authorizer
	Owners *Owners
	// Audit, when set, receives a line for every call that changes
	// something and every call refused; AuditFailed is told when a line
	// cannot be written.
	Audit       *auth.Audit
	AuditFailed func(error)
	// Limits, when set, refuse calls over their rate (RATE_LIMITED).
	Limits  *auth.Limits
	Metrics *Metrics
}

// sessionWrites are the session calls that are audited (keep-alives are
// not: they are most of the traffic and change nothing anyone reads).
var sessionWrites = map[string]bool{sessionSvc + "CreateSession": true, sessionSvc + "CloseSession": true}

// writes reports whether a call changes something: it is audited and
// counts against its principal's rate.
func writes(method string, rule rpcRule) bool {
	return auth.Mutates(rule.action) || sessionWrites[method]
}

// audit writes a call's audit line if it changed something or was refused.
func (a Auth) audit(ctx context.Context, p auth.Principal, method string, msg any, err error) {
	if a.Audit == nil {
		return
	}
	rule, known := rpcTable[method]
	st, _ := ToStatus(err)
	refused := err != nil && (errors.Is(err, errkind.PermissionDenied) || errors.Is(err, errkind.Unauthenticated))
	revealed := known && rule.reveals != nil && msg != nil && rule.reveals(msg)
	if !refused && !revealed && (!known || !writes(method, rule)) {
		return
	}
	src, reqID := a.Authn.Origin(ctx)
	if m, ok := msg.(interface{ GetRequestId() string }); ok && m.GetRequestId() != "" {
		reqID = m.GetRequestId() // the request's own
	}
	r := auth.Record{Time: time.Now().UTC(), Principal: p.Name, Source: src, RPC: method, Action: rule.action, Result: "OK", RequestID: reqID}
	if revealed {
		r.Action = auth.ConfigReadSecret // who read secrets in clear
	}
	if err != nil {
		r.Result, r.Reason = st.Code().String(), st.Message()
	}
	if known && rule.names != nil && msg != nil {
		for _, res := range rule.names(msg) {
			name := string(res.Kind) + ":" + res.Name
			if res.Prefix {
				name += "*"
			}
			r.Resources = append(r.Resources, name)
		}
	}
	if werr := a.Audit.Write(r); werr != nil && a.AuditFailed != nil {
		a.AuditFailed(werr)
	}
}

// UnaryAuth authenticates every call (an identity that fails to check is
// refused even in open mode), authorizes it against the policy and session
// ownership, and audits it. Place it inside UnaryErrors.
func UnaryAuth(a Auth) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		// A call on a Calls stream was authenticated with its stream.
		p, known := ctx.Value(principalKey{}).(auth.Principal)
		if !known {
			p, err = a.Authn.Principal(ctx)
		}
		if err == nil {
			err = a.authorize(ctx, p, info.FullMethod, req)
		}
		if err != nil {
			a.audit(ctx, p, info.FullMethod, req, err)
			return nil, err
		}
		resp, err = handler(context.WithValue(ctx, principalKey{}, p), req)
		return afterward(resp, err, func(resp any, err error) (any, error) {
			a.audit(ctx, p, info.FullMethod, req, err)
			return resp, err
		})
	}
}

// StreamAuth is UnaryAuth for streams: every message the client sends is
// authorized before the handler sees it; refusals are audited.
func StreamAuth(a Auth) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := a.Authn.Principal(ss.Context())
		if err != nil {
			a.audit(ss.Context(), p, info.FullMethod, nil, err)
			return err
		}
		ctx := context.WithValue(ss.Context(), principalKey{}, p)
		if rpcTable[info.FullMethod].perCall {
			// The stream needs its own action (session: every call on it is
			// one of a session's); each call is then checked on its own.
			if err := a.policy(ctx, p, info.FullMethod, nil); err != nil {
				a.audit(ctx, p, info.FullMethod, nil, err)
				return err
			}
			return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
		}
		return handler(srv, &authStream{
			ServerStream: ss, ctx: ctx,
			check: func(msg any) error {
				err := a.authorize(ctx, p, info.FullMethod, msg)
				if err != nil {
					a.audit(ctx, p, info.FullMethod, msg, err)
					if rpcTable[info.FullMethod].refusesOne {
						return &MessageRefused{Msg: msg, Err: err}
					}
				}
				return err
			},
		})
	}
}

// authStream authorizes each received message.
type authStream struct {
	grpc.ServerStream
	ctx   context.Context
	check func(msg any) error
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.check(m)
}

// Unauthenticated returns an error with the UNAUTHENTICATED reason.
func Unauthenticated(msg string) error { return errkind.Unauthenticated.New(msg) }

// PermissionDenied returns an error with the PERMISSION_DENIED reason.
func PermissionDenied(msg string) error { return errkind.PermissionDenied.New(msg) }

// SetNames sets every field of msg that names a lock, election, namespace,
// key or prefix to name (for tests that call every RPC with one name).
func SetNames(msg protoreflect.Message, name string) {
	fields := msg.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.Kind() == protoreflect.StringKind && !f.IsList() && slices.Contains(nameFields, string(f.Name())):
			msg.Set(f, protoreflect.ValueOfString(name))
		case f.Kind() == protoreflect.StringKind && f.IsList() && (f.Name() == "namespaces" || f.Name() == "names"):
			l := msg.Mutable(f).List()
			l.Append(protoreflect.ValueOfString(name))
		case f.Kind() == protoreflect.MessageKind && !f.IsMap() && (f.Name() == "start" || f.Name() == "namespaces"):
			if f.IsList() {
				l := msg.Mutable(f).List()
				e := l.NewElement()
				SetNames(e.Message(), name)
				l.Append(e)
			} else {
				SetNames(msg.Mutable(f).Message(), name)
			}
		}
	}
}

// nameFields are the request fields that name what a call acts on.
var nameFields = []string{"name", "namespace", "key", "prefix"}
