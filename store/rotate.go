package store

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"kiln/store/pki"
)

// Site CA rotation (RotateCA, `kiln cluster rotate-ca`): four steps, each
// done on every member before the next starts, so at every moment every
// pair of nodes trusts each other's certificate:
//
//  1. trust:  the new CA certificate joins every node's trust bundle
//     (pki.Identity.Trust); nothing is signed by it yet.
//  2. switch: every node's signing CA becomes the new one (certificate and
//     key); the old CA stays in the trust bundle, so the certificates it
//     signed are still accepted.
//  3. renew:  every node renews its certificate (through the leader, which
//     now signs with the new CA) and answers with the new certificate,
//     which must be the new CA's.
//  4. drop:   every node's trust bundle is emptied (only the new CA is
//     trusted); each closes its pooled connections, so the next ones are
//     made under the new trust alone.
//
// A step that fails on a member stops the rotation with an error naming the
// step and the member; the cluster stays consistent (every certificate in
// use is trusted everywhere) and the rotation can be run again: it makes
// another new CA, and its step 4 drops every CA but that one.

// CA rotation steps (POST /raft/ca "step").
const (
	caStepTrust  = "trust"
	caStepSwitch = "switch"
	caStepRenew  = "renew"
	caStepDrop   = "drop"
)

type caStep struct {
	Step  string `json:"step"`
	CA    []byte `json:"ca,omitempty"`     // DER certificate of the new CA (trust, switch)
	CAKey []byte `json:"ca_key,omitempty"` // DER PKCS#8 key of the new CA (switch)
}

type caStepReply struct {
	Cert  []byte     `json:"cert,omitempty"` // renew: the new certificate
	Error *wireError `json:"error,omitempty"`
}

// CARotation is what RotateCA did: the old and new CA (SPKI hashes, the
// form join tokens carry) and each member's new certificate serial.
type CARotation struct {
	OldCA   string            `json:"old_ca"`
	NewCA   string            `json:"new_ca"`
	Members map[string]string `json:"members"` // node ID → new certificate serial
}

// RotateCA replaces the site CA with a new one in the four steps above,
// on every server of the raft configuration (this one directly, the others
// through POST /raft/ca over mutual TLS). Every member must be reachable
// and understand CmdRenewMember (else ErrUnsupportedByCluster before
// anything changes). Join tokens made before carry the old CA's hash and
// stop working: make new ones. Errors name the step and the member.
func (s *Store) RotateCA(ctx context.Context) (CARotation, error) {
	var rep CARotation
	ms, err := s.Members()
	if err != nil {
		return rep, err
	}
	old := map[string]CommandType{}
	for _, m := range ms {
		max := m.Version.MaxCommand
		if m.ID == s.cfg.NodeID {
			max = s.maxCommand()
		}
		if max < CmdRenewMember {
			old[m.ID] = max
		}
		if m.ID != s.cfg.NodeID && m.ForwardAddr == "" {
			return rep, fmt.Errorf("%w: member %s has no forward address registered; it cannot take part in a CA rotation", ErrNotFound, m.ID)
		}
	}
	if len(old) > 0 {
		return rep, &UnsupportedByClusterError{Command: CmdRenewMember, Old: old, Unregistered: map[string]bool{}}
	}
	ca, key, err := pki.NewCA(time.Now())
	if err != nil {
		return rep, err
	}
	keyDER, err := pki.MarshalKey(key)
	if err != nil {
		return rep, err
	}
	rep.OldCA, rep.NewCA, rep.Members = s.Identity().CAHash(), pki.SPKIHash(ca), map[string]string{}
	s.log.Info("site CA rotation started", "old_ca", "sha256:"+rep.OldCA, "new_ca", "sha256:"+rep.NewCA, "members", len(ms))
	for _, st := range []caStep{{Step: caStepTrust, CA: ca.Raw}, {Step: caStepSwitch, CA: ca.Raw, CAKey: keyDER},
		{Step: caStepRenew}, {Step: caStepDrop}} {
		for _, m := range ms {
			cert, err := s.caStepOn(ctx, m, st)
			if err != nil {
				return rep, fmt.Errorf("store: CA rotation step %q on member %s: %w (the cluster is consistent; run the rotation again)", st.Step, m.ID, err)
			}
			if st.Step == caStepRenew {
				if cert == nil || cert.CheckSignatureFrom(ca) != nil {
					return rep, fmt.Errorf("store: CA rotation step %q on member %s: its new certificate is not the new CA's (run the rotation again)", st.Step, m.ID)
				}
				rep.Members[m.ID] = pki.Serial(cert)
			}
		}
		s.log.Info("site CA rotation step done on every member", "step", st.Step)
	}
	return rep, nil
}

func (s *Store) caStepOn(ctx context.Context, m ClusterMember, st caStep) (*x509.Certificate, error) {
	sctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	if m.ID == s.cfg.NodeID {
		return s.doCAStep(sctx, st)
	}
	body, _ := json.Marshal(st)
	var rep caStepReply
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, "https://"+m.ForwardAddr+"/raft/ca", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxEnrollBody)).Decode(&rep); err != nil {
		return nil, fmt.Errorf("bad reply (HTTP %d): %w", resp.StatusCode, err)
	}
	if rep.Error != nil {
		return nil, fromWire(rep.Error)
	}
	if rep.Cert == nil {
		return nil, nil
	}
	return x509.ParseCertificate(rep.Cert)
}

// serveCAStep is POST /raft/ca (mutual TLS, every node): one step of a CA
// rotation on this node.
func (s *Store) serveCAStep(w http.ResponseWriter, r *http.Request) {
	var st caStep
	reply := func(status int, rep caStepReply) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(rep)
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEnrollBody)).Decode(&st); err != nil {
		reply(http.StatusBadRequest, caStepReply{Error: toWire(fmt.Errorf("%w: CA step body: %v", ErrInvalid, err))})
		return
	}
	cert, err := s.doCAStep(r.Context(), st)
	if err != nil {
		reply(http.StatusOK, caStepReply{Error: toWire(err)})
		return
	}
	rep := caStepReply{}
	if cert != nil {
		rep.Cert = cert.Raw
	}
	reply(http.StatusOK, rep)
}

// doCAStep applies one rotation step to this node's identity.
func (s *Store) doCAStep(ctx context.Context, st caStep) (*x509.Certificate, error) {
	if st.Step == caStepRenew {
		return s.RenewCertificate(ctx)
	}
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	cur := s.Identity()
	next := cur.Clone()
	var ca *x509.Certificate
	if st.Step == caStepTrust || st.Step == caStepSwitch {
		var err error
		if ca, err = x509.ParseCertificate(st.CA); err != nil || !ca.IsCA {
			return nil, fmt.Errorf("%w: CA rotation: the new CA certificate does not parse as a CA", ErrInvalid)
		}
	}
	switch st.Step {
	case caStepTrust:
		if ca.Equal(cur.CA) {
			return nil, nil
		}
		for _, c := range cur.Trust {
			if c.Equal(ca) {
				return nil, nil
			}
		}
		next.Trust = append(next.Trust, ca)
	case caStepSwitch:
		key, err := pki.ParseKey(st.CAKey)
		if err != nil || !key.PublicKey.Equal(ca.PublicKey) {
			return nil, fmt.Errorf("%w: CA rotation: the new CA key does not match its certificate", ErrInvalid)
		}
		if ca.Equal(cur.CA) {
			return nil, nil
		}
		next.Trust = []*x509.Certificate{cur.CA}
		for _, c := range cur.Trust {
			if !c.Equal(ca) {
				next.Trust = append(next.Trust, c)
			}
		}
		next.CA, next.CAKey = ca, key
	case caStepDrop:
		if next.Issuer() == nil || !next.Issuer().Equal(next.CA) {
			return nil, fmt.Errorf("%w: CA rotation: this node's certificate is not the current CA's yet; renew it first", ErrInvalid)
		}
		next.Trust = nil
	default:
		return nil, fmt.Errorf("%w: CA rotation: unknown step %q", ErrInvalid, st.Step)
	}
	if err := next.Check(); err != nil {
		return nil, fmt.Errorf("store: CA rotation step %s: %w", st.Step, err)
	}
	if err := s.setIdentity(next); err != nil {
		return nil, err
	}
	if st.Step == caStepDrop {
		// Connections made under the old trust are closed; new ones are
		// verified under the new CA alone.
		s.trans.CloseStreams()
		s.http.CloseIdleConnections()
	}
	s.log.Info("site CA rotation step", "step", st.Step, "ca", "sha256:"+next.CAHash(), "trusted", 1+len(next.Trust))
	return nil, nil
}
