package api

import (
	"context"
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

// TestClassifyCanceled: a handler error that is the request's own
// cancellation (a long poll at the node's stop) is 503 unavailable with a
// retry hint, never a 500 internal.
func TestClassifyCanceled(t *testing.T) {
	s := &Server{}
	code, d := s.classify(fmt.Errorf("events: %w", context.Canceled))
	if code != http.StatusServiceUnavailable || d.Code != CodeUnavailable || !strings.Contains(d.Message, "retry") {
		t.Fatalf("classified as %d %+v", code, d)
	}
}
