package queue

import (
	"context"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Stats counts the queues under root ("<root><escaped name>/q/..."): how
// many have at least one entry, how many entries hold (the first limit of
// each queue by create revision) and how many wait behind them. limitOf
// reads a queue's holder limit from its first entry's value.
type Stats struct {
	Queues  int // queues with at least one entry
	Holding int // entries among the first limit of their queue
	Waiting int // the rest
}

// Count reads every queue under root from the local member (a
// serializable read: it may trail the cluster by a moment) and counts
// them. It reads every entry, so it costs what the queues weigh; callers
// use it for metrics, not on a request path.
func Count(ctx context.Context, cli *clientv3.Client, root string, limitOf func(value []byte) int) (Stats, error) {
	resp, err := cli.Get(ctx, root, clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		return Stats{}, err
	}
	type q struct {
		first    int64 // the first entry's create revision
		limit, n int
	}
	queues := map[string]*q{}
	for _, kv := range resp.Kvs {
		name, sub, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
		if !ok || !strings.HasPrefix(sub, "q/") {
			continue // a marker beside a queue
		}
		e := queues[name]
		if e == nil {
			e = &q{first: kv.CreateRevision, limit: limitOf(kv.Value)}
			queues[name] = e
		} else if kv.CreateRevision < e.first {
			e.first, e.limit = kv.CreateRevision, limitOf(kv.Value)
		}
		e.n++
	}
	var st Stats
	for _, e := range queues {
		held := min(max(e.limit, 1), e.n)
		st.Queues++
		st.Holding += held
		st.Waiting += e.n - held
	}
	return st, nil
}
