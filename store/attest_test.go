package store

import (
	"encoding/json"
	"errors"
	"testing"

	"go.etcd.io/bbolt"
)

// put_attest_state (33, issue 16): states are compare-and-set, all or
// nothing, and each write is an audited event naming the status change.
func TestPutAttestState(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "api:alice", Reason: "operator"}
	pcrs := []AttestPCR{{Index: 9, SHA256: "aa"}}
	a := AttestState{Meta: Meta{ID: "as-a"}, Model: "QEMU/Standard PC", Status: AttestStateProposed, PCRs: pcrs, Source: "m-1"}
	b := AttestState{Meta: Meta{ID: "as-b"}, Model: "QEMU/Standard PC", Status: AttestStateProposed, PCRs: pcrs}
	vals, err := run(t, db, 1, &command{Type: CmdPutAttestState, W: w, AttestStates: []AttestState{a, b}})
	if err != nil || len(vals) != 2 {
		t.Fatalf("create: %v %d", err, len(vals))
	}
	var got []AttestState
	for _, v := range vals {
		var s AttestState
		if err := json.Unmarshal(v, &s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	// Approve both at once; one with a stale version fails the whole command.
	a2, b2 := got[0], got[1]
	a2.Status, b2.Status = AttestStateApproved, AttestStateApproved
	stale := b2
	stale.ResourceVersion = 99
	if _, err := run(t, db, 2, &command{Type: CmdPutAttestState, W: w, AttestStates: []AttestState{a2, stale}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale approve: %v, want ErrConflict", err)
	}
	if s := stateAt(t, db, "as-a"); s.Status != AttestStateProposed {
		t.Fatalf("a half-applied command approved as-a: %+v", s)
	}
	if _, err := run(t, db, 3, &command{Type: CmdPutAttestState, W: w, AttestStates: []AttestState{a2, b2}}); err != nil {
		t.Fatal(err)
	}
	if s := stateAt(t, db, "as-b"); s.Status != AttestStateApproved || s.ResourceVersion != 3 {
		t.Fatalf("as-b %+v", s)
	}
	if _, err := run(t, db, 4, &command{Type: CmdPutAttestState, W: w, AttestStates: []AttestState{{Meta: Meta{ID: "as-c"}, Model: "m", Status: "maybe", PCRs: pcrs}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad status: %v", err)
	}
	var kinds []string
	_ = db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bEvents).ForEach(func(_, v []byte) error {
			var e Event
			_ = json.Unmarshal(v, &e)
			kinds = append(kinds, e.Subject+" "+e.Kind+" "+e.From+"→"+e.To+" "+e.Actor)
			return nil
		})
	})
	want := []string{"attest_state/as-a attest_state_proposed →proposed api:alice", "attest_state/as-b attest_state_proposed →proposed api:alice",
		"attest_state/as-a attest_state_approved proposed→approved api:alice", "attest_state/as-b attest_state_approved proposed→approved api:alice"}
	if len(kinds) != len(want) {
		t.Fatalf("events %q", kinds)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("event %d %q, want %q", i, kinds[i], want[i])
		}
	}
	if CmdPutAttestState != 33 || CmdPutAttestState.String() != "put_attest_state" {
		t.Fatalf("command %d %s", CmdPutAttestState, CmdPutAttestState)
	}
}

func stateAt(t *testing.T, db *bbolt.DB, id string) AttestState {
	t.Helper()
	var s AttestState
	_ = db.View(func(tx *bbolt.Tx) error {
		if raw := tx.Bucket(bAttestStates).Get([]byte(id)); raw != nil {
			return json.Unmarshal(raw, &s)
		}
		return nil
	})
	return s
}
