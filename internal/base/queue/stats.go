package queue

import (
	"context"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Stats counts the queues under root ("<root><escaped name>/q/..."): how
// many have at least one entry, how many entries hold and how many wait
// behind them.
type Stats struct {
	Queues  int // queues with at least one entry
	Holding int // entries that hold their queue's lock or lead
	Waiting int // the rest
}

// Count reads every queue under root from the local member (a
// serializable read: it may trail the cluster by a moment) and counts
// them; held says how many entries at the head of one queue (its entries
// in queue order) hold. It reads every entry, so it costs what the queues
// weigh; callers use it for metrics, not on a request path.
func Count(ctx context.Context, cli *clientv3.Client, root string, held func(entries []*mvccpb.KeyValue) int) (Stats, error) {
	resp, err := cli.Get(ctx, root, clientv3.WithPrefix(), clientv3.WithSerializable(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return Stats{}, err
	}
	queues := map[string][]*mvccpb.KeyValue{} // in queue order
	for _, kv := range resp.Kvs {
		name, sub, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
		if !ok || !strings.HasPrefix(sub, "q/") {
			continue // a marker beside a queue
		}
		queues[name] = append(queues[name], kv)
	}
	var st Stats
	for _, entries := range queues {
		h := min(held(entries), len(entries))
		st.Queues++
		st.Holding += h
		st.Waiting += len(entries) - h
	}
	return st, nil
}
