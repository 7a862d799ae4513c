package bmc

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestKeyringRotation: blobs name their key; a keyring of new + old opens
// blobs of both and of the v1 layout (no key ID), seals under the new one;
// once the old key is dropped its blobs no longer open.
func TestKeyringRotation(t *testing.T) {
	oldKey, newKey := NewKey(), NewKey()
	s, err := NewSealer(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	underOld := s.Seal([]byte("pw-old"))
	if SealedKeyID(underOld) != KeyID(oldKey) || s.PrimaryID() != KeyID(oldKey) {
		t.Fatalf("key id %q, want %q", SealedKeyID(underOld), KeyID(oldKey))
	}
	// A v1 blob, as sealers before key IDs wrote it.
	blk, _ := aes.NewCipher(oldKey)
	aead, _ := cipher.NewGCM(blk)
	v1 := make([]byte, 1+12)
	v1[0] = sealVersion
	_, _ = rand.Read(v1[1:])
	v1 = aead.Seal(v1, v1[1:], []byte("pw-v1"), []byte{sealVersion})
	if SealedKeyID(v1) != "" {
		t.Fatal("v1 blob has a key id")
	}

	if err := s.SetKeys(newKey, oldKey); err != nil {
		t.Fatal(err)
	}
	underNew := s.Seal([]byte("pw-new"))
	for blob, want := range map[string]string{string(underOld): "pw-old", string(v1): "pw-v1", string(underNew): "pw-new"} {
		if got, err := s.Open([]byte(blob)); err != nil || string(got) != want {
			t.Fatalf("open %q under new+old: %q %v", want, got, err)
		}
	}
	if SealedKeyID(underNew) != KeyID(newKey) {
		t.Fatal("sealed under the old key after rotation")
	}
	if err := s.SetKeys(newKey); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(underOld); !errors.Is(err, ErrSealed) {
		t.Fatalf("old blob after the old key was dropped: %v", err)
	}
	if got, err := s.Open(underNew); err != nil || string(got) != "pw-new" {
		t.Fatalf("new blob: %q %v", got, err)
	}

	path := filepath.Join(t.TempDir(), "site.key")
	if err := SaveKeyring(path, [][]byte{newKey, oldKey}); err != nil {
		t.Fatal(err)
	}
	ring, err := LoadKeyring(path)
	if err != nil || len(ring) != 2 || string(ring[0]) != string(newKey) {
		t.Fatalf("keyring round trip: %d keys, %v", len(ring), err)
	}
	if err := os.WriteFile(path, make([]byte, 40), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyring(path); err == nil {
		t.Fatal("40-byte keyring accepted")
	}
}
