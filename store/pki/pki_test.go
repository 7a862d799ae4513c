package pki

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSiteSaveLoadSign: a site identity survives Save/Load; a CSR is
// signed only when its signature verifies; a key readable by others and a
// certificate of another CA are refused on Load.
func TestSiteSaveLoadSign(t *testing.T) {
	now := time.Now()
	site, err := NewSite("n0", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := site.Check(); err != nil || site.NodeID() != "n0" || !site.CA.IsCA {
		t.Fatalf("new site: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "tls")
	if err := site.Save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil || got.CAHash() != site.CAHash() || Serial(got.Cert) != Serial(site.Cert) || got.CAKey == nil {
		t.Fatalf("load: %v", err)
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("empty dir: %v", err)
	}
	key, _ := NewKey()
	csr, _ := NewCSR(key, "ignored-cn")
	cert, err := site.Sign(csr, "n1", now)
	if err != nil || cert.Subject.CommonName != "n1" || cert.DNSNames[0] != ServerName {
		t.Fatalf("sign: %v", err)
	}
	bad := append([]byte(nil), csr...)
	bad[len(bad)-5] ^= 0xff
	if _, err := site.Sign(bad, "n1", now); !errors.Is(err, ErrBadCSR) {
		t.Fatalf("tampered CSR: %v", err)
	}
	other, _ := NewSite("x", now)
	foreign := &Identity{CA: site.CA, Cert: other.Cert, Key: other.Key}
	if err := foreign.Check(); err == nil {
		t.Fatal("a certificate of another CA passed Check")
	}
	if err := os.Chmod(filepath.Join(dir, NodeKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("world-readable key: %v", err)
	}
}

func TestTokenRoundTrip(t *testing.T) {
	site, _ := NewSite("n0", time.Now())
	tok := NewToken(site.CAHash())
	got, err := ParseToken(" " + tok.String() + "\n")
	if err != nil || got != tok || got.Hash() != tok.Hash() || len(tok.Secret) != 43 {
		t.Fatalf("parse %q: %+v %v", tok.String(), got, err)
	}
	for _, bad := range []string{"", "kiln1", "kiln2." + tok.Secret + "." + tok.CAHash, "kiln1." + tok.Secret + ".abc",
		"kiln1.short." + tok.CAHash, "kiln1." + tok.Secret + "." + tok.CAHash + ".x"} {
		if _, err := ParseToken(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("ParseToken(%q) = %v", bad, err)
		}
	}
}

// FuzzParseToken: any input either parses into a token that prints back
// to itself (trimmed, lower-case hash) or is ErrBadToken; never a panic.
func FuzzParseToken(f *testing.F) {
	f.Add("kiln1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA." + strings.Repeat("ab", 32))
	f.Add("kiln1..")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrBadToken) {
				t.Fatalf("error %v is not ErrBadToken", err)
			}
			return
		}
		again, err := ParseToken(tok.String())
		if err != nil || again != tok {
			t.Fatalf("%q: re-parse of %q: %+v %v", s, tok.String(), again, err)
		}
	})
}
