package clientlib

import (
	"errors"
	"testing"

	"google.golang.org/grpc/metadata"
)

// The first cluster named is the client's; an answer without the header
// (a server before it) is no evidence; a second cluster refuses from then
// on, whatever comes after.
func TestClustersRefuseASecondCluster(t *testing.T) {
	var cs clusters
	named := func(id string) metadata.MD { return metadata.Pairs(clusterHeader, id) }
	for _, step := range []struct {
		endpoint string
		md       metadata.MD
		refused  bool
	}{
		{"a:1", nil, false},
		{"a:1", named("c1"), false},
		{"b:1", named("c1"), false},
		{"c:1", metadata.MD{}, false},
		{"c:1", named("c2"), true},
		{"a:1", named("c1"), true},
	} {
		err := cs.note(step.endpoint, step.md)
		if refused := errors.Is(err, ErrInvalidArgument); refused != step.refused {
			t.Fatalf("note(%s, %v) = %v; want refused %v", step.endpoint, step.md, err, step.refused)
		}
	}
	if err := cs.err(); err == nil {
		t.Fatal("err() after two clusters = nil")
	}
}
