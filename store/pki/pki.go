// Package pki is the site's cluster PKI: a site CA made at bootstrap
// (ECDSA P-256, crypto/x509), node certificates signed by it, the mutual
// TLS configurations that raft and the forward RPC run over, and the
// one-time join token that lets a new node verify the cluster's CA before
// it sends anything. The trust model is in store/DESIGN.md "Cluster trust".
//
// It imports only the standard library.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Constants of the site PKI.
const (
	// ServerName is the DNS SAN every node certificate carries and every
	// peer verifies (nodes are reached by IP and may be re-addressed, so no
	// host name is checked; membership in the site CA is what counts).
	ServerName = "kiln-cluster.invalid"
	// CAValidity and NodeValidity are the lifetimes of the site CA and of a
	// node certificate (the default: the store renews a node's certificate
	// before it expires, and may issue shorter ones).
	CAValidity   = 20 * 365 * 24 * time.Hour
	NodeValidity = 10 * 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so a peer whose clock is a little behind
	// accepts a fresh certificate.
	clockSkew = 5 * time.Minute
)

// Files of an identity directory (Save, Load). Keys are PKCS#8 PEM, mode 0600.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
	// TrustFile holds the CAs of Identity.Trust (PEM certificates, one
	// after another); absent when Trust is empty.
	TrustFile = "trust.crt"
)

// Errors of package pki.
var (
	// ErrNoIdentity: the directory holds no node certificate (Load).
	ErrNoIdentity = errors.New("pki: no site certificate")
	// ErrBadToken: a join token string does not parse.
	ErrBadToken = errors.New("pki: malformed join token")
	// ErrWrongCA: a peer's certificate chain does not contain the CA the
	// join token names.
	ErrWrongCA = errors.New("pki: peer does not present the site CA the join token names")
	// ErrExpired: a node certificate is past its NotAfter (Check).
	ErrExpired = errors.New("pki: certificate expired")
	// ErrBadCSR: a certificate request is malformed or not self-signed.
	ErrBadCSR = errors.New("pki: bad certificate request")
)

// Identity is one node's credentials: the site CA (certificate and key:
// every member can admit a joiner) and the node's own
// certificate and key. Cert's Subject.CommonName is the node ID.
//
// Trust holds further CAs this node accepts peers from besides CA (the
// trust bundle): during a CA rotation the new CA before it signs, then the
// old one until every node is re-issued (store/DESIGN.md "Cluster trust").
// CA is the one that signs (Sign); Cert may be signed by CA or by a CA of
// Trust.
type Identity struct {
	CA    *x509.Certificate
	CAKey *ecdsa.PrivateKey
	Cert  *x509.Certificate
	Key   *ecdsa.PrivateKey
	Trust []*x509.Certificate
}

// Clone returns a copy of id whose Trust slice is its own (certificates
// and keys are shared: they are never modified).
func (id *Identity) Clone() *Identity {
	c := *id
	c.Trust = append([]*x509.Certificate(nil), id.Trust...)
	return &c
}

// Issuer is the CA certificate (CA or one of Trust) that signed Cert, or
// nil.
func (id *Identity) Issuer() *x509.Certificate {
	for _, ca := range append([]*x509.Certificate{id.CA}, id.Trust...) {
		if ca != nil && id.Cert.CheckSignatureFrom(ca) == nil {
			return ca
		}
	}
	return nil
}

// NodeID is the node ID the certificate names (its CommonName).
func (id *Identity) NodeID() string { return id.Cert.Subject.CommonName }

// NewKey returns a fresh ECDSA P-256 private key.
func NewKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// NewSite makes a new site CA and a certificate for nodeID signed by it
// (the bootstrap node's identity). now is the issue time.
func NewSite(nodeID string, now time.Time) (*Identity, error) {
	if nodeID == "" {
		return nil, errors.New("pki: empty node ID")
	}
	ca, caKey, err := NewCA(now)
	if err != nil {
		return nil, err
	}
	id := &Identity{CA: ca, CAKey: caKey}
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	csr, err := NewCSR(key, nodeID)
	if err != nil {
		return nil, err
	}
	if id.Cert, err = id.Sign(csr, nodeID, now); err != nil {
		return nil, err
	}
	id.Key = key
	return id, nil
}

// NewCA makes a new site CA certificate (CAValidity from now) and its key:
// what NewSite makes at bootstrap and a CA rotation makes anew.
func NewCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	caKey, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "kiln site CA", Organization: []string{"kiln"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: create CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return ca, caKey, nil
}

// NewCSR returns a DER PKCS#10 request for nodeID signed by key.
func NewCSR(key *ecdsa.PrivateKey, nodeID string) ([]byte, error) {
	return x509.CreateCertificateRequest(rand.Reader,
		&x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeID}}, key)
}

// Sign issues a node certificate for the public key of csrDER (a DER
// PKCS#10 request whose own signature must verify): CommonName nodeID, DNS
// SAN ServerName, client and server auth, NodeValidity from now. The
// request's other fields are ignored. Errors: ErrBadCSR, or no CA key.
func (id *Identity) Sign(csrDER []byte, nodeID string, now time.Time) (*x509.Certificate, error) {
	return id.SignWith(csrDER, nodeID, SignOptions{Now: now})
}

// SignOptions are the choices of SignWith.
type SignOptions struct {
	Now time.Time
	// Validity is the certificate's lifetime from Now (0 = NodeValidity).
	// NotBefore is backdated by min(5 min, Validity/4) for peers whose
	// clock is a little behind.
	Validity time.Duration
	// Enrollment, when set, is written as the certificate's subject
	// serialNumber (EnrollmentOf): the enrollment (join token ID) it
	// belongs to, so a peer accepts a renewed certificate of that
	// enrollment before it has seen its record.
	Enrollment string
}

// EnrollmentOf is the enrollment a certificate names (SignOptions.Enrollment),
// "" when none.
func EnrollmentOf(c *x509.Certificate) string { return c.Subject.SerialNumber }

// SignWith is Sign with the lifetime and enrollment of opt.
func (id *Identity) SignWith(csrDER []byte, nodeID string, opt SignOptions) (*x509.Certificate, error) {
	now := opt.Now
	validity := opt.Validity
	if validity <= 0 {
		validity = NodeValidity
	}
	if id.CAKey == nil {
		return nil, errors.New("pki: this node holds no CA key, so it cannot admit a node")
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrBadCSR, err)
	}
	if _, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("%w: want an ECDSA key", ErrBadCSR)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: nodeID, Organization: []string{"kiln"}, SerialNumber: opt.Enrollment},
		DNSNames:     []string{ServerName},
		NotBefore:    now.Add(-min(clockSkew, validity/4)),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, id.CA, csr.PublicKey, id.CAKey)
	if err != nil {
		return nil, fmt.Errorf("pki: sign %s: %w", nodeID, err)
	}
	return x509.ParseCertificate(der)
}

// Serial is a certificate's serial number in lower-case hex.
func Serial(c *x509.Certificate) string { return hex.EncodeToString(c.SerialNumber.Bytes()) }

// SPKIHash is the hex SHA-256 of a certificate's DER SubjectPublicKeyInfo
// (the form kubeadm's --discovery-token-ca-cert-hash uses).
func SPKIHash(c *x509.Certificate) string {
	h := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(h[:])
}

// CAHash is SPKIHash of the site CA.
func (id *Identity) CAHash() string { return SPKIHash(id.CA) }

// Pool is a pool holding the site CA and the CAs of Trust.
func (id *Identity) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(id.CA)
	for _, c := range id.Trust {
		p.AddCert(c)
	}
	return p
}

// tlsCert is the node's certificate with its issuing CA in its chain (a
// joiner finds the CA there and checks it against its token).
func (id *Identity) tlsCert() tls.Certificate {
	chain := [][]byte{id.Cert.Raw}
	if ca := id.Issuer(); ca != nil {
		chain = append(chain, ca.Raw)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: id.Key, Leaf: id.Cert}
}

// Source returns a node's current identity: it changes when the node's
// certificate is renewed or the site CA rotated, and every handshake asks
// again (ServerTLSFrom, ClientTLSFrom).
type Source func() *Identity

// ServerTLSFrom is ServerTLS of whatever identity src gives at each
// handshake (tls.Config.GetConfigForClient): a renewed certificate or a
// changed trust bundle is used from the next connection on, with no
// restart.
func ServerTLSFrom(src Source, clientAuth tls.ClientAuthType, check PeerCheck) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return src().ServerTLS(clientAuth, check), nil
		}}
}

// ClientTLSFrom is ClientTLS of whatever identity src gives at each
// handshake: the client certificate comes from GetClientCertificate and the
// peer is verified in VerifyConnection against src's pool (with
// ServerName, server auth, then check) — crypto/tls's own verification is
// off only because it cannot take a pool that changes.
func ClientTLSFrom(src Source, check PeerCheck) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: ServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := src().tlsCert()
			return &c, nil
		},
		InsecureSkipVerify: true, // verified in VerifyConnection below, against the current pool
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("pki: peer sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: src().Pool(), Intermediates: inter, DNSName: ServerName,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("pki: peer certificate %s of %q refused: %w", Serial(leaf), leaf.Subject.CommonName, err)
			}
			if check != nil {
				return check(leaf)
			}
			return nil
		},
	}
}

// PeerCheck, when non-nil, is asked about every verified peer certificate
// (leaf) and refuses it by returning an error (the store refuses removed
// members with it).
type PeerCheck func(leaf *x509.Certificate) error

func verifyConn(check PeerCheck) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if check == nil || len(cs.VerifiedChains) == 0 {
			return nil
		}
		return check(cs.VerifiedChains[0][0])
	}
}

// ServerTLS is the configuration of a node's listener: TLS 1.3, its
// certificate, and client certificates verified against the site CA.
// clientAuth is tls.RequireAndVerifyClientCert (raft) or
// tls.VerifyClientCertIfGiven (the forward RPC, whose enrollment route is
// open and whose other routes check the verified chain themselves).
func (id *Identity) ServerTLS(clientAuth tls.ClientAuthType, check PeerCheck) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{id.tlsCert()},
		ClientAuth:       clientAuth,
		ClientCAs:        id.Pool(),
		VerifyConnection: verifyConn(check),
	}
}

// ClientTLS is the configuration of a node dialling a peer: its own
// certificate, and the peer verified against the site CA with ServerName.
func (id *Identity) ClientTLS(check PeerCheck) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{id.tlsCert()},
		RootCAs:          id.Pool(),
		ServerName:       ServerName,
		VerifyConnection: verifyConn(check),
	}
}

// JoinClientTLS is the configuration of a node that has no certificate yet
// and holds a join token: the peer must present a chain containing a CA
// certificate whose SPKIHash is caHash, and its leaf must verify against
// that CA for ServerName. Otherwise the handshake fails with ErrWrongCA.
func JoinClientTLS(caHash string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyConnection below: the root is pinned by hash
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return ErrWrongCA
			}
			for _, c := range cs.PeerCertificates[1:] {
				if !c.IsCA || subtle.ConstantTimeCompare([]byte(SPKIHash(c)), []byte(caHash)) != 1 {
					continue
				}
				roots := x509.NewCertPool()
				roots.AddCert(c)
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: ServerName,
					KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				if err != nil {
					return fmt.Errorf("%w: leaf not signed by it: %v", ErrWrongCA, err)
				}
				return nil
			}
			return fmt.Errorf("%w (sha256:%s)", ErrWrongCA, caHash)
		},
	}
}

// Save writes the identity to dir (created 0700): certificates 0644, keys
// 0600, each written to a temporary file and renamed.
func (id *Identity) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	files := []struct {
		name string
		typ  string
		der  []byte
		mode os.FileMode
	}{
		{CACertFile, "CERTIFICATE", id.CA.Raw, 0o644},
		{NodeCertFile, "CERTIFICATE", id.Cert.Raw, 0o644},
	}
	for _, k := range []struct {
		name string
		key  *ecdsa.PrivateKey
	}{{CAKeyFile, id.CAKey}, {NodeKeyFile, id.Key}} {
		if k.key == nil {
			continue
		}
		der, err := x509.MarshalPKCS8PrivateKey(k.key)
		if err != nil {
			return fmt.Errorf("pki: %w", err)
		}
		files = append(files, struct {
			name string
			typ  string
			der  []byte
			mode os.FileMode
		}{k.name, "PRIVATE KEY", der, 0o600})
	}
	// Every file is written in full first, then all are renamed into
	// place, so a crash leaves at most a short window of mixed files.
	var trust []byte
	for _, c := range id.Trust {
		trust = append(trust, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	var tmps []string
	write := func(name string, b []byte, mode os.FileMode) error {
		path := filepath.Join(dir, name)
		if err := writeSync(path+".tmp", b, mode); err != nil {
			return fmt.Errorf("pki: write %s: %w", path, err)
		}
		tmps = append(tmps, path)
		return nil
	}
	for _, f := range files {
		if err := write(f.name, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return err
		}
	}
	if len(trust) > 0 {
		if err := write(TrustFile, trust, 0o644); err != nil {
			return err
		}
	}
	for _, path := range tmps {
		if err := os.Rename(path+".tmp", path); err != nil {
			return fmt.Errorf("pki: %w", err)
		}
	}
	if len(trust) == 0 {
		if err := os.Remove(filepath.Join(dir, TrustFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pki: %w", err)
		}
	}
	return nil
}

func writeSync(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Load reads an identity saved by Save. A directory without a node
// certificate gives an error wrapping ErrNoIdentity; a key readable by
// group or others, a certificate not signed by the CA, or a key that does
// not match its certificate is an error naming the file.
func Load(dir string) (*Identity, error) {
	certPath := filepath.Join(dir, NodeCertFile)
	if _, err := os.Stat(certPath); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoIdentity, dir)
	}
	id := &Identity{}
	var err error
	if id.CA, err = loadCert(filepath.Join(dir, CACertFile)); err != nil {
		return nil, err
	}
	if id.Cert, err = loadCert(certPath); err != nil {
		return nil, err
	}
	if id.Key, err = loadKey(filepath.Join(dir, NodeKeyFile)); err != nil {
		return nil, err
	}
	if id.CAKey, err = loadKey(filepath.Join(dir, CAKeyFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, TrustFile)); err == nil {
		for len(b) > 0 {
			var blk *pem.Block
			if blk, b = pem.Decode(b); blk == nil {
				break
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil || blk.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("pki: %s: a block is not a certificate", filepath.Join(dir, TrustFile))
			}
			id.Trust = append(id.Trust, c)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := id.Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return id, nil
}

// Check verifies that Cert is signed by CA (or a CA of Trust) for
// ServerName and valid now, that Key is Cert's key and CAKey (when set) is
// CA's key. An expired certificate is ErrExpired, saying what to do.
func (id *Identity) Check() error {
	if now := time.Now(); now.After(id.Cert.NotAfter) {
		return fmt.Errorf("%w: node certificate %s of %s expired at %s (renewal did not happen in time: "+
			"the node was down or cut off longer than the certificate's lifetime); peers refuse it, so this node "+
			"must join again: move its TLS directory and data directory aside and start it with a new join token",
			ErrExpired, Serial(id.Cert), id.NodeID(), id.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if _, err := id.Cert.Verify(x509.VerifyOptions{Roots: id.Pool(), DNSName: ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("pki: node certificate does not verify against the site CA: %w", err)
	}
	if !id.Key.PublicKey.Equal(id.Cert.PublicKey) {
		return errors.New("pki: node key does not match the node certificate")
	}
	if id.CAKey != nil && !id.CAKey.PublicKey.Equal(id.CA.PublicKey) {
		return errors.New("pki: CA key does not match the CA certificate")
	}
	return nil
}

func loadCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s: no PEM CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	return c, nil
}

func loadKey(path string) (*ecdsa.PrivateKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("pki: %s: mode %v is readable by others; chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("pki: %s: no PEM PRIVATE KEY block", path)
	}
	return ParseKey(blk.Bytes)
}

// ParseKey parses a DER PKCS#8 ECDSA private key.
func ParseKey(der []byte) (*ecdsa.PrivateKey, error) {
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("pki: private key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: private key is %T, want ECDSA", k)
	}
	return ek, nil
}

// MarshalKey is the DER PKCS#8 form of k.
func MarshalKey(k crypto.PrivateKey) ([]byte, error) { return x509.MarshalPKCS8PrivateKey(k) }

// Join tokens.
//
// A token is the string "kiln1.SECRET.CAHASH": SECRET is 32 random bytes in
// unpadded base64url (43 characters), CAHASH the 64 hex digits of the site
// CA's SPKIHash. The cluster stores only Hash() of the secret; the joiner
// uses CAHASH to verify the peer before it sends the secret.
const tokenPrefix = "kiln1"

// Token is a parsed join token.
type Token struct {
	Secret string // base64url, 43 characters
	CAHash string // hex SPKI SHA-256 of the site CA
}

// NewToken returns a fresh token for the CA with hash caHash.
func NewToken(caHash string) Token {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return Token{Secret: base64.RawURLEncoding.EncodeToString(b[:]), CAHash: caHash}
}

// String is the token as the operator copies it.
func (t Token) String() string { return tokenPrefix + "." + t.Secret + "." + t.CAHash }

// Hash is the hex SHA-256 of the secret: what the cluster stores.
func (t Token) Hash() string { return HashSecret(t.Secret) }

// HashSecret is the hex SHA-256 of a token secret.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// TokenID is the short name of a token in events and lists: the first 8
// hex digits of its hash.
func TokenID(hash string) string {
	if len(hash) > 8 {
		return hash[:8]
	}
	return hash
}

// ParseToken parses "kiln1.SECRET.CAHASH". Errors wrap ErrBadToken and say
// which part is wrong.
func ParseToken(s string) (Token, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 3 || parts[0] != tokenPrefix {
		return Token{}, fmt.Errorf("%w: want kiln1.SECRET.CAHASH as printed by `kiln cluster token create`", ErrBadToken)
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || len(b) != 32 {
		return Token{}, fmt.Errorf("%w: the secret is not 43 base64url characters", ErrBadToken)
	}
	if b, err := hex.DecodeString(parts[2]); err != nil || len(b) != sha256.Size {
		return Token{}, fmt.Errorf("%w: the CA hash is not 64 hex digits", ErrBadToken)
	}
	return Token{Secret: parts[1], CAHash: strings.ToLower(parts[2])}, nil
}
