package clientlib_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/clientlib"
	coorddv1 "github.com/coordd/coordd/proto/coordd/v1"
)

// lossyElections grants every campaign term 7 and answers the first
// Proclaim UNAVAILABLE after taking it, as a server whose answer was lost
// would look to the SDK. It records the proclaim ids it is sent.
type lossyElections struct {
	coorddv1.UnimplementedElectionServiceServer

	mu  sync.Mutex
	ids []string
}

func (l *lossyElections) Campaign(_ context.Context, req *coorddv1.CampaignRequest) (*coorddv1.CampaignResponse, error) {
	return &coorddv1.CampaignResponse{Leadership: &coorddv1.Leadership{
		Name: req.GetName(), Term: 7, Value: req.GetValue(), SessionId: req.GetSessionId(), RequestId: req.GetRequestId(), Revision: 7,
	}}, nil
}

func (l *lossyElections) Proclaim(_ context.Context, req *coorddv1.ProclaimRequest) (*coorddv1.ProclaimResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, req.GetProclaimId())
	if len(l.ids) == 1 {
		return nil, status.Error(codes.Unavailable, "the answer was lost")
	}
	return &coorddv1.ProclaimResponse{Revision: 8}, nil
}

// Leadership.Proclaim retries with the id of its first attempt, so a
// server that made the first one makes nothing more (election.Manager's
// Proclaim) and observers see the proclamation once; each Proclaim call
// has an id of its own.
func TestProclaimRetriesWithItsID(t *testing.T) {
	elections := &lossyElections{}
	c := fakeServer(t, func(srv *grpc.Server) {
		coorddv1.RegisterSessionServiceServer(srv, &olderSessions{})
		coorddv1.RegisterElectionServiceServer(srv, elections)
	})
	ctx := t.Context()
	s, err := c.NewSession(ctx, clientlib.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	l, err := s.Campaign(ctx, "lossy", "v0")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1", "v2"} {
		if err := l.Proclaim(ctx, v); err != nil {
			t.Fatalf("Proclaim(%s) = %v", v, err)
		}
	}
	elections.mu.Lock()
	ids := elections.ids
	elections.mu.Unlock()
	if len(ids) != 3 || ids[0] == "" || ids[1] != ids[0] || ids[2] == ids[0] {
		t.Fatalf("proclaim ids sent %q; want the retry to repeat the first call's id and the next call to have a new one", ids)
	}
}
