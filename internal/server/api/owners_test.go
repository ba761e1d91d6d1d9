package api

import (
	"errors"
	"testing"

	"github.com/coordd/coordd/internal/auth"
	"github.com/coordd/coordd/internal/base/errkind"
	"github.com/coordd/coordd/internal/election"
	"github.com/coordd/coordd/internal/lock"
	"github.com/coordd/coordd/internal/session"
	"github.com/coordd/coordd/internal/testkit/etcdtest"
)

// A call that names a token or term which does not hold at the check is
// answered as the call would answer it, not let through: tokens are
// predictable revisions, and one granted to another principal between
// the check and the call would be acted on unchecked (released, written
// with, handed over). Without gone, the check lets it through: the hole.
func TestATokenNamedBeforeItIsGrantedIsRefused(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	w := etcdtest.Watcher(t, cli, "/coordd/lock/", "/coordd/election/")
	locks := lock.NewManager(cli, "/coordd/", w, nil)
	elections := election.NewManager(cli, "/coordd/", w, nil)
	t.Cleanup(func() { locks.Close(); elections.Close() })
	o := &Owners{Sessions: session.NewManager(cli, "/coordd/"), Locks: locks, Elections: elections}
	az := auth.NewAuthorizer(&auth.Policy{})
	p := auth.Principal{Name: "mallory"}
	resp, err := cli.Get(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	future := resp.Header.Revision + 10 // a token nobody holds yet
	for _, tc := range []struct {
		ref  ownedRef
		want *errkind.Kind
	}{
		{ownedRef{lock: "l", token: future, gone: errkind.NotHolder}, errkind.NotHolder},
		{ownedRef{lock: "l", token: future, gone: errkind.StaleToken}, errkind.StaleToken},
		{ownedRef{election: "e", token: future, gone: errkind.NotLeader}, errkind.NotLeader},
	} {
		if err := o.check(t.Context(), az, p, tc.ref); !errors.Is(err, tc.want) {
			t.Errorf("check %+v = %v, want %v", tc.ref, err, tc.want)
		}
		tc.ref.gone = nil
		if err := o.check(t.Context(), az, p, tc.ref); err != nil {
			t.Errorf("check %+v without gone = %v: the old behaviour let it through", tc.ref, err)
		}
	}
}
