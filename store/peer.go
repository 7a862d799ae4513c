package store

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.etcd.io/bbolt"
)

// PeerGet sends GET https://<forward address of node>/peer/<path> over the
// forward RPC's mutual TLS (this node's site certificate; the peer's must be
// of the same site CA and not removed), so only members reach Config.PeerFiles
// and only a member answers. path has no leading slash. The caller closes the
// response body and checks its status. Errors: ErrNoRaft (a local store), ErrNotFound (node has no
// forward address: not registered), or the transport's error.
func (s *Store) PeerGet(ctx context.Context, node, path string) (*http.Response, error) {
	if s.http == nil {
		return nil, fmt.Errorf("%w: PeerGet", ErrNoRaft)
	}
	var addr string
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		addr = string(tx.Bucket(bNodes).Get([]byte(node)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: node %s has no forward address (see `kiln cluster members`)", ErrNotFound, node)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/peer/"+strings.TrimPrefix(path, "/"), nil)
	if err != nil {
		return nil, err
	}
	return s.http.Do(req)
}

// NodeIDs lists the IDs of the nodes with a forward address record (every
// node that registered, this one included), in key order.
func (s *Store) NodeIDs() ([]string, error) {
	var out []string
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bNodes).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}
