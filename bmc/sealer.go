package bmc

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// KeySize is the site key length in bytes (AES-256).
const KeySize = 32

// sealVersion and sealVersion2 are the first byte of a sealed blob: layout
// v1 = 0x01 || nonce(12) || AES-256-GCM ciphertext+tag(16) (NIST SP 800-38D),
// written before keys rotated; v2 (see Sealer) adds the key ID.
const (
	sealVersion  = 0x01
	sealVersion2 = 0x02
)

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

// LoadKeyring reads a site keyring file: one or more 32-byte keys back to
// back, the first the primary (the one Seal uses), the others older keys
// kept so blobs sealed under them still open (`kiln site rotate-key`). A
// file written by LoadOrCreateKey is a keyring of one. A length that is not
// a positive multiple of KeySize, or a file readable by group/others, is an
// error naming the file.
func LoadKeyring(path string) ([][]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("bmc: site keyring: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("bmc: site key %s: mode %v is readable by others", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bmc: site keyring: %w", err)
	}
	return SplitKeyring(b)
}

// SplitKeyring splits concatenated 32-byte keys (the keyring file's bytes).
func SplitKeyring(b []byte) ([][]byte, error) {
	if len(b) == 0 || len(b)%KeySize != 0 {
		return nil, fmt.Errorf("%w: site keyring is %d bytes, want a positive multiple of %d", ErrInvalidTarget, len(b), KeySize)
	}
	var keys [][]byte
	for i := 0; i < len(b); i += KeySize {
		keys = append(keys, append([]byte(nil), b[i:i+KeySize]...))
	}
	return keys, nil
}

// JoinKeyring is the file form of keys (primary first).
func JoinKeyring(keys [][]byte) []byte {
	var out []byte
	for _, k := range keys {
		out = append(out, k...)
	}
	return out
}

// SaveKeyring writes keys (primary first) to path, mode 0600, through a
// temporary file that is synced and renamed over path.
func SaveKeyring(path string, keys [][]byte) error {
	if _, err := SplitKeyring(JoinKeyring(keys)); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("bmc: site key dir: %w", err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("bmc: site keyring: %w", err)
	}
	if _, err := f.Write(JoinKeyring(keys)); err != nil {
		f.Close()
		return fmt.Errorf("bmc: site keyring write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("bmc: site keyring sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bmc: site keyring close: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("bmc: site keyring: %w", err)
	}
	return nil
}

// NewKey returns a fresh random 32-byte site key.
func NewKey() []byte {
	k := make([]byte, KeySize)
	_, _ = rand.Read(k) // crypto/rand.Read never fails (Go ≥1.24)
	return k
}

// keyIDSize is the length of a key ID: the first bytes of SHA-256(key).
const keyIDSize = 8

// KeyID names a key without revealing it: the hex of the first 8 bytes of
// its SHA-256.
func KeyID(key []byte) string {
	id := keyIDOf(key)
	return hex.EncodeToString(id[:])
}

func keyIDOf(key []byte) [keyIDSize]byte {
	h := sha256.Sum256(key)
	var id [keyIDSize]byte
	copy(id[:], h[:])
	return id
}

// SealedKeyID is the ID of the key a blob was sealed under ("" for a v1
// blob, which carries none, or a blob too short to be one).
func SealedKeyID(sealed []byte) string {
	if len(sealed) < 1+keyIDSize || sealed[0] != sealVersion2 {
		return ""
	}
	return hex.EncodeToString(sealed[1 : 1+keyIDSize])
}

type sealKey struct {
	id   [keyIDSize]byte
	aead cipher.AEAD
}

// Sealer encrypts small secrets (BMC passwords) at rest with AES-256-GCM
// under a keyring: Seal uses the primary key and names it in the blob
// (layout v2 = 0x02 || key ID(8) || nonce(12) || ciphertext+tag(16), the
// version and key ID authenticated as associated data; NIST SP 800-38D);
// Open picks the key a blob names, or, for a v1 blob (0x01 || nonce ||
// ciphertext+tag, no key ID), tries every key. SetKeys swaps the keyring
// (rotation). It is safe for concurrent use. It never logs.
type Sealer struct {
	mu      sync.RWMutex
	primary *sealKey
	keys    []*sealKey
}

// NewSealer returns a Sealer for a keyring of one or more 32-byte keys,
// the first the primary.
func NewSealer(keys ...[]byte) (*Sealer, error) {
	s := &Sealer{}
	if err := s.SetKeys(keys...); err != nil {
		return nil, err
	}
	return s, nil
}

// SetKeys replaces the keyring (the first key becomes the primary).
func (s *Sealer) SetKeys(keys ...[]byte) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: no site key", ErrInvalidTarget)
	}
	var ring []*sealKey
	for _, key := range keys {
		if len(key) != KeySize {
			return fmt.Errorf("%w: key is %d bytes, want %d", ErrInvalidTarget, len(key), KeySize)
		}
		blk, err := aes.NewCipher(key)
		if err != nil {
			return fmt.Errorf("bmc: sealer: %w", err)
		}
		aead, err := cipher.NewGCM(blk)
		if err != nil {
			return fmt.Errorf("bmc: sealer: %w", err)
		}
		ring = append(ring, &sealKey{id: keyIDOf(key), aead: aead})
	}
	s.mu.Lock()
	s.primary, s.keys = ring[0], ring
	s.mu.Unlock()
	return nil
}

// PrimaryID is KeyID of the key Seal uses.
func (s *Sealer) PrimaryID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return hex.EncodeToString(s.primary.id[:])
}

// Seal encrypts plaintext under the primary key with a fresh random 96-bit
// nonce. The result is 1 + 8 + 12 + len(plaintext) + 16 bytes; sealing the
// same plaintext twice gives different blobs.
func (s *Sealer) Seal(plaintext []byte) []byte {
	s.mu.RLock()
	k := s.primary
	s.mu.RUnlock()
	hdr := 1 + keyIDSize
	ns := k.aead.NonceSize()
	out := make([]byte, hdr+ns, hdr+ns+len(plaintext)+k.aead.Overhead())
	out[0] = sealVersion2
	copy(out[1:hdr], k.id[:])
	_, _ = rand.Read(out[hdr:])
	return k.aead.Seal(out, out[hdr:hdr+ns], plaintext, out[:hdr])
}

// Open decrypts a blob made by Seal (v2) or by an older Sealer (v1). A key
// not in the keyring, a modified or truncated blob, or an unknown version
// yields ErrSealed.
func (s *Sealer) Open(sealed []byte) ([]byte, error) {
	s.mu.RLock()
	keys := s.keys
	s.mu.RUnlock()
	if len(sealed) == 0 {
		return nil, ErrSealed
	}
	switch sealed[0] {
	case sealVersion:
		for _, k := range keys {
			ns := k.aead.NonceSize()
			if len(sealed) < 1+ns+k.aead.Overhead() {
				return nil, ErrSealed
			}
			if pt, err := k.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], []byte{sealVersion}); err == nil {
				return pt, nil
			}
		}
	case sealVersion2:
		hdr := 1 + keyIDSize
		for _, k := range keys {
			ns := k.aead.NonceSize()
			if len(sealed) < hdr+ns+k.aead.Overhead() {
				return nil, ErrSealed
			}
			if string(sealed[1:hdr]) != string(k.id[:]) {
				continue
			}
			pt, err := k.aead.Open(nil, sealed[hdr:hdr+ns], sealed[hdr+ns:], sealed[:hdr])
			if err != nil {
				return nil, ErrSealed
			}
			return pt, nil
		}
	}
	return nil, ErrSealed
}
