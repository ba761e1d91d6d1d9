package daemon

import (
	"context"
	"crypto/rand"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordd/coordd/internal/server/api"
)

// pageTokenKey returns the key every member seals ListSessions' page
// tokens with, creating it on first use: one random key per deployment,
// kept in etcd, which only coordd reaches.
func pageTokenKey(ctx context.Context, cli *clientv3.Client, root string) ([]byte, error) {
	k := root + "meta/page-token-key"
	fresh := make([]byte, api.PageTokenKeyBytes)
	_, _ = rand.Read(fresh) // crypto/rand.Read never fails
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(fresh))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("page token key: %w", err)
	}
	if resp.Succeeded {
		return fresh, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return nil, fmt.Errorf("page token key: %s vanished", k)
	}
	return kvs[0].Value, nil
}
