package queue

import (
	"context"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/base/names"
)

// Names lists the names under root whose queues ("<root><escaped name>/q/")
// hold at least one entry and that start with prefix: at most limit of
// them, in key order, starting after the name after ("" for the first
// page). Markers beside a queue (a release marker, a lock-delay record) do
// not make a name busy. The order is stable, so pages do not overlap.
func Names(ctx context.Context, cli *clientv3.Client, root, prefix, after string, limit int) ([]string, error) {
	from := root + names.Escape(prefix)
	if after != "" {
		// Skip every key of `after`: its subtree ends before after+"/\xff";
		// a token from before the prefix starts at the prefix.
		from = max(from, root+names.Escape(after)+"/\xff")
	}
	end := clientv3.GetPrefixRangeEnd(root + names.Escape(prefix))
	var out []string
	for len(out) < limit {
		resp, err := cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)*4))
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			esc, sub, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
			if !ok || !strings.HasPrefix(sub, "q/") {
				continue
			}
			if n := names.Unescape(esc); len(out) == 0 || out[len(out)-1] != n {
				out = append(out, n)
				if len(out) == limit {
					break
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return out, nil
}

// NamesIn returns the names whose queues under root hold an entry among
// keys (a session's attached keys), sorted and without repeats; other keys
// are ignored.
func NamesIn(root string, keys []string) []string {
	var out []string
	for _, k := range keys {
		if name, ok := NameOf(root, k); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// NameOf returns the name whose queue holds key, an entry key under root
// (root + escaped name + "/q/" + session + "/" + request id), and whether
// key is such an entry.
func NameOf(root, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, root)
	if !ok {
		return "", false
	}
	seg, entry, ok := strings.Cut(rest, "/")
	if !ok || !strings.HasPrefix(entry, "q/") || seg == "" {
		return "", false
	}
	return names.Unescape(seg), true
}
