package store

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"kiln/store/pki"
)

// TestJoinTokenRules: the FSM admits a node with a token once, before its
// expiry at the leader's time, and only a token it holds; removing a member
// marks its record.
func TestJoinTokenRules(t *testing.T) {
	db := testDB(t)
	tok := pki.NewToken(strings.Repeat("ab", 32))
	other := pki.NewToken(strings.Repeat("ab", 32))
	created := t0
	if _, err := run(t, db, 1, &command{Type: CmdPutJoinToken, Time: created,
		JoinToken: &JoinToken{Hash: tok.Hash(), Created: created, Expires: created.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, db, 2, &command{Type: CmdPutJoinToken, Time: created,
		JoinToken: &JoinToken{Hash: tok.Hash(), Created: created, Expires: created.Add(time.Hour)}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("same hash twice: %v", err)
	}
	use := func(index uint64, hash, node string, at time.Time) error {
		_, err := run(t, db, index, &command{Type: CmdUseJoinToken, Time: at,
			JoinToken: &JoinToken{Hash: hash}, Member: &Member{ID: node, CertSerial: "0a0b"}})
		return err
	}
	if err := use(3, other.Hash(), "n1", created.Add(time.Minute)); !errors.Is(err, ErrJoinToken) || !strings.Contains(err.Error(), "unknown to this cluster") {
		t.Fatalf("unknown token: %v", err)
	}
	if err := use(4, tok.Hash(), "n1", created.Add(time.Hour)); !errors.Is(err, ErrJoinToken) || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("token used at its expiry: %v", err)
	}
	if err := use(5, tok.Hash(), "bad id/", created.Add(time.Minute)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad node id: %v", err)
	}
	if err := use(6, tok.Hash(), "n1", created.Add(59*time.Minute)); err != nil {
		t.Fatalf("valid use: %v", err)
	}
	if err := use(7, tok.Hash(), "n2", created.Add(59*time.Minute)); !errors.Is(err, ErrJoinToken) || !strings.Contains(err.Error(), "already used by node n1") {
		t.Fatalf("second use: %v", err)
	}
	if _, err := run(t, db, 8, &command{Type: CmdRemoveMember, ID: "n1"}); err != nil {
		t.Fatal(err)
	}
	var m Member
	var stored JoinToken
	err := db.View(func(tx *bbolt.Tx) error {
		if err := json.Unmarshal(tx.Bucket(bMembers).Get([]byte("n1")), &m); err != nil {
			return err
		}
		return json.Unmarshal(tx.Bucket(bJoinTokens).Get([]byte(tok.Hash())), &stored)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Removed || m.CertSerial != "0a0b" || m.TokenID != pki.TokenID(tok.Hash()) {
		t.Fatalf("member after removal: %+v", m)
	}
	if stored.UsedBy != "n1" || stored.TTL != 0 {
		t.Fatalf("stored token: %+v", stored)
	}
	// The secret itself is nowhere in the state.
	_ = db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				if strings.Contains(string(k)+string(v), tok.Secret) {
					t.Errorf("bucket %s holds the token secret", name)
				}
				return nil
			})
		})
	})
}
