package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"
)

// Forward RPC (HTTP/1.1 over TLS 1.3 on Config.ForwardAddr, between store
// nodes only). Every /raft/ route needs a client certificate of the site CA
// (else 401 unauthenticated); /cluster/enroll needs a join token instead:
//
//	POST /raft/apply       body: encoded command (1 type byte + JSON)  → wireResult{Values, Index}
//	POST /raft/join        body: JSON membership                       → wireResult
//	POST /raft/remove      body: JSON membership                       → wireResult
//	POST /raft/barrier     (empty)                                     → wireResult{Index}
//	POST /raft/secrets     body: JSON secretsPush (cluster.go; any node) → wireResult
//	POST /cluster/enroll   body: JSON enrollRequest (cluster.go)       → enrollReply
//	GET  /peer/...         Config.PeerFiles, when set (peer.go)       → its answer
//
// Only the leader executes /raft/ routes; a non-leader answers 503 with code
// not_leader (it never forwards again, so a request makes at most one hop).

type membership struct {
	ID          string `json:"id"`
	RaftAddr    string `json:"raft_addr,omitempty"`
	ForwardAddr string `json:"forward_addr,omitempty"`
	// The joiner's version record (versions.go), when it joins itself
	// (JoinVia): registered before it becomes a voter.
	Version    string            `json:"version,omitempty"`
	MaxCommand CommandType       `json:"max_command,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
}

type wireError struct {
	Code      string     `json:"code"`
	Message   string     `json:"message"`
	From      string     `json:"from,omitempty"`
	To        string     `json:"to,omitempty"`
	Conflicts []Conflict `json:"conflicts,omitempty"` // *ImportConflictError
}

type wireResult struct {
	Values []json.RawMessage `json:"values,omitempty"`
	Index  uint64            `json:"index,omitempty"`
	Error  *wireError        `json:"error,omitempty"`
}

// Stable error codes (also the label values of kiln_store_apply_errors_total).
var codeErrs = []struct {
	code string
	err  error
}{
	{"conflict", ErrConflict}, {"not_found", ErrNotFound}, {"invalid", ErrInvalid},
	{"duplicate_mac", ErrDuplicateMAC}, {"image_in_use", ErrImageInUse}, {"fsm_halted", ErrFSMHalted}, {"unknown_command", ErrUnknownCommand},
	{"bad_command", ErrBadCommand}, {"not_leader", ErrNotLeader}, {"timeout", ErrTimeout},
	{"corrupt", ErrCorrupt}, {"closed", ErrClosed}, {"unauthenticated", ErrUnauthenticated},
	{"join_token", ErrJoinToken}, {"unsupported_by_cluster", ErrUnsupportedByCluster},
}

// errCode maps err to its stable code ("internal" if none applies).
func errCode(err error) string {
	var ite *IllegalTransitionError
	if errors.As(err, &ite) {
		return "illegal_transition"
	}
	for _, ce := range codeErrs {
		if errors.Is(err, ce.err) {
			return ce.code
		}
	}
	return "internal"
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	we := &wireError{Code: errCode(err), Message: err.Error()}
	var ite *IllegalTransitionError
	if errors.As(err, &ite) {
		we.From, we.To = string(ite.From), string(ite.To)
	}
	var ice *ImportConflictError
	if errors.As(err, &ice) {
		we.Conflicts = ice.Conflicts
	}
	return we
}

// remoteError is an error returned by the leader, rebuilt on the follower
// with the same sentinel (errors.Is works) and message.
type remoteError struct {
	msg string
	err error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }

func fromWire(we *wireError) error {
	if we == nil {
		return nil
	}
	if we.Code == "illegal_transition" {
		return &IllegalTransitionError{From: MachineState(we.From), To: MachineState(we.To)}
	}
	if len(we.Conflicts) > 0 {
		return &ImportConflictError{Conflicts: we.Conflicts}
	}
	for _, ce := range codeErrs {
		if ce.code == we.Code {
			return &remoteError{msg: we.Message, err: ce.err}
		}
	}
	return errors.New(we.Message)
}

func (s *Store) forwardHandler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, status int, r wireResult) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(r)
	}
	notLeader := func(w http.ResponseWriter) {
		id, addr := s.Leader()
		reply(w, http.StatusServiceUnavailable, wireResult{Error: &wireError{Code: "not_leader",
			Message: fmt.Sprintf("%s is not the leader (leader %q at %q)", s.cfg.NodeID, id, addr)}})
	}
	mux.HandleFunc("POST /raft/apply", func(w http.ResponseWriter, r *http.Request) {
		if !s.IsLeader() {
			notLeader(w)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
		if err != nil {
			reply(w, http.StatusBadRequest, wireResult{Error: toWire(fmt.Errorf("%w: %v", ErrBadCommand, err))})
			return
		}
		c, err := decodeCommand(body)
		if err != nil {
			reply(w, http.StatusBadRequest, wireResult{Error: toWire(err)})
			return
		}
		vals, _, err := s.applyLocal(r.Context(), c)
		if errors.Is(err, raft.ErrNotLeader) {
			notLeader(w)
			return
		}
		// Index: this node's applied index once the entry is applied (at
		// least the entry's): the forwarding node waits for it before it
		// returns, so its own reads after the write see it.
		reply(w, http.StatusOK, wireResult{Values: vals, Index: s.fsm.applied.Load(), Error: toWire(err)})
	})
	member := func(join bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !s.IsLeader() {
				notLeader(w)
				return
			}
			var m membership
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&m); err != nil || m.ID == "" {
				reply(w, http.StatusBadRequest, wireResult{Error: &wireError{Code: "invalid", Message: "bad membership body"}})
				return
			}
			var err error
			if join {
				err = s.joinLocal(r.Context(), m.RaftAddr, &nodeInfo{ID: m.ID, ForwardAddr: m.ForwardAddr, Version: m.Version, MaxCommand: m.MaxCommand, Env: m.Env})
			} else {
				err = s.removeLocal(r.Context(), m.ID)
			}
			reply(w, http.StatusOK, wireResult{Error: toWire(err)})
		}
	}
	mux.HandleFunc("POST /raft/join", member(true))
	mux.HandleFunc("POST /raft/remove", member(false))
	mux.HandleFunc("POST /raft/barrier", func(w http.ResponseWriter, r *http.Request) {
		if !s.IsLeader() {
			notLeader(w)
			return
		}
		idx, err := s.barrierLocal(r.Context())
		if err != nil {
			notLeader(w)
			return
		}
		reply(w, http.StatusOK, wireResult{Index: idx})
	})
	mux.HandleFunc("POST /cluster/enroll", s.serveEnroll)
	mux.HandleFunc("POST /raft/secrets", s.serveSecrets)
	mux.HandleFunc("POST /raft/renew", s.serveRenew)
	mux.HandleFunc("POST /raft/ca", s.serveCAStep)
	if s.cfg.PeerFiles != nil {
		mux.Handle("GET /peer/", s.cfg.PeerFiles)
	}
	// Only enrollment is open; everything else needs a verified site
	// certificate (the TLS layer verified the chain and ran peerCheck).
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/cluster/enroll" && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			reply(w, http.StatusUnauthorized, wireResult{Error: toWire(fmt.Errorf("%w: %v", ErrUnauthenticated, errUnauthenticated))})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// forward sends c to the leader's forward RPC. It retries (until
// ApplyTimeout or ctx) only while the request certainly did not execute:
// no leader known, leader's forward address unknown, connection refused,
// or a not_leader answer. Otherwise it fails with *NotLeaderError.
func (s *Store) forward(ctx context.Context, c *command) ([]json.RawMessage, error) {
	data, err := encodeCommand(c)
	if err != nil {
		return nil, err
	}
	var res wireResult
	err = s.forwardRetry(ctx, "/raft/apply", data, &res)
	if err != nil {
		s.m.forwarded.WithLabelValues("error").Inc()
		return nil, err
	}
	s.m.forwarded.WithLabelValues("ok").Inc()
	if res.Error == nil && res.Index > 0 {
		// Read your writes: a caller that writes through this follower and
		// then reads it (the lifecycle's read-modify-write steps) must see
		// its write. The write is committed either way; a replica too slow
		// to apply it within the timeout is logged, not an error.
		wctx, cancel := context.WithTimeout(ctx, s.timeout(ctx))
		err := s.waitApplied(wctx, res.Index)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("forwarded write committed but not yet applied here", "index", res.Index, "err", err)
		}
	}
	return res.Values, fromWire(res.Error)
}

func (s *Store) forwardMembership(ctx context.Context, path string, m membership) error {
	body, _ := json.Marshal(m)
	var res wireResult
	if err := s.forwardRetry(ctx, path, body, &res); err != nil {
		return err
	}
	return fromWire(res.Error)
}

func (s *Store) forwardBarrier(ctx context.Context) (uint64, error) {
	var res wireResult
	if err := s.forwardRetry(ctx, "/raft/barrier", nil, &res); err != nil {
		return 0, err
	}
	return res.Index, fromWire(res.Error)
}

func (s *Store) forwardRetry(ctx context.Context, path string, body []byte, res *wireResult) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout(ctx))
	defer cancel()
	backoff := 5 * time.Millisecond
	var nle *NotLeaderError
	for {
		nle = &NotLeaderError{}
		nle.LeaderID, nle.LeaderRaftAddr = s.Leader()
		retry := true
		switch {
		case nle.LeaderID == "":
			nle.Cause = errors.New("no leader known")
		case nle.LeaderID == s.cfg.NodeID && s.IsLeader():
			// Leadership arrived while we were forwarding; nothing has
			// executed anywhere, the caller runs it locally.
			return errSelfLeader
		default:
			fa, err := s.forwardAddrOf(nle.LeaderID)
			if err != nil {
				nle.Cause = fmt.Errorf("leader's forward address not registered yet")
				break
			}
			nle.LeaderForwardAddr = fa
			status, err := s.post(ctx, "https://"+fa+path, body, res)
			if err == nil && status != http.StatusServiceUnavailable {
				return nil
			}
			if err == nil {
				nle.Cause = fromWire(res.Error)
				*res = wireResult{}
			} else {
				nle.Cause = err
				var op *net.OpError
				retry = errors.As(err, &op) && op.Op == "dial"
			}
		}
		if !retry {
			return nle
		}
		select {
		case <-ctx.Done():
			if nle.Cause == nil {
				nle.Cause = ctx.Err()
			}
			return nle
		case <-s.done:
			return ErrClosed
		case <-time.After(backoff):
		}
		if backoff < 200*time.Millisecond {
			backoff *= 2
		}
	}
}

func (s *Store) post(ctx context.Context, url string, body []byte, res *wireResult) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxForwardBody)).Decode(res); err != nil {
		return resp.StatusCode, fmt.Errorf("store: forward %s: bad reply (HTTP %d): %w", url, resp.StatusCode, err)
	}
	return resp.StatusCode, nil
}

// JoinVia asks an existing cluster to add this node as a voter, through the
// forward RPC of any of its members (host:port of their Config.ForwardAddr).
// A member that is not the leader answers not_leader and the next one is
// tried; the whole list is retried with backoff until one leader accepts or
// ctx ends. Used by a new node started without Bootstrap. Errors: ctx's error
// wrapping the last refusal; ErrNoRaft on a local store.
func (s *Store) JoinVia(ctx context.Context, peers []string) error {
	if s.raft == nil {
		return fmt.Errorf("%w: JoinVia", ErrNoRaft)
	}
	if len(peers) == 0 {
		return fmt.Errorf("%w: join needs at least one peer forward address", ErrInvalid)
	}
	self := s.selfInfo()
	body, _ := json.Marshal(membership{ID: s.cfg.NodeID, RaftAddr: s.RaftAddr(), ForwardAddr: s.ForwardAddr(),
		Version: self.Version, MaxCommand: self.MaxCommand, Env: self.Env})
	backoff := 100 * time.Millisecond
	var last error
	for {
		for _, p := range peers {
			var res wireResult
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			status, err := s.post(pctx, "https://"+p+"/raft/join", body, &res)
			cancel()
			switch {
			case err != nil:
				last = fmt.Errorf("peer %s: %w", p, err)
			case status == http.StatusOK && res.Error == nil:
				s.log.Info("joined cluster", "via", p)
				return nil
			default:
				last = fmt.Errorf("peer %s (HTTP %d): %w", p, status, fromWire(res.Error))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: join via %v: %w (last: %v)", peers, ctx.Err(), last)
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
}

// HasState reports whether this node's data directory held raft state when
// it was opened (false for a brand-new node); on a local store, whether its
// fsm.db held applied entries.
func (s *Store) HasState() bool { return s.hadState }
