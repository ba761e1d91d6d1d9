package api

import (
	"context"

	"github.com/coordd/coordd/internal/configcenter"
	"github.com/coordd/coordd/internal/shared/keyring"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// Secret config values reach a caller in clear only when it asks
// (reveal_secrets) and the authz interceptor has let it: config.read-secret
// on every namespace named. Every other message carries a secret as an
// empty value marked secret; release history and diffs never carry one.

// snapshotFor is snap's message, its secrets opened if reveal.
func (s *ConfigServer) snapshotFor(ctx context.Context, snap configcenter.Snapshot, reveal bool) (*coorddv1.NamespaceSnapshot, error) {
	out := snapshotProto(snap)
	if !reveal {
		return out, nil
	}
	for _, e := range out.GetEntries() {
		if !e.GetSecret() {
			continue
		}
		plain, err := s.store.OpenValue(ctx, snap.Namespace, e.GetKey(), snap.Content[e.GetKey()])
		if err != nil {
			return nil, err
		}
		e.Value = plain
	}
	return out, nil
}

// eventMessage is a watch event's message for a watcher, its secrets
// opened if reveal. A change without secrets, or for a watcher that does
// not reveal them, is the message shared by every watcher.
func (s *ConfigServer) eventMessage(ctx context.Context, ev configcenter.Event, reveal bool) (any, error) {
	switch {
	case ev.Type == configcenter.EventChange && (!reveal || !releaseHasSecrets(ev.Release)):
		return s.changeMessage(ev)
	case !reveal || ev.Type == configcenter.EventBookmark:
		return watchMessage(ev), nil
	}
	return s.revealedMessage(ctx, ev)
}

// revealedMessage is ev's message with its secrets opened.
func (s *ConfigServer) revealedMessage(ctx context.Context, ev configcenter.Event) (*coorddv1.WatchResponse, error) {
	msg := watchMessage(ev)
	if ev.Type == configcenter.EventChange {
		for i, c := range ev.Release.Changes {
			m := msg.GetRelease().GetChanges()[i]
			if !m.GetSecret() || c.New == nil {
				continue
			}
			plain, err := s.store.OpenValue(ctx, ev.Release.Namespace, c.Key, *c.New)
			if err != nil {
				return nil, err
			}
			m.NewValue = &plain
		}
		return msg, nil
	}
	for i, snap := range ev.Snapshots {
		out, err := s.snapshotFor(ctx, snap, true)
		if err != nil {
			return nil, err
		}
		msg.Snapshots[i] = out
	}
	return msg, nil
}

// eventHasSecrets says whether ev carries a secret value.
func eventHasSecrets(ev configcenter.Event) bool {
	switch ev.Type {
	case configcenter.EventChange:
		return releaseHasSecrets(ev.Release)
	case configcenter.EventSnapshot:
		for _, snap := range ev.Snapshots {
			for _, v := range snap.Content {
				if keyring.IsSealed(v) {
					return true
				}
			}
		}
	}
	return false
}

func releaseHasSecrets(r *configcenter.Release) bool {
	for _, c := range r.Changes {
		if c.New != nil && keyring.IsSealed(*c.New) {
			return true
		}
	}
	return false
}

// RewrapSecretKeys implements ConfigService.
func (s *ConfigServer) RewrapSecretKeys(ctx context.Context, _ *coorddv1.RewrapSecretKeysRequest) (*coorddv1.RewrapSecretKeysResponse, error) {
	res, err := s.store.RewrapDataKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := &coorddv1.RewrapSecretKeysResponse{Primary: res.Primary, Rewrapped: int32(res.Rewrapped), ByKey: map[string]int32{}}
	for k, n := range res.ByKEK {
		out.ByKey[k] = int32(n)
	}
	return out, nil
}
