package daemon

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/coordd/coordd/internal/server/api"
)

// pageTokenKey returns the key every member seals ListSessions' page
// tokens with, creating it on first use: one random key per deployment,
// kept in etcd, which only coordd reaches. While etcd answers that it
// cannot serve yet (no leader, a leader change, a proposal that timed
// out: members starting together elect a leader), it asks again until ctx
// ends: the read-or-create is idempotent, and a member must not fail to
// start over its cluster's first election.
func pageTokenKey(ctx context.Context, cli *clientv3.Client, root string) ([]byte, error) {
	for {
		key, err := readOrCreatePageTokenKey(ctx, cli, root)
		if st, _ := api.ToStatus(err); err == nil || st.Code() != codes.Unavailable {
			return key, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readOrCreatePageTokenKey(ctx context.Context, cli *clientv3.Client, root string) ([]byte, error) {
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
