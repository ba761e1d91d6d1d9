package coorddv1

// LeaderHealthService is a service name of coordd's standard gRPC health
// service (grpc.health.v1.Health). A member reports it SERVING while it
// serves and its embedded etcd member leads the cluster, NOT_SERVING
// otherwise, and does not know it (SERVICE_UNKNOWN, or NOT_FOUND from
// Check) over an external etcd, where no member leads. The empty service
// name keeps its meaning: the member can serve.
//
// Every write to etcd goes through its leader, so a request answered by the
// member that leads costs one network hop less than through a follower. The
// SDK uses this to prefer that member (see clientlib.Config.AnyMember); a
// load balancer can use it the same way. Like every health check it needs
// no credentials.
const LeaderHealthService = "coordd.v1.EtcdLeader"
