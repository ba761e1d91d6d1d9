package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/coordd/coordd/internal/server/api"
)

// pageTokenKey returns the key every member seals ListSessions' page
// tokens with, creating it on first use: one random key per deployment,
// kept in etcd, which only coordd reaches.
func pageTokenKey(ctx context.Context, cli *clientv3.Client, root string) ([]byte, error) {
	fresh := make([]byte, api.PageTokenKeyBytes)
	_, _ = rand.Read(fresh) // crypto/rand.Read never fails
	return metaValue(ctx, cli, root+"meta/page-token-key", fresh)
}

// clusterUID returns the random id that names this cluster to clients
// (api.ClusterIdentity), creating it on first use. etcd's own cluster id
// is no name: two clusters started alike (one member each, the same peer
// URL) have the same one.
func clusterUID(ctx context.Context, cli *clientv3.Client, root string) (string, error) {
	fresh := make([]byte, 8)
	_, _ = rand.Read(fresh) // crypto/rand.Read never fails
	v, err := metaValue(ctx, cli, root+"meta/cluster-uid", []byte(hex.EncodeToString(fresh)))
	return string(v), err
}

// metaValue reads the value of key k, writing fresh there first if it has
// none. While etcd answers that it cannot serve yet (no leader, a leader
// change, a proposal that timed out: members starting together elect a
// leader), it asks again until ctx ends: the read-or-create is
// idempotent, and a member must not fail to start over its cluster's
// first election.
func metaValue(ctx context.Context, cli *clientv3.Client, k string, fresh []byte) ([]byte, error) {
	for {
		v, err := readOrCreate(ctx, cli, k, fresh)
		if st, _ := api.ToStatus(err); err == nil || st.Code() != codes.Unavailable {
			return v, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readOrCreate(ctx context.Context, cli *clientv3.Client, k string, fresh []byte) ([]byte, error) {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(fresh))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	if resp.Succeeded {
		return fresh, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return nil, fmt.Errorf("%s vanished", k)
	}
	return kvs[0].Value, nil
}
