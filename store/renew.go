package store

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.etcd.io/bbolt"

	"kiln/store/pki"
)

// Certificate renewal and site CA rotation (DESIGN.md "Cluster trust").
//
// Renewal: each node's renewLoop renews its certificate once
// Config.RenewFraction of its lifetime has passed: a fresh key and CSR go
// to the leader's POST /raft/renew over the forward RPC's mutual TLS (the
// leader signs locally when it is the renewing node). The leader signs for
// the node its client certificate names, with its current signing CA and
// Config.CertLifetime, naming the node's enrollment (Member.TokenID), commits
// CmdRenewMember (the member record's new serial) and only then replies.
// The node checks the certificate against its own key and trust bundle,
// stores it (Config.OnIdentity) and swaps it in: raft's transport and the
// forward RPC take their certificate and trust from Identity at every
// handshake (pki.ServerTLSFrom, pki.ClientTLSFrom), so no restart.

// DefaultRenewFraction is the fraction of a certificate's lifetime after
// which a node renews it (Config.RenewFraction).
const DefaultRenewFraction = 2.0 / 3.0

// Bounds of the renewal loop's check interval: lifetime/20 within them.
const (
	renewCheckMin = 50 * time.Millisecond
	renewCheckMax = time.Minute
)

// Identity is this node's current site identity (Config.Identity at Open,
// then renewed certificates and CA rotation steps).
func (s *Store) Identity() *pki.Identity { return s.ident.Load() }

// renewDue is when a certificate should be renewed: NotBefore + fraction
// of its lifetime.
func renewDue(c *x509.Certificate, fraction float64) time.Time {
	span := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(span) * fraction))
}

func (s *Store) renewFraction() float64 {
	if s.cfg.RenewFraction == 0 {
		return DefaultRenewFraction
	}
	return s.cfg.RenewFraction
}

// renewLoop renews this node's certificate when it is due (renewDue),
// retrying at every check until it succeeds. Runs until Close.
func (s *Store) renewLoop() {
	defer s.wg.Done()
	for {
		c := s.Identity().Cert
		every := min(max(c.NotAfter.Sub(c.NotBefore)/20, renewCheckMin), renewCheckMax)
		select {
		case <-s.done:
			return
		case <-time.After(every):
		}
		c = s.Identity().Cert
		if time.Now().Before(renewDue(c, s.renewFraction())) {
			continue
		}
		if leader, _ := s.Leader(); leader == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(s.baseCtx, s.cfg.ApplyTimeout)
		_, err := s.RenewCertificate(ctx)
		cancel()
		switch {
		case err == nil, errors.Is(err, ErrClosed):
		case time.Until(c.NotAfter) < 4*every:
			s.log.Error("certificate renewal failed and the certificate expires soon: peers will refuse this node",
				"serial", pki.Serial(c), "not_after", c.NotAfter, "err", err)
		default:
			s.log.Warn("certificate renewal failed (retrying)", "serial", pki.Serial(c), "err", err)
		}
	}
}

// renewRequest is the body of POST /raft/renew; renewReply its answer.
type renewRequest struct {
	CSR []byte `json:"csr"`
}

type renewReply struct {
	Cert  []byte     `json:"cert,omitempty"`
	Error *wireError `json:"error,omitempty"`
}

// RenewCertificate renews this node's certificate now (what renewLoop does
// when it is due) and returns the new one, in use from the next
// handshake. Errors: those of the leader's signing and CmdRenewMember
// (ErrUnsupportedByCluster while a node does not know it), of
// Config.OnIdentity, or a certificate that does not match the request.
func (s *Store) RenewCertificate(ctx context.Context) (*x509.Certificate, error) {
	if s.raft == nil {
		return nil, fmt.Errorf("%w: RenewCertificate", ErrNoRaft)
	}
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	csr, err := pki.NewCSR(key, s.cfg.NodeID)
	if err != nil {
		return nil, err
	}
	var cert *x509.Certificate
	for attempt := 0; ; attempt++ {
		if s.IsLeader() {
			cert, err = s.issueRenewal(ctx, csr, s.cfg.NodeID, s.Identity().Cert)
		} else {
			cert, err = s.renewViaLeader(ctx, csr)
		}
		if !errors.Is(err, errSelfLeader) || attempt > 3 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	cur := s.Identity()
	next := cur.Clone()
	next.Cert, next.Key = cert, key
	if cert.Subject.CommonName != s.cfg.NodeID {
		return nil, fmt.Errorf("store: renewed certificate names %q, not this node", cert.Subject.CommonName)
	}
	if err := next.Check(); err != nil {
		return nil, fmt.Errorf("store: renewed certificate refused: %w", err)
	}
	if err := s.setIdentity(next); err != nil {
		return nil, err
	}
	s.log.Info("certificate renewed", "serial", pki.Serial(cert), "not_after", cert.NotAfter,
		"previous", pki.Serial(cur.Cert), "ca", "sha256:"+pki.SPKIHash(next.Issuer()))
	return cert, nil
}

// setIdentity stores next (Config.OnIdentity) and then uses it.
func (s *Store) setIdentity(next *pki.Identity) error {
	if s.cfg.OnIdentity != nil {
		if err := s.cfg.OnIdentity(next); err != nil {
			return fmt.Errorf("store: saving the new identity: %w", err)
		}
	}
	s.ident.Store(next)
	return nil
}

func (s *Store) renewViaLeader(ctx context.Context, csr []byte) (*x509.Certificate, error) {
	id, _ := s.Leader()
	if id == "" {
		return nil, &NotLeaderError{}
	}
	if id == s.cfg.NodeID {
		return nil, errSelfLeader
	}
	addr, err := s.forwardAddrOf(id)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(renewRequest{CSR: csr})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/raft/renew", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("store: renew via leader %s: %w", id, err)
	}
	defer resp.Body.Close()
	var rep renewReply
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxEnrollBody)).Decode(&rep); err != nil {
		return nil, fmt.Errorf("store: renew via leader %s: bad reply (HTTP %d): %w", id, resp.StatusCode, err)
	}
	if rep.Error != nil {
		if rep.Error.Code == "not_leader" {
			return nil, &NotLeaderError{LeaderID: id, Cause: errors.New(rep.Error.Message)}
		}
		return nil, fmt.Errorf("store: renew via leader %s: %w", id, fromWire(rep.Error))
	}
	return x509.ParseCertificate(rep.Cert)
}

// serveRenew is POST /raft/renew (mutual TLS, the leader): it issues a
// renewed certificate to the node its client certificate names.
func (s *Store) serveRenew(w http.ResponseWriter, r *http.Request) {
	reply := func(status int, rep renewReply) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(rep)
	}
	if !s.IsLeader() {
		id, _ := s.Leader()
		reply(http.StatusServiceUnavailable, renewReply{Error: &wireError{Code: "not_leader",
			Message: fmt.Sprintf("%s is not the leader (leader %q)", s.cfg.NodeID, id)}})
		return
	}
	var req renewRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEnrollBody)).Decode(&req); err != nil {
		reply(http.StatusBadRequest, renewReply{Error: toWire(fmt.Errorf("%w: renew body: %v", ErrInvalid, err))})
		return
	}
	caller := r.TLS.VerifiedChains[0][0]
	cert, err := s.issueRenewal(r.Context(), req.CSR, caller.Subject.CommonName, caller)
	if err != nil {
		status := http.StatusForbidden
		if errors.Is(err, ErrNotLeader) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed) {
			status = http.StatusServiceUnavailable
		}
		s.log.Warn("certificate renewal refused", "node", caller.Subject.CommonName, "err", err)
		reply(status, renewReply{Error: toWire(err)})
		return
	}
	reply(http.StatusOK, renewReply{Cert: cert.Raw})
}

// issueRenewal signs csr for node (whose current certificate is cur) with
// this node's signing CA, commits CmdRenewMember and returns the
// certificate. Only the leader calls it.
func (s *Store) issueRenewal(ctx context.Context, csr []byte, node string, cur *x509.Certificate) (*x509.Certificate, error) {
	m, err := s.member(node)
	switch {
	case errors.Is(err, ErrNotFound):
		m = Member{ID: node, TokenID: "renew-" + randID("")[:8]} // first renewal of a node without a record
	case err != nil:
		return nil, err
	case m.Removed:
		return nil, fmt.Errorf("%w: node %s was removed from the cluster", ErrInvalid, node)
	case m.TokenID == "":
		m.TokenID = "renew-" + randID("")[:8]
	}
	ident := s.Identity()
	cert, err := ident.SignWith(csr, node, pki.SignOptions{Now: time.Now(), Validity: s.cfg.CertLifetime, Enrollment: m.TokenID})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	c := &command{Type: CmdRenewMember, W: W{Actor: "store:" + s.cfg.NodeID, Reason: "cert_renewal"},
		Member: &Member{ID: node, CertSerial: pki.Serial(cert), PrevSerial: pki.Serial(cur), TokenID: m.TokenID,
			CertNotAfter: cert.NotAfter.UTC(), CAHash: ident.CAHash()}}
	if _, _, err := s.write(ctx, c); err != nil {
		return nil, err
	}
	return cert, nil
}

// applyRenewMember is CmdRenewMember: the member record of m.ID takes the
// renewed certificate's serial (the current one becomes PrevSerial), its
// expiry and CA; a node without a record gets one (with m.TokenID as its
// enrollment and m.PrevSerial as the certificate it renewed). A removed
// member is refused.
func applyRenewMember(a *applyCtx, m *Member) error {
	if m == nil || !nodeIDRe.MatchString(m.ID) || m.CertSerial == "" {
		return fmt.Errorf("%w: renew_member needs a node ID and a certificate serial", ErrInvalid)
	}
	b := a.tx.Bucket(bMembers)
	rec := Member{ID: m.ID, PrevSerial: m.PrevSerial, TokenID: m.TokenID}
	if raw := b.Get([]byte(m.ID)); raw != nil {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return fmt.Errorf("%w: member record %s: %v", ErrCorrupt, m.ID, err)
		}
		if rec.Removed {
			return fmt.Errorf("%w: node %s was removed; its certificate is not renewed", ErrInvalid, m.ID)
		}
		if rec.CertSerial != "" {
			rec.PrevSerial = rec.CertSerial
		} else {
			rec.PrevSerial = m.PrevSerial
		}
		if rec.TokenID == "" {
			rec.TokenID = m.TokenID
		}
	}
	rec.CertSerial, rec.CertNotAfter, rec.CAHash, rec.RenewedAt = m.CertSerial, m.CertNotAfter, m.CAHash, a.now
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(m.ID), raw); err != nil {
		return err
	}
	return a.event(Event{Subject: "node/" + m.ID, Kind: "member_cert_renewed", From: rec.PrevSerial, To: rec.CertSerial,
		Message: "expires " + m.CertNotAfter.Format(time.RFC3339) + ", CA sha256:" + m.CAHash})
}

// MemberRecords returns every member record of the local replica (node ID →
// record), removed ones included.
func (s *Store) MemberRecords() (map[string]Member, error) {
	out := map[string]Member{}
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bMembers).ForEach(func(k, v []byte) error {
			var m Member
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			out[string(k)] = m
			return nil
		})
	})
	return out, err
}
