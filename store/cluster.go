package store

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"go.etcd.io/bbolt"

	"kiln/store/pki"
)

// Cluster membership and trust: join tokens (CmdPutJoinToken), their
// one-time use by an enrolling node (CmdUseJoinToken), member records
// (certificate serial per node ID) and their removal (CmdRemoveMember).
// This directory's DESIGN.md "Cluster trust" has the model.

// Join token lifetimes (Store.CreateJoinToken).
const (
	DefaultJoinTokenTTL = time.Hour
	MinJoinTokenTTL     = time.Minute
	MaxJoinTokenTTL     = 7 * 24 * time.Hour
	// maxEnrollInFlight bounds concurrent enrollments a node serves (each
	// costs a signature and a raft write); more get 503 busy.
	maxEnrollInFlight = 2
	maxEnrollBody     = 64 << 10 // bytes
)

// JoinToken is the stored record of a join token: only the SHA-256 of its
// secret (Hash, hex), never the secret. Created and Expires are fixed by
// the leader (Expires = Created + the TTL asked for). UsedBy/UsedAt are
// set by the one enrollment that consumed it.
type JoinToken struct {
	Hash      string        `json:"hash"`
	TTL       time.Duration `json:"ttl,omitempty"` // in the command only: the leader turns it into Expires
	Created   time.Time     `json:"created"`
	Expires   time.Time     `json:"expires"`
	CreatedBy string        `json:"created_by,omitempty"`
	UsedBy    string        `json:"used_by,omitempty"`
	UsedAt    time.Time     `json:"used_at,omitzero"`
}

// ID is the token's short name (first 8 hex digits of Hash).
func (t JoinToken) ID() string { return pki.TokenID(t.Hash) }

// Member is the stored record of a node admitted with a join token (or
// removed): the serial of the certificate it was issued. A node whose
// record says Removed, or whose certificate has another serial than its
// record, is refused on the raft and forward ports. The bootstrap node has
// no record until it is removed.
//
// A renewal (CmdRenewMember) records the new certificate: CertSerial
// becomes it, PrevSerial the one before (still accepted until it expires),
// CertNotAfter its expiry and CAHash its issuing CA's SPKI hash. TokenID is
// also the enrollment every renewed certificate names (pki.EnrollmentOf),
// so a peer whose replica has not applied the renewal yet accepts it; a
// node that had no record (the bootstrap node) is given one, with a fresh
// enrollment ID, at its first renewal.
type Member struct {
	ID           string    `json:"id"`
	CertSerial   string    `json:"cert_serial,omitempty"` // hex
	TokenID      string    `json:"token_id,omitempty"`
	JoinedAt     time.Time `json:"joined_at,omitzero"`
	Removed      bool      `json:"removed,omitempty"`
	RemovedAt    time.Time `json:"removed_at,omitzero"`
	PrevSerial   string    `json:"prev_serial,omitempty"`
	CertNotAfter time.Time `json:"cert_not_after,omitzero"`
	CAHash       string    `json:"ca_hash,omitempty"`
	RenewedAt    time.Time `json:"renewed_at,omitzero"`
}

// ClusterMember is one server of the raft configuration as Members
// reports it: raft address and suffrage from raft, forward address from
// the nodes bucket, Record from the members bucket (zero for the bootstrap
// node and for nodes added with Join directly).
type ClusterMember struct {
	ID          string `json:"id"`
	RaftAddr    string `json:"raft_addr"`
	ForwardAddr string `json:"forward_addr,omitempty"`
	Suffrage    string `json:"suffrage"` // Voter | Nonvoter | Staging
	Leader      bool   `json:"leader"`
	Record      Member `json:"record"`
	// Version is the node's version record (versions.go); zero when it has
	// not registered one (an older binary, or not yet started).
	Version NodeVersion `json:"version"`
}

var nodeIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// applyPutJoinToken stores a new token; an existing hash is ErrConflict.
func applyPutJoinToken(a *applyCtx, t *JoinToken) error {
	if t == nil || len(t.Hash) != 64 {
		return fmt.Errorf("%w: join token needs a 64-hex-digit hash", ErrInvalid)
	}
	if _, err := hex.DecodeString(t.Hash); err != nil {
		return fmt.Errorf("%w: join token hash is not hex", ErrInvalid)
	}
	if !t.Expires.After(a.now) {
		return fmt.Errorf("%w: join token expires at %s, not after now", ErrInvalid, t.Expires.Format(time.RFC3339))
	}
	b := a.tx.Bucket(bJoinTokens)
	if b.Get([]byte(t.Hash)) != nil {
		return fmt.Errorf("%w: join token %s exists", ErrConflict, t.ID())
	}
	rec := *t
	rec.TTL = 0
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(t.Hash), raw); err != nil {
		return err
	}
	return a.event(Event{Subject: "join_token/" + t.ID(), Kind: "join_token_created", To: rec.Expires.Format(time.RFC3339)})
}

// checkToken returns the token record for hash, refused (ErrJoinToken)
// when unknown, already used or expired at now.
func checkToken(b *bbolt.Bucket, hash string, now time.Time) (JoinToken, error) {
	var t JoinToken
	raw := b.Get([]byte(hash))
	if raw == nil {
		return t, fmt.Errorf("%w: token %s is unknown to this cluster: it was created on another cluster, "+
			"or mistyped; create one with `kiln cluster token create`", ErrJoinToken, pki.TokenID(hash))
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("%w: join token record: %v", ErrCorrupt, err)
	}
	if t.UsedBy != "" {
		return t, fmt.Errorf("%w: token %s was already used by node %s at %s: tokens are one-time; "+
			"create a new one with `kiln cluster token create`", ErrJoinToken, t.ID(), t.UsedBy, t.UsedAt.Format(time.RFC3339))
	}
	if !now.Before(t.Expires) {
		return t, fmt.Errorf("%w: token %s expired at %s; create a new one with `kiln cluster token create --ttl`",
			ErrJoinToken, t.ID(), t.Expires.Format(time.RFC3339))
	}
	return t, nil
}

// applyUseJoinToken consumes the token (at the leader's time) and records
// the member with the serial of the certificate it was issued.
func applyUseJoinToken(a *applyCtx, t *JoinToken, m *Member) error {
	if t == nil || m == nil || !nodeIDRe.MatchString(m.ID) || m.CertSerial == "" {
		return fmt.Errorf("%w: use_join_token needs a token hash, a node ID and a certificate serial", ErrInvalid)
	}
	b := a.tx.Bucket(bJoinTokens)
	rec, err := checkToken(b, t.Hash, a.now)
	if err != nil {
		return err
	}
	rec.UsedBy, rec.UsedAt = m.ID, a.now
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(rec.Hash), raw); err != nil {
		return err
	}
	mem := Member{ID: m.ID, CertSerial: m.CertSerial, TokenID: rec.ID(), JoinedAt: a.now}
	if raw, err = json.Marshal(mem); err != nil {
		return err
	}
	if err := a.tx.Bucket(bMembers).Put([]byte(m.ID), raw); err != nil {
		return err
	}
	return a.event(Event{Subject: "node/" + m.ID, Kind: "member_admitted", To: m.CertSerial,
		Message: orStr(a.w.Message, "join token "+rec.ID())})
}

// applyRemoveMember marks node id removed: its certificate is refused from
// then on (a later enrollment with a new token re-admits the ID with a new
// certificate; the old one stays refused by serial).
func applyRemoveMember(a *applyCtx, id string) error {
	if id == "" {
		return fmt.Errorf("%w: remove_member without node id", ErrInvalid)
	}
	b := a.tx.Bucket(bMembers)
	m := Member{ID: id}
	if raw := b.Get([]byte(id)); raw != nil {
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%w: member record %s: %v", ErrCorrupt, id, err)
		}
	}
	m.Removed, m.RemovedAt = true, a.now
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(id), raw); err != nil {
		return err
	}
	return a.event(Event{Subject: "node/" + id, Kind: "member_removed"})
}

// peerCheck refuses the certificate of a removed member, or one whose
// serial is not the one its member record holds (a superseded certificate).
// It reads the local replica.
func (s *Store) peerCheck(leaf *x509.Certificate) error {
	id := leaf.Subject.CommonName
	m, err := s.member(id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: peer check of %s: %w", id, err)
	}
	if m.Removed {
		return fmt.Errorf("certificate of node %s refused: the node was removed from the cluster at %s", id, m.RemovedAt.Format(time.RFC3339))
	}
	sn := pki.Serial(leaf)
	switch {
	case m.CertSerial == "" || sn == m.CertSerial || (m.PrevSerial != "" && sn == m.PrevSerial):
		return nil
	case m.TokenID != "" && pki.EnrollmentOf(leaf) == m.TokenID:
		return nil // a renewal of the same enrollment this replica has not applied yet
	}
	return fmt.Errorf("certificate %s of node %s refused: superseded by certificate %s", sn, id, m.CertSerial)
}

func (s *Store) member(id string) (Member, error) {
	var m Member
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		raw := tx.Bucket(bMembers).Get([]byte(id))
		if raw == nil {
			return fmt.Errorf("%w: member %s", ErrNotFound, id)
		}
		return json.Unmarshal(raw, &m)
	})
	return m, err
}

// CreateJoinToken makes a one-time join token valid for ttl (0 =
// DefaultJoinTokenTTL; MinJoinTokenTTL..MaxJoinTokenTTL, else ErrInvalid;
// ErrNoRaft on a local store).
// The secret is made here and returned once, in the token string
// ("kiln1.SECRET.CAHASH", see package pki); only its SHA-256 is written to
// the log. The record returned has the leader's Created and Expires.
func (s *Store) CreateJoinToken(ctx context.Context, ttl time.Duration, w W) (string, JoinToken, error) {
	if s.raft == nil || s.Identity() == nil {
		return "", JoinToken{}, fmt.Errorf("%w: CreateJoinToken", ErrNoRaft)
	}
	if ttl == 0 {
		ttl = DefaultJoinTokenTTL
	}
	if ttl < MinJoinTokenTTL || ttl > MaxJoinTokenTTL {
		return "", JoinToken{}, fmt.Errorf("%w: join token ttl %s: want %s to %s", ErrInvalid, ttl, MinJoinTokenTTL, MaxJoinTokenTTL)
	}
	tok := pki.NewToken(s.Identity().CAHash())
	rec := &JoinToken{Hash: tok.Hash(), TTL: ttl, CreatedBy: w.Actor}
	if _, _, err := s.write(ctx, &command{Type: CmdPutJoinToken, W: w, JoinToken: rec}); err != nil {
		return "", JoinToken{}, err
	}
	got, err := s.joinToken(rec.Hash)
	if err != nil {
		// Forwarded: the local replica may lag; the leader's values are
		// rec's after prepare on the leader, which we cannot see here.
		if err := s.Barrier(ctx); err != nil {
			return "", JoinToken{}, err
		}
		if got, err = s.joinToken(rec.Hash); err != nil {
			return "", JoinToken{}, err
		}
	}
	return tok.String(), got, nil
}

func (s *Store) joinToken(hash string) (JoinToken, error) {
	var t JoinToken
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		raw := tx.Bucket(bJoinTokens).Get([]byte(hash))
		if raw == nil {
			return fmt.Errorf("%w: join token %s", ErrNotFound, pki.TokenID(hash))
		}
		return json.Unmarshal(raw, &t)
	})
	return t, err
}

// Members lists the servers of the current raft configuration, in its
// order, with their forward addresses and member records (ErrNoRaft on a
// local store; RemoveMember and PushSecrets fail the same way).
func (s *Store) Members() ([]ClusterMember, error) {
	if s.raft == nil {
		return nil, fmt.Errorf("%w: Members", ErrNoRaft)
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("store: raft configuration: %w", err)
	}
	_, leader := s.raft.LeaderWithID()
	var out []ClusterMember
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		for _, sv := range f.Configuration().Servers {
			cm := ClusterMember{ID: string(sv.ID), RaftAddr: string(sv.Address), Suffrage: sv.Suffrage.String(),
				Leader: sv.ID == leader, ForwardAddr: string(tx.Bucket(bNodes).Get([]byte(sv.ID)))}
			if raw := tx.Bucket(bMembers).Get([]byte(sv.ID)); raw != nil {
				if err := json.Unmarshal(raw, &cm.Record); err != nil {
					return err
				}
			}
			if raw := tx.Bucket(bNodeVersions).Get([]byte(sv.ID)); raw != nil {
				if err := json.Unmarshal(raw, &cm.Version); err != nil {
					return err
				}
			}
			out = append(out, cm)
		}
		return nil
	})
	return out, err
}

// RemoveMember removes node id from the raft configuration (Remove) and
// then marks it removed, so its certificate is refused on the raft and
// forward ports from then on. Errors: ErrNotFound (not a member),
// ErrInvalid (the only voter), and those of Remove and of a write.
func (s *Store) RemoveMember(ctx context.Context, id string, w W) error {
	ms, err := s.Members()
	if err != nil {
		return err
	}
	found := false
	for _, m := range ms {
		found = found || m.ID == id
	}
	if !found {
		return fmt.Errorf("%w: %s is not a member of this cluster (see `kiln cluster members`)", ErrNotFound, id)
	}
	if len(ms) == 1 {
		return fmt.Errorf("%w: %s is the only voter; removing it would leave no cluster", ErrInvalid, id)
	}
	if err := s.Remove(ctx, id); err != nil {
		return err
	}
	if _, _, err := s.write(ctx, &command{Type: CmdRemoveMember, W: w, ID: id}); err != nil {
		return fmt.Errorf("store: %s left the raft configuration, but marking it removed failed (run `kiln cluster remove %s` again): %w", id, id, err)
	}
	s.trans.CloseStreams()
	return nil
}

// enrollRequest is the body of POST /cluster/enroll: the token's secret,
// the joiner's node ID and its certificate request (DER PKCS#10; the
// private key stays on the joiner).
type enrollRequest struct {
	Secret string `json:"secret"`
	NodeID string `json:"node_id"`
	CSR    []byte `json:"csr"`
}

// enrollReply carries the issued certificate, the site CA and its key (DER
// PKCS#8), and the site secrets Config.JoinSecrets gives (the site key).
type enrollReply struct {
	Cert    []byte            `json:"cert,omitempty"`
	CA      []byte            `json:"ca,omitempty"`
	CAKey   []byte            `json:"ca_key,omitempty"`
	Trust   [][]byte          `json:"trust,omitempty"` // further CAs trusted (mid CA rotation)
	Secrets map[string][]byte `json:"secrets,omitempty"`
	Error   *wireError        `json:"error,omitempty"`
}

// serveEnroll is POST /cluster/enroll, the one route of the forward port
// that needs no site certificate: it needs a valid join token instead.
func (s *Store) serveEnroll(w http.ResponseWriter, r *http.Request) {
	reply := func(status int, rep enrollReply) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(rep)
	}
	refuse := func(status int, err error) {
		s.log.Warn("enrollment refused", "remote", r.RemoteAddr, "err", err)
		reply(status, enrollReply{Error: toWire(err)})
	}
	select {
	case s.enrollSem <- struct{}{}:
		defer func() { <-s.enrollSem }()
	default:
		refuse(http.StatusServiceUnavailable, fmt.Errorf("%w: busy with other enrollments; retry", ErrTimeout))
		return
	}
	var req enrollRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEnrollBody)).Decode(&req); err != nil {
		refuse(http.StatusBadRequest, fmt.Errorf("%w: enrollment body: %v", ErrInvalid, err))
		return
	}
	if !nodeIDRe.MatchString(req.NodeID) || req.Secret == "" {
		refuse(http.StatusBadRequest, fmt.Errorf("%w: enrollment needs a token secret and a node ID of 1-63 letters, digits, '.', '_' or '-'", ErrInvalid))
		return
	}
	hash := pki.HashSecret(req.Secret)
	// Check the local replica first, so a guessed token costs no raft
	// write; a token just created may not have reached this follower yet.
	check := func() error {
		return s.fsm.view(func(tx *bbolt.Tx) error {
			_, err := checkToken(tx.Bucket(bJoinTokens), hash, time.Now())
			return err
		})
	}
	err := check()
	if errors.Is(err, ErrJoinToken) && !s.IsLeader() {
		if s.Barrier(r.Context()) == nil {
			err = check()
		}
	}
	if err != nil {
		refuse(http.StatusForbidden, err)
		return
	}
	ident := s.Identity()
	cert, err := ident.SignWith(req.CSR, req.NodeID, pki.SignOptions{Now: time.Now(), Validity: s.cfg.CertLifetime,
		Enrollment: pki.TokenID(hash)})
	if err != nil {
		refuse(http.StatusBadRequest, fmt.Errorf("%w: %v", ErrInvalid, err))
		return
	}
	c := &command{Type: CmdUseJoinToken, W: W{Actor: "store:" + s.cfg.NodeID, Reason: "join"},
		JoinToken: &JoinToken{Hash: hash}, Member: &Member{ID: req.NodeID, CertSerial: pki.Serial(cert)}}
	if _, _, err := s.write(r.Context(), c); err != nil {
		status := http.StatusForbidden
		if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		refuse(status, err)
		return
	}
	rep := enrollReply{Cert: cert.Raw, CA: ident.CA.Raw}
	for _, c := range ident.Trust {
		rep.Trust = append(rep.Trust, c.Raw)
	}
	if rep.CAKey, err = pki.MarshalKey(ident.CAKey); err != nil {
		refuse(http.StatusInternalServerError, err)
		return
	}
	if s.cfg.JoinSecrets != nil {
		if rep.Secrets, err = s.cfg.JoinSecrets(); err != nil {
			refuse(http.StatusInternalServerError, err)
			return
		}
	}
	s.log.Info("node enrolled", "node", req.NodeID, "serial", pki.Serial(cert), "remote", r.RemoteAddr)
	reply(http.StatusOK, rep)
}

// Enroll obtains this node's credentials from an existing cluster before
// the node's store is opened: it sends nodeID, a certificate request for a
// key made here and the secret of token (pki.ParseToken) to the forward
// address of a member (host:port, Config.ForwardAddr), over TLS that
// verifies the member's CA against the hash the token carries — the secret
// is never sent to a peer that fails it. It returns the identity (site CA
// and key, and this node's certificate and key) and the site secrets.
// Peers are tried in turn and the list retried with backoff while they are
// unreachable, busy or have no leader, until ctx ends. Errors: a malformed
// token (pki.ErrBadToken); ErrEnrollRefused wrapping the cluster's reason
// (unknown, already used or expired token); pki.ErrWrongCA when every peer
// presented another CA; ctx's error wrapping the last failure.
func Enroll(ctx context.Context, peers []string, token, nodeID string) (*pki.Identity, map[string][]byte, error) {
	if len(peers) == 0 {
		return nil, nil, fmt.Errorf("%w: joining needs at least one peer forward address", ErrInvalid)
	}
	tok, err := pki.ParseToken(token)
	if err != nil {
		return nil, nil, err
	}
	key, err := pki.NewKey()
	if err != nil {
		return nil, nil, err
	}
	csr, err := pki.NewCSR(key, nodeID)
	if err != nil {
		return nil, nil, err
	}
	body, _ := json.Marshal(enrollRequest{Secret: tok.Secret, NodeID: nodeID, CSR: csr})
	tr := &http.Transport{TLSClientConfig: pki.JoinClientTLS(tok.CAHash)}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	backoff := 200 * time.Millisecond
	var last error
	for {
		wrongCA := 0
		for _, p := range peers {
			id, secrets, err := enrollOnce(ctx, hc, p, body, key, tok.CAHash)
			if err == nil {
				return id, secrets, nil
			}
			if errors.Is(err, ErrEnrollRefused) {
				return nil, nil, err
			}
			if errors.Is(err, pki.ErrWrongCA) {
				wrongCA++
			}
			last = err
		}
		if wrongCA == len(peers) {
			return nil, nil, fmt.Errorf("store: join via %v: %w", peers, last)
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("store: join via %v: %w (last: %v)", peers, ctx.Err(), last)
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
}

func enrollOnce(ctx context.Context, hc *http.Client, peer string, body []byte, key *ecdsa.PrivateKey, caHash string) (*pki.Identity, map[string][]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+peer+"/cluster/enroll", bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: peer %q: %v", ErrEnrollRefused, peer, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("peer %s: %w", peer, err)
	}
	defer resp.Body.Close()
	var rep enrollReply
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxForwardBody)).Decode(&rep); err != nil {
		return nil, nil, fmt.Errorf("peer %s: bad enrollment reply (HTTP %d): %w", peer, resp.StatusCode, err)
	}
	if rep.Error != nil || resp.StatusCode != http.StatusOK {
		err := fromWire(rep.Error)
		if err == nil {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusBadRequest {
			return nil, nil, fmt.Errorf("%w by %s: %w", ErrEnrollRefused, peer, err)
		}
		return nil, nil, fmt.Errorf("peer %s (HTTP %d): %w", peer, resp.StatusCode, err)
	}
	id := &pki.Identity{}
	if id.CA, err = x509.ParseCertificate(rep.CA); err != nil {
		return nil, nil, fmt.Errorf("peer %s: CA certificate: %w", peer, err)
	}
	if pki.SPKIHash(id.CA) != caHash {
		return nil, nil, fmt.Errorf("peer %s: %w", peer, pki.ErrWrongCA)
	}
	if id.Cert, err = x509.ParseCertificate(rep.Cert); err != nil {
		return nil, nil, fmt.Errorf("peer %s: node certificate: %w", peer, err)
	}
	if id.CAKey, err = pki.ParseKey(rep.CAKey); err != nil {
		return nil, nil, fmt.Errorf("peer %s: %w", peer, err)
	}
	id.Key = key
	for _, raw := range rep.Trust {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("peer %s: trusted CA certificate: %w", peer, err)
		}
		id.Trust = append(id.Trust, c)
	}
	if err := id.Check(); err != nil {
		return nil, nil, fmt.Errorf("peer %s: issued credentials: %w", peer, err)
	}
	return id, rep.Secrets, nil
}

// secretsPush is the body of POST /raft/secrets.
type secretsPush struct {
	Secrets map[string][]byte `json:"secrets"`
}

// serveSecrets is POST /raft/secrets (mutual TLS, any node, not only the
// leader): a member hands this node new site secrets (a rotated keyring);
// Config.OnSecrets stores them before the reply.
func (s *Store) serveSecrets(w http.ResponseWriter, r *http.Request) {
	var p secretsPush
	reply := func(status int, err error) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(wireResult{Error: toWire(err)})
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEnrollBody)).Decode(&p); err != nil {
		reply(http.StatusBadRequest, fmt.Errorf("%w: secrets body: %v", ErrInvalid, err))
		return
	}
	if s.cfg.OnSecrets == nil {
		reply(http.StatusOK, fmt.Errorf("%w: node %s takes no site secrets", ErrInvalid, s.cfg.NodeID))
		return
	}
	if err := s.cfg.OnSecrets(p.Secrets); err != nil {
		reply(http.StatusOK, err)
		return
	}
	s.log.Info("site secrets updated by a member", "names", len(p.Secrets))
	reply(http.StatusOK, nil)
}

// PushSecrets hands secrets to every server of the raft configuration
// (Config.OnSecrets on each; on this node directly, on the others through
// POST /raft/secrets over mutual TLS) and returns once all of them have
// stored them. A member that cannot be reached or refuses makes it fail,
// naming the member; members already updated keep what they got.
func (s *Store) PushSecrets(ctx context.Context, secrets map[string][]byte) error {
	ms, err := s.Members()
	if err != nil {
		return err
	}
	body, _ := json.Marshal(secretsPush{Secrets: secrets})
	for _, m := range ms {
		if m.ID == s.cfg.NodeID {
			if s.cfg.OnSecrets == nil {
				return fmt.Errorf("%w: node %s takes no site secrets", ErrInvalid, m.ID)
			}
			if err := s.cfg.OnSecrets(secrets); err != nil {
				return fmt.Errorf("store: site secrets on %s: %w", m.ID, err)
			}
			continue
		}
		if m.ForwardAddr == "" {
			return fmt.Errorf("%w: member %s has no forward address registered; it cannot be given the site secrets", ErrNotFound, m.ID)
		}
		var res wireResult
		pctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
		status, err := s.post(pctx, "https://"+m.ForwardAddr+"/raft/secrets", body, &res)
		cancel()
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("HTTP %d", status)
		}
		if err == nil {
			err = fromWire(res.Error)
		}
		if err != nil {
			return fmt.Errorf("store: site secrets to member %s at %s: %w", m.ID, m.ForwardAddr, err)
		}
	}
	return nil
}

// SecretKeys lists the keys of every stored secret (sorted).
func (s *Store) SecretKeys() ([]string, error) {
	var out []string
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bSecrets).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}
