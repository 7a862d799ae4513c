package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"kiln/store"
)

// TestClassifyUnsupportedByCluster: the store's refusal of a command type
// an older member does not understand, as the leader returns it and as a
// follower rebuilds it from the forward RPC, is 409 unsupported_by_cluster
// with the message naming the node.
func TestClassifyUnsupportedByCluster(t *testing.T) {
	s := &Server{}
	err := fmt.Errorf("lifecycle: put site: %w", &store.UnsupportedByClusterError{Command: store.CmdPutSiteV2,
		Old: map[string]store.CommandType{"n2": store.CmdRemoveMember}})
	code, d := s.classify(err)
	if code != http.StatusConflict || d.Code != CodeUnsupportedByCluster || !strings.Contains(d.Message, "n2") {
		t.Fatalf("classified as %d %+v", code, d)
	}
}
