package bmc

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// KeySize is the site key length in bytes (AES-256).
const KeySize = 32

// sealVersion is the first byte of every sealed blob: layout v1 = 0x01 || nonce(12) ||
// AES-256-GCM ciphertext+tag(16) (NIST SP 800-38D).
const sealVersion = 0x01

// LoadOrCreateKey reads the 32-byte site key at path, or, if the file does not exist,
// creates it with fresh random bytes and mode 0600 (its directory 0700). A file of any
// other length, or one readable by group/others, is an error.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) != KeySize {
			return nil, fmt.Errorf("bmc: site key %s: %d bytes, want %d", path, len(b), KeySize)
		}
		st, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("bmc: site key: %w", err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("bmc: site key %s: mode %v is readable by others", path, st.Mode().Perm())
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("bmc: site key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("bmc: site key dir: %w", err)
	}
	key := make([]byte, KeySize)
	_, _ = rand.Read(key) // crypto/rand.Read never fails (Go ≥1.24)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) { // lost a race with another starter: use theirs
			return LoadOrCreateKey(path)
		}
		return nil, fmt.Errorf("bmc: site key: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		return nil, fmt.Errorf("bmc: site key write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("bmc: site key sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("bmc: site key close: %w", err)
	}
	return key, nil
}

// Sealer encrypts small secrets (BMC passwords) at rest with AES-256-GCM and a site key.
// It is safe for concurrent use. It never logs.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer returns a Sealer for a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("%w: key is %d bytes, want %d", ErrInvalidTarget, len(key), KeySize)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("bmc: sealer: %w", err)
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, fmt.Errorf("bmc: sealer: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext with a fresh random 96-bit nonce. The result is
// 1 + 12 + len(plaintext) + 16 bytes; sealing the same plaintext twice gives different
// blobs.
func (s *Sealer) Seal(plaintext []byte) []byte {
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	out[0] = sealVersion
	_, _ = rand.Read(out[1:])
	return s.aead.Seal(out, out[1:], plaintext, []byte{sealVersion})
}

// Open decrypts a blob made by Seal. A wrong key, a modified or truncated blob, or an
// unknown version yields ErrSealed.
func (s *Sealer) Open(sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, ErrSealed
	}
	pt, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], []byte{sealVersion})
	if err != nil {
		return nil, ErrSealed
	}
	return pt, nil
}
