package api

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/coordd/coordd/auth"
	"github.com/coordd/coordd/internal/kind"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// rpcRule says which action an RPC is and which names it acts on.
type rpcRule struct {
	action auth.Action
	// names returns the resources a request message names (nil for
	// actions about no name). Streams are checked message by message.
	names func(msg any) []auth.Resource
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
	electionSvc = "/coordd.v1.ElectionService/"
	configSvc   = "/coordd.v1.ConfigService/"
	clusterSvc  = "/coordd.v1.ClusterService/"
)

// rpcTable maps every RPC of coordd's API to its action and the names it
// acts on. It is the only place where that is decided; a test fails when an
// RPC is missing from it, and an RPC missing from it is denied once a
// policy is in force.
var rpcTable = map[string]rpcRule{
	sessionSvc + "CreateSession":   {action: auth.Session},
	sessionSvc + "GetSession":      {action: auth.Session},
	sessionSvc + "ListSessions":    {action: auth.Session},
	sessionSvc + "KeepAlive":       {action: auth.Session},
	sessionSvc + "KeepAliveStream": {action: auth.Session},
	sessionSvc + "CloseSession":    {action: auth.Session},

	lockSvc + "Acquire":      {auth.LockAcquire, named(auth.Lock, (*coorddv1.AcquireRequest).GetName)},
	lockSvc + "TryAcquire":   {auth.LockAcquire, named(auth.Lock, (*coorddv1.TryAcquireRequest).GetName)},
	lockSvc + "Release":      {auth.LockRelease, named(auth.Lock, (*coorddv1.ReleaseRequest).GetName)},
	lockSvc + "DescribeLock": {auth.LockDescribe, named(auth.Lock, (*coorddv1.DescribeLockRequest).GetName)},
	lockSvc + "ListLocks":    {auth.LockDescribe, listed(auth.Lock, (*coorddv1.ListLocksRequest).GetPrefix)},
	// Validating a token says whether it holds: a read of the lock or
	// the election.
	lockSvc + "ValidateFence": {auth.LockDescribe, func(msg any) []auth.Resource {
		m, _ := msg.(*coorddv1.ValidateFenceRequest)
		if m.GetElection() != "" {
			return []auth.Resource{fence("", m.GetElection())}
		}
		return []auth.Resource{fence(m.GetName(), "")}
	}},
	lockSvc + "FencedPut":    {auth.KVFenced, named(auth.Key, (*coorddv1.FencedPutRequest).GetKey)},
	lockSvc + "FencedDelete": {auth.KVFenced, named(auth.Key, (*coorddv1.FencedDeleteRequest).GetKey)},

	electionSvc + "Campaign":      {auth.ElectionCampaign, named(auth.Election, (*coorddv1.CampaignRequest).GetName)},
	electionSvc + "Proclaim":      {auth.ElectionCampaign, named(auth.Election, (*coorddv1.ProclaimRequest).GetName)},
	electionSvc + "Resign":        {auth.ElectionCampaign, named(auth.Election, (*coorddv1.ResignRequest).GetName)},
	electionSvc + "Leader":        {auth.ElectionObserve, named(auth.Election, (*coorddv1.LeaderRequest).GetName)},
	electionSvc + "Candidates":    {auth.ElectionObserve, named(auth.Election, (*coorddv1.CandidatesRequest).GetName)},
	electionSvc + "ListElections": {auth.ElectionObserve, listed(auth.Election, (*coorddv1.ListElectionsRequest).GetPrefix)},
	electionSvc + "Observe":       {auth.ElectionObserve, named(auth.Election, (*coorddv1.ObserveRequest).GetName)},

	configSvc + "Put":            {auth.ConfigWrite, named(auth.Namespace, (*coorddv1.PutRequest).GetNamespace)},
	configSvc + "Delete":         {auth.ConfigWrite, named(auth.Namespace, (*coorddv1.DeleteRequest).GetNamespace)},
	configSvc + "Publish":        {auth.ConfigWrite, named(auth.Namespace, (*coorddv1.PublishRequest).GetNamespace)},
	configSvc + "Get":            {auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetRequest).GetNamespace)},
	configSvc + "Snapshot":       {auth.ConfigRead, named(auth.Namespace, (*coorddv1.SnapshotRequest).GetNamespace)},
	configSvc + "Poll":           {auth.ConfigRead, named(auth.Namespace, (*coorddv1.PollRequest).GetNamespace)},
	configSvc + "ListReleases":   {auth.ConfigRead, named(auth.Namespace, (*coorddv1.ListReleasesRequest).GetNamespace)},
	configSvc + "Diff":           {auth.ConfigRead, named(auth.Namespace, (*coorddv1.DiffRequest).GetNamespace)},
	configSvc + "Rollback":       {auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.RollbackRequest).GetNamespace)},
	configSvc + "GetSchema":      {auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetSchemaRequest).GetNamespace)},
	configSvc + "SetSchema":      {auth.ConfigAdmin, named(auth.Namespace, (*coorddv1.SetSchemaRequest).GetNamespace)},
	configSvc + "ListNamespaces": {auth.ConfigRead, listed(auth.Namespace, (*coorddv1.ListNamespacesRequest).GetPrefix)},
	// A subscriber reports what it applied of namespaces it reads.
	configSvc + "ReportStatus": {auth.ConfigRead, namespaces(func(m *coorddv1.ReportStatusRequest) []string {
		out := make([]string, 0, len(m.GetNamespaces()))
		for _, n := range m.GetNamespaces() {
			out = append(out, n.GetNamespace())
		}
		return out
	})},
	configSvc + "GetApplyStatus": {auth.ConfigRead, named(auth.Namespace, (*coorddv1.GetApplyStatusRequest).GetNamespace)},
	configSvc + "Watch":          {auth.ConfigRead, namespaces((*coorddv1.WatchRequest).GetNamespaces)},
	// Each start message of the stream names its namespaces; a stop
	// names none.
	configSvc + "WatchMany": {auth.ConfigRead, namespaces(func(m *coorddv1.WatchManyRequest) []string { return m.GetStart().GetNamespaces() })},

	clusterSvc + "GetClusterStatus": {action: auth.ClusterRead},
	clusterSvc + "ListAlarms":       {action: auth.ClusterRead},
	clusterSvc + "ListMembers":      {action: auth.ClusterRead},
	clusterSvc + "SaveSnapshot":     {action: auth.ClusterAdmin},
	clusterSvc + "DisarmAlarms":     {action: auth.ClusterAdmin},
	clusterSvc + "Defragment":       {action: auth.ClusterAdmin},
	clusterSvc + "AddMember":        {action: auth.ClusterAdmin},
	clusterSvc + "PromoteMember":    {action: auth.ClusterAdmin},
	clusterSvc + "RemoveMember":     {action: auth.ClusterAdmin},
}

// Authn finds the principal of a call (see authn.go).
type Authn interface {
	Principal(ctx context.Context) (auth.Principal, error)
}

// principalKey carries the call's principal in its context.
type principalKey struct{}

// PrincipalFrom returns the principal of the call ctx belongs to.
func PrincipalFrom(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	return p
}

// authorize checks one message of method against the policy.
func authorize(az *auth.Authorizer, p auth.Principal, method string, msg any) error {
	if az.Open() {
		return nil
	}
	rule, ok := rpcTable[method]
	if !ok {
		if strings.HasPrefix(method, healthService) {
			return nil // health checks carry no data
		}
		return kind.PermissionDenied.New(method + " is not in coordd's table of RPCs and actions: denied")
	}
	var names []auth.Resource
	if rule.names != nil {
		names = rule.names(msg)
	}
	if len(names) == 0 {
		names = []auth.Resource{{Kind: auth.Actions[rule.action]}}
	}
	for _, res := range names {
		if ok, why := az.Allows(p, rule.action, res); !ok {
			if p.IsAnonymous() {
				return kind.Unauthenticated.New("auth: " + why)
			}
			return kind.PermissionDenied.New("auth: " + why)
		}
	}
	return nil
}

// UnaryAuth authenticates every call (an identity that fails to check is
// refused even in open mode) and authorizes it against the policy. Place
// it inside UnaryErrors.
func UnaryAuth(an Authn, az *auth.Authorizer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := an.Principal(ctx)
		if err != nil {
			return nil, err
		}
		if err := authorize(az, p, info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(context.WithValue(ctx, principalKey{}, p), req)
	}
}

// StreamAuth is UnaryAuth for streams: every message the client sends is
// authorized before the handler sees it.
func StreamAuth(an Authn, az *auth.Authorizer) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := an.Principal(ss.Context())
		if err != nil {
			return err
		}
		return handler(srv, &authStream{
			ServerStream: ss, ctx: context.WithValue(ss.Context(), principalKey{}, p),
			check: func(msg any) error { return authorize(az, p, info.FullMethod, msg) },
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
func Unauthenticated(msg string) error { return kind.Unauthenticated.New(msg) }

// PermissionDenied returns an error with the PERMISSION_DENIED reason.
func PermissionDenied(msg string) error { return kind.PermissionDenied.New(msg) }

// SetNames sets every field of msg that names a lock, election, namespace,
// key or prefix to name (for tests that call every RPC with one name).
func SetNames(msg protoreflect.Message, name string) {
	fields := msg.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.Kind() == protoreflect.StringKind && !f.IsList() && slices.Contains(nameFields, string(f.Name())):
			msg.Set(f, protoreflect.ValueOfString(name))
		case f.Kind() == protoreflect.StringKind && f.IsList() && f.Name() == "namespaces":
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
