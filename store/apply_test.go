package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func testDB(t testing.TB) *bbolt.DB {
	t.Helper()
	db, err := openFSMFile(filepath.Join(t.TempDir(), "fsm.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// run applies c at index in its own transaction (rolled back on error),
// exactly as the FSM does, but without raft.
func run(t testing.TB, db *bbolt.DB, index uint64, c *command) ([]json.RawMessage, error) {
	t.Helper()
	if c.Time.IsZero() {
		c.Time = t0.Add(time.Duration(index) * time.Second)
	}
	// Round-trip through the log encoding, as a real entry would.
	data, err := encodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := decodeCommand(data)
	if err != nil {
		t.Fatal(err)
	}
	return applyIn(db, index, dc)
}

// testIndexes holds the in-memory machine index of each test db.
var testIndexes sync.Map // *bbolt.DB → *machineIndex

func indexOf(db *bbolt.DB) *machineIndex {
	v, _ := testIndexes.LoadOrStore(db, newMachineIndex())
	return v.(*machineIndex)
}

// applyIn applies c at index in its own transaction on db as the FSM does:
// rolled back on error, index changes merged only when the tx commits.
func applyIn(db *bbolt.DB, index uint64, c *command) ([]json.RawMessage, error) {
	ix := indexOf(db)
	x := newIdxTx(ix)
	var vals []json.RawMessage
	err := db.Update(func(tx *bbolt.Tx) error {
		var e error
		vals, _, _, e = apply(tx, x, index, c)
		return e
	})
	if err == nil {
		ix.mu.Lock()
		x.commit()
		ix.mu.Unlock()
	}
	return vals, err
}

// checkIndex: the incrementally maintained index equals one rebuilt from
// the records.
func checkIndex(t testing.TB, db *bbolt.DB) {
	t.Helper()
	ix := indexOf(db)
	_ = db.View(func(tx *bbolt.Tx) error {
		want, err := buildMachineIndex(tx)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ix.mac, want.mac) || !reflect.DeepEqual(ix.state, want.state) {
			t.Fatalf("index drifted from records:\n mac %v\nwant %v\n state %v\nwant %v", ix.mac, want.mac, ix.state, want.state)
		}
		if !reflect.DeepEqual(ix.ver, want.ver) {
			t.Fatalf("version index drifted from records:\n got %v\nwant %v", ix.ver, want.ver)
		}
		if !reflect.DeepEqual(ix.ref, want.ref) {
			t.Fatalf("reference index drifted from records:\n got %v\nwant %v", ix.ref, want.ref)
		}
		return nil
	})
}

func machineAt(t *testing.T, db *bbolt.DB, id string) (Machine, bool) {
	var m Machine
	found := false
	_ = db.View(func(tx *bbolt.Tx) error {
		raw := tx.Bucket(bMachines).Get([]byte(id))
		if raw != nil {
			found = true
			return json.Unmarshal(raw, &m)
		}
		return nil
	})
	return m, found
}

func allEvents(t *testing.T, db *bbolt.DB) []Event {
	var out []Event
	_ = db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bEvents).ForEach(func(_, v []byte) error {
			var ev Event
			if err := json.Unmarshal(v, &ev); err != nil {
				t.Fatal(err)
			}
			out = append(out, ev)
			return nil
		})
	})
	return out
}

func nic(mac string) Hardware { return Hardware{NICs: []NIC{{MAC: mac}}} }

func TestApplyMachineTable(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "test", Reason: "r"}
	steps := []struct {
		name    string
		m       Machine
		wantErr error
		illegal bool
		state   MachineState
		rv      uint64
	}{
		{name: "create default registered", m: Machine{Meta: Meta{ID: "m-1"}, Intended: nic("AA:BB:CC:00:00:01")}, state: StateRegistered, rv: 1},
		{name: "create existing id without RV is an update", m: Machine{Meta: Meta{ID: "m-1"}, Name: "x", Intended: nic("aa:bb:cc:00:00:01")}, state: StateRegistered, rv: 2},
		{name: "create in available refused", m: Machine{Meta: Meta{ID: "m-2"}, State: StateAvailable}, illegal: true},
		{name: "create discovered", m: Machine{Meta: Meta{ID: "m-2"}, State: StateDiscovered, Intended: nic("aa:bb:cc:00:00:02")}, state: StateDiscovered, rv: 4},
		{name: "RV on missing id", m: Machine{Meta: Meta{ID: "m-9", ResourceVersion: 3}}, wantErr: ErrNotFound},
		{name: "CAS conflict", m: Machine{Meta: Meta{ID: "m-1", ResourceVersion: 1}, State: StateInspecting}, wantErr: ErrConflict},
		{name: "CAS ok transition", m: Machine{Meta: Meta{ID: "m-1", ResourceVersion: 2}, State: StateInspecting, Intended: nic("aa:bb:cc:00:00:01")}, state: StateInspecting, rv: 7},
		{name: "illegal inspecting→provisioned", m: Machine{Meta: Meta{ID: "m-1"}, State: StateProvisioned}, illegal: true},
		{name: "unknown state", m: Machine{Meta: Meta{ID: "m-1"}, State: "bogus"}, wantErr: ErrInvalid},
		{name: "duplicate MAC", m: Machine{Meta: Meta{ID: "m-2"}, Intended: nic("aa:bb:cc:00:00:01")}, wantErr: ErrDuplicateMAC},
		{name: "bad MAC", m: Machine{Meta: Meta{ID: "m-3"}, Intended: nic("zz")}, wantErr: ErrInvalid},
	}
	for i, st := range steps {
		idx := uint64(i + 1)
		vals, err := run(t, db, idx, &command{Type: CmdPutMachines, W: w, Machines: []Machine{st.m}})
		var ite *IllegalTransitionError
		switch {
		case st.illegal:
			if !errors.As(err, &ite) {
				t.Fatalf("%s: err %v, want IllegalTransitionError", st.name, err)
			}
			continue
		case st.wantErr != nil:
			if !errors.Is(err, st.wantErr) {
				t.Fatalf("%s: err %v, want %v", st.name, err, st.wantErr)
			}
			continue
		case err != nil:
			t.Fatalf("%s: %v", st.name, err)
		}
		var got Machine
		if err := json.Unmarshal(vals[0], &got); err != nil {
			t.Fatal(err)
		}
		if got.State != st.state || got.ResourceVersion != st.rv {
			t.Fatalf("%s: state %s rv %d, want %s %d", st.name, got.State, got.ResourceVersion, st.state, st.rv)
		}
		if !got.UpdatedAt.Equal(t0.Add(time.Duration(idx) * time.Second)) {
			t.Fatalf("%s: UpdatedAt %v is not the command's time", st.name, got.UpdatedAt)
		}
	}
	m, _ := machineAt(t, db, "m-1")
	if !m.CreatedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("CreatedAt changed on update: %v", m.CreatedAt)
	}
	// The refused commands left nothing behind: m-3 absent, MAC index intact.
	if _, ok := machineAt(t, db, "m-3"); ok {
		t.Fatal("refused create of m-3 was written")
	}
	evs := allEvents(t, db)
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind+":"+ev.From+">"+ev.To)
	}
	want := []string{"created:>registered", "updated:>", "created:>discovered", "transition:registered>inspecting"}
	if strings.Join(kinds, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	if tr := evs[3]; tr.Actor != "test" || tr.Reason != "r" || tr.Index != 7 || tr.Subject != "machine/m-1" {
		t.Fatalf("transition event %+v", tr)
	}
	// Delete removes the record and both index entries.
	if _, err := run(t, db, 20, &command{Type: CmdDeleteMachine, ID: "m-1", W: w}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, db, 21, &command{Type: CmdDeleteMachine, ID: "m-1", W: w}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if ix := indexOf(db); ix.mac["aa:bb:cc:00:00:01"] != "" {
		t.Error("MAC index kept deleted machine")
	} else if _, ok := ix.state[StateInspecting]["m-1"]; ok {
		t.Error("state index kept deleted machine")
	}
	checkIndex(t, db)
}

func TestApplyPutMachinesAllOrNothing(t *testing.T) {
	db := testDB(t)
	ms := []Machine{{Meta: Meta{ID: "a"}, Intended: nic("02:00:00:00:00:01")},
		{Meta: Meta{ID: "b"}, Intended: nic("02:00:00:00:00:01")}} // same MAC → refused
	if _, err := run(t, db, 1, &command{Type: CmdPutMachines, Machines: ms}); !errors.Is(err, ErrDuplicateMAC) {
		t.Fatalf("err %v", err)
	}
	if _, ok := machineAt(t, db, "a"); ok {
		t.Fatal("first machine of a refused batch was written")
	}
	if n := len(allEvents(t, db)); n != 0 {
		t.Fatalf("%d events from a refused batch", n)
	}
}

func TestApplyOtherRecords(t *testing.T) {
	db := testDB(t)
	mustRun := func(idx uint64, c *command) []json.RawMessage {
		t.Helper()
		v, err := run(t, db, idx, c)
		if err != nil {
			t.Fatalf("index %d %s: %v", idx, c.Type, err)
		}
		return v
	}
	mustRun(1, &command{Type: CmdPutSite, Site: &Site{Meta: Meta{ID: "s1"}, Name: "hall"}})
	if _, err := run(t, db, 2, &command{Type: CmdPutSite, Site: &Site{Meta: Meta{ID: "s1", ResourceVersion: 9}}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("site CAS: %v", err)
	}
	mustRun(3, &command{Type: CmdPutJob, Job: &Job{Meta: Meta{ID: "j1"}, Machine: "m1", State: "pending"}})
	mustRun(4, &command{Type: CmdPutJob, Job: &Job{Meta: Meta{ID: "j1"}, Machine: "m1", State: "running"}})
	mustRun(5, &command{Type: CmdPutLeases, Leases: []Lease{{MAC: "02:00:00:00:00:AA", IP: "10.0.0.5", State: "bound"}}})
	mustRun(6, &command{Type: CmdPutLeases, Leases: []Lease{{MAC: "02:00:00:00:00:aa", IP: "10.0.0.5", State: "bound"}}}) // renewal: no event
	mustRun(7, &command{Type: CmdPutSecret, Key: "bmc/1", Sealed: []byte("sealed-bytes")})
	mustRun(8, &command{Type: CmdAppendEvents, Events: []Event{{Subject: "machine/m1", Kind: "step", Time: t0.Add(time.Hour)}}})
	if _, err := run(t, db, 9, &command{Type: CmdAppendEvents, Events: []Event{{Kind: "step"}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("event without subject: %v", err)
	}
	if _, err := run(t, db, 10, &command{Type: CmdDeleteImage, ID: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete missing image: %v", err)
	}
	var got []string
	for _, ev := range allEvents(t, db) {
		got = append(got, ev.Kind+":"+ev.From+">"+ev.To)
		if strings.Contains(ev.Message, "sealed") {
			t.Fatal("secret value leaked into an event")
		}
		if ev.Index == 8 && !ev.Time.Equal(t0.Add(8*time.Second)) {
			t.Fatalf("appended event kept caller time %v", ev.Time)
		}
	}
	want := "created:>,job:>pending,job:pending>running,lease:>bound,secret_updated:>,step:>"
	if strings.Join(got, ",") != want {
		t.Fatalf("events %s\nwant   %s", strings.Join(got, ","), want)
	}
}

// Two replicas applying the same log end byte-identical: apply reads no
// clock or randomness.
func TestApplyDeterministic(t *testing.T) {
	cmds := []*command{
		{Type: CmdPutMachines, Time: t0, Machines: []Machine{{Meta: Meta{ID: "m-1"}, Intended: nic("02:00:00:00:00:01")}}},
		{Type: CmdPutMachines, Time: t0.Add(time.Minute), Machines: []Machine{{Meta: Meta{ID: "m-1"}, State: StateInspecting}}},
		{Type: CmdPutLeases, Time: t0.Add(2 * time.Minute), Leases: []Lease{{MAC: "02:00:00:00:00:01", IP: "10.0.0.9", Expiry: t0.Add(time.Hour)}}},
	}
	dump := func() []byte {
		db := testDB(t)
		for i, c := range cmds {
			cc := *c
			if _, err := run(t, db, uint64(i+1), &cc); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		var buf bytes.Buffer
		_ = db.View(func(tx *bbolt.Tx) error {
			return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
				return b.ForEach(func(k, v []byte) error {
					buf.Write(name)
					buf.Write(k)
					buf.Write(v)
					return nil
				})
			})
		})
		return buf.Bytes()
	}
	if a, b := dump(), dump(); !bytes.Equal(a, b) {
		t.Fatal("replicas differ")
	}
}

// TestUnknownCommandHalts: a log entry with a type byte this binary does
// not know halts the FSM there: the entries before it in the batch are
// applied, it and every later entry (this batch and the next) are not; an
// error-level log line names it, the apply-error count has it, the applied
// index stays before it, and snapshots and restores are refused — it is
// neither skipped nor applied partly.
func TestUnknownCommandHalts(t *testing.T) {
	var buf syncBuf
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := openFSM(filepath.Join(t.TempDir(), "fsm.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	var codes []string
	f.onApplyError = func(c string) { codes = append(codes, c) }
	var hooked *HaltError
	f.onHalt = func(h *HaltError) { hooked = h }
	ok, _ := encodeCommand(&command{Type: CmdPutSite, Time: t0, Site: &Site{Meta: Meta{ID: "s"}}})
	ok2, _ := encodeCommand(&command{Type: CmdPutSite, Time: t0, Site: &Site{Meta: Meta{ID: "s2"}}})
	ok3, _ := encodeCommand(&command{Type: CmdPutSite, Time: t0, Site: &Site{Meta: Meta{ID: "s3"}}})
	unknown := append([]byte{200}, []byte(`{"time":"2026-11-29T12:00:00Z"}`)...)
	res := f.ApplyBatch([]*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: ok},
		{Index: 2, Term: 3, Type: raft.LogCommand, Data: unknown},
		{Index: 3, Type: raft.LogCommand, Data: ok2},
	})
	if r1 := res[0].(*applyResult); r1.Err != nil {
		t.Fatalf("entry before the unknown one: %v", r1.Err)
	}
	for i := 1; i < 3; i++ {
		r := res[i].(*applyResult)
		var h *HaltError
		if !errors.Is(r.Err, ErrFSMHalted) || !errors.Is(r.Err, ErrUnknownCommand) || !errors.As(r.Err, &h) {
			t.Fatalf("entry %d result: %v", i+1, r.Err)
		}
		if h.Index != 2 || h.Term != 3 || h.Type != 200 {
			t.Fatalf("halt error names %+v", h)
		}
	}
	if hooked == nil || hooked.Index != 2 {
		t.Fatalf("onHalt: %+v", hooked)
	}
	if len(codes) != 1 || codes[0] != "unknown_command" {
		t.Fatalf("apply error codes %v", codes)
	}
	logged := buf.String()
	if !strings.Contains(logged, `"level":"ERROR"`) || !strings.Contains(logged, "FSM halted") || !strings.Contains(logged, `"type":200`) {
		t.Fatalf("no error-level log line for the unknown entry: %s", logged)
	}
	if f.applied.Load() != 1 {
		t.Fatalf("applied %d, want 1 (before the unknown entry)", f.applied.Load())
	}
	// A later batch applies nothing either.
	res = f.ApplyBatch([]*raft.Log{{Index: 4, Type: raft.LogCommand, Data: ok3}})
	if r := res[0].(*applyResult); !errors.Is(r.Err, ErrFSMHalted) {
		t.Fatalf("entry after the halt: %v", r.Err)
	}
	if f.applied.Load() != 1 {
		t.Fatalf("applied %d after the halt", f.applied.Load())
	}
	n := 0
	var marker uint64
	_ = f.view(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bSites).Stats().KeyN
		marker = beUint64(tx.Bucket(bMeta).Get(keyApplied))
		return nil
	})
	if n != 1 || marker != 1 {
		t.Fatalf("%d sites, stored applied marker %d: want only site s, marker 1", n, marker)
	}
	if _, err := f.Snapshot(); !errors.Is(err, ErrFSMHalted) {
		t.Fatalf("snapshot of a halted FSM: %v", err)
	}
	if err := f.Restore(io.NopCloser(strings.NewReader(""))); !errors.Is(err, ErrFSMHalted) {
		t.Fatalf("restore into a halted FSM: %v", err)
	}

	// The unknown entry first in its batch: nothing of the batch applies.
	g, err := openFSM(filepath.Join(t.TempDir(), "fsm.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	g.ApplyBatch([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: ok}})
	res = g.ApplyBatch([]*raft.Log{{Index: 2, Type: raft.LogCommand, Data: unknown}, {Index: 3, Type: raft.LogCommand, Data: ok2}})
	if r := res[1].(*applyResult); !errors.Is(r.Err, ErrFSMHalted) || g.applied.Load() != 1 {
		t.Fatalf("unknown first in batch: %v, applied %d", r.Err, g.applied.Load())
	}
	// decodeCommand refuses type 0 and values past the end too.
	for _, b := range []byte{0, byte(cmdEnd), 255} {
		if _, err := decodeCommand([]byte{b, '{', '}'}); !errors.Is(err, ErrUnknownCommand) {
			t.Fatalf("type %d: %v", b, err)
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// FuzzDecodeApply: bytes arriving on the forward RPC (or in the log) are
// decoded and applied. A decoded command encodes to bytes that decode to the
// same encoding (the log form is stable); an apply that fails writes nothing
// (every bucket's keys and values as before); and the in-memory index always
// equals one rebuilt from the records.
func FuzzDecodeApply(f *testing.F) {
	seed := func(c *command) {
		b, _ := encodeCommand(c)
		f.Add(b)
	}
	seed(&command{Type: CmdPutMachines, Time: t0, Machines: []Machine{{Meta: Meta{ID: "m"}, Intended: nic("02:00:00:00:00:01")}}})
	seed(&command{Type: CmdPutLeases, Time: t0, Leases: []Lease{{MAC: "02:00:00:00:00:01", IP: "10.0.0.1"}}})
	seed(&command{Type: CmdBindLeases, Time: t0, Leases: []Lease{{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)},
		{MAC: "02:00:00:00:00:02", IP: "10.0.0.1", State: LeaseBound}, {MAC: "02:00:00:00:00:02", IP: "10.0.0.1", State: LeaseDeclined},
		{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseReleased}}})
	seed(&command{Type: CmdBindLeasesV2, Time: t0, Leases: []Lease{{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)},
		{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseReleased, Expiry: t0}, {MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseReleased, Expiry: t0.Add(time.Hour)}}})
	seed(&command{Type: CmdAppendEvents, Events: []Event{{Subject: "s", Kind: "k"}}})
	seed(&command{Type: CmdRegisterNode, Node: &nodeInfo{ID: "n", ForwardAddr: "127.0.0.1:1"}})
	seed(&command{Type: CmdPutImage, Time: t0, Image: &Image{Meta: Meta{ID: "img"}, Name: "os"}})
	seed(&command{Type: CmdPutMachinesV2, Time: t0, Machines: []Machine{{Meta: Meta{ID: "c"}, Name: "c",
		Intended: Hardware{Serial: "s", BMCMAC: "02:00:00:00:0b:01"}, Claim: &Claim{Image: "img"}}}})
	seed(&command{Type: CmdDeleteImageV2, Time: t0, ID: "img"})
	seed(&command{Type: CmdImportMachines, Time: t0, Machines: []Machine{{Meta: Meta{ID: "i1"}, Name: "c"},
		{Meta: Meta{ID: "i2"}, Name: "d", Intended: Hardware{Serial: "S", NICs: []NIC{{MAC: "02:00:00:00:0b:01"}}}}}})
	seed(&command{Type: CmdPutMachines, Time: t0, Machines: []Machine{{Meta: Meta{ID: "m2"}, Intended: nic("02:00:00:00:00:01")}}}) // MAC taken: refused
	seed(&command{Type: CmdAgentReport, Time: t0, Machines: []Machine{{Meta: Meta{ID: "m", ResourceVersion: 1}, State: StateInspecting}},
		Events: []Event{{Subject: "machine/m", Kind: "step", To: "succeeded"}}})
	f.Add([]byte{})
	f.Add([]byte{3})
	f.Add([]byte{3, '{', '"', 'm', 'a', 'c', 'h', 'i', 'n', 'e', 's', '"', ':', '[', '{', '}', ']', '}'})
	f.Add([]byte{99, '{', '}'})
	db := testDB(f)
	var idx uint64
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeCommand(data)
		if err != nil {
			if !errors.Is(err, ErrBadCommand) && !errors.Is(err, ErrUnknownCommand) {
				t.Fatalf("decode error not classified: %v", err)
			}
			return
		}
		enc, err := encodeCommand(c)
		if err != nil {
			t.Fatalf("decoded %q but cannot encode it: %v", data, err)
		}
		c2, err := decodeCommand(enc)
		if err != nil {
			t.Fatalf("%q: its own encoding %q does not decode: %v", data, enc, err)
		}
		if enc2, _ := encodeCommand(c2); !bytes.Equal(enc, enc2) {
			t.Fatalf("%q: encoding not stable:\n%s\n%s", data, enc, enc2)
		}
		idx++
		before := dumpDB(t, db)
		if _, err := applyIn(db, idx, c); err != nil {
			if after := dumpDB(t, db); after != before {
				t.Fatalf("%q refused (%v) but the database changed", data, err)
			}
		}
		checkIndex(t, db)
	})
}

// dumpDB renders every bucket (nested too) with its keys and values.
func dumpDB(t testing.TB, db *bbolt.DB) string {
	t.Helper()
	var b strings.Builder
	var walk func(prefix string, bk *bbolt.Bucket)
	walk = func(prefix string, bk *bbolt.Bucket) {
		_ = bk.ForEach(func(k, v []byte) error {
			if v == nil {
				walk(prefix+string(k)+"/", bk.Bucket(k))
				return nil
			}
			fmt.Fprintf(&b, "%s%q=%q\n", prefix, k, v)
			return nil
		})
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, bk *bbolt.Bucket) error {
			walk(string(name)+"/", bk)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// FuzzVerifyBoltFile: the pre-open structure check must never panic or read
// out of bounds, whatever the bytes of the file; and a file it accepts is
// one bbolt opens and walks (every bucket, key and value) without a panic:
// that is what the check is for.
func FuzzVerifyBoltFile(f *testing.F) {
	dir := f.TempDir()
	db, err := openFSMFile(filepath.Join(dir, "seed.db"))
	if err != nil {
		f.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		_, _ = applyIn(db, uint64(i+1), &command{Type: CmdPutMachines, Time: t0,
			Machines: []Machine{{Meta: Meta{ID: strings.Repeat("m", i+1)}, Intended: nic("02:00:00:00:00:0" + string(rune('1'+i)))}}})
	}
	db.Close()
	seed, err := os.ReadFile(filepath.Join(dir, "seed.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	mut := append([]byte{}, seed...)
	mut[2*4096+10] ^= 0xff // element count of the first data page
	f.Add(mut)
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := verifyBolt(bytes.NewReader(data), int64(len(data))); err != nil {
			return
		}
		p := filepath.Join(t.TempDir(), "f.db")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("verifyBolt accepted a file on which bbolt panics: %v", r)
			}
		}()
		bdb, err := bbolt.Open(p, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return // bbolt refusing it cleanly is fine
		}
		defer bdb.Close()
		_ = dumpDB(t, bdb)
	})
}

// TestApplyBatchEqualsOneByOne: applying a log in batches (one bbolt tx per
// batch, refused entries split out, some entries predecoded as on the
// leader) gives the same per-entry results, the same records and the same
// in-memory index as applying every entry in its own transaction.
func TestApplyBatchEqualsOneByOne(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mk := func(c *command) []byte {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	var data [][]byte
	for i := 0; i < 100; i++ {
		id := fmt.Sprintf("m-%02d", i%13)
		img := fmt.Sprintf("img-%d", i%3)
		switch i % 10 {
		case 0, 1, 2: // create or overwrite; MAC i%9 collides with other machines; V2 claims need the image
			typ := CmdPutMachines
			m := Machine{Meta: Meta{ID: id}, Name: fmt.Sprintf("n%d", i%5), Intended: nic(fmt.Sprintf("02:00:00:00:00:%02x", i%9))}
			if i%2 == 0 {
				typ = CmdPutMachinesV2
				m.Claim = &Claim{Image: img}
			}
			data = append(data, mk(&command{Type: typ, Time: at(i), Machines: []Machine{m}}))
		case 3: // legal or illegal transition, or not found
			data = append(data, mk(&command{Type: CmdPutMachines, Time: at(i),
				Machines: []Machine{{Meta: Meta{ID: id}, State: StateInspecting}}}))
		case 4: // CAS with a mostly wrong version
			data = append(data, mk(&command{Type: CmdPutMachines, Time: at(i),
				Machines: []Machine{{Meta: Meta{ID: id, ResourceVersion: uint64(i - 3)}, Intended: nic(fmt.Sprintf("02:00:00:00:01:%02x", i))}}}))
		case 5:
			data = append(data, mk(&command{Type: CmdDeleteMachine, Time: at(i), ID: id}))
		case 6:
			data = append(data, []byte{byte(CmdPutSite), '{'}) // malformed (refused; an unknown type would halt: TestUnknownCommandHalts)
		case 7:
			data = append(data, mk(&command{Type: CmdPutImage, Time: at(i), Image: &Image{Meta: Meta{ID: img}, Name: img}}))
		case 8: // refused while claimed or absent
			data = append(data, mk(&command{Type: CmdDeleteImageV2, Time: at(i), ID: img}))
		case 9: // names and serials collide with stored machines some of the time
			data = append(data, mk(&command{Type: CmdImportMachines, Time: at(i), Machines: []Machine{
				{Meta: Meta{ID: fmt.Sprintf("i-%02d-a", i)}, Name: fmt.Sprintf("n%d", i%7), Intended: Hardware{Serial: fmt.Sprintf("s%d", i%4)}},
				{Meta: Meta{ID: fmt.Sprintf("i-%02d-b", i)}, Name: fmt.Sprintf("imp%d", i), Intended: nic(fmt.Sprintf("02:00:00:00:02:%02x", i))}}}))
		}
	}
	logs := make([]*raft.Log, len(data))
	for i, d := range data {
		logs[i] = &raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: d}
	}

	// One transaction per entry.
	ref := testDB(t)
	var want []string
	for i, d := range data {
		c, err := decodeCommand(d)
		if err == nil {
			var vals []json.RawMessage
			vals, err = applyIn(ref, uint64(i+1), c)
			if err == nil {
				want = append(want, fmt.Sprintf("ok %s", vals))
				continue
			}
		}
		want = append(want, "err "+err.Error())
	}
	refused := 0
	for _, w := range want {
		if strings.HasPrefix(w, "err") {
			refused++
		}
	}
	if refused < 8 || refused > len(want)-8 {
		t.Fatalf("test log should mix refusals and successes: %d of %d refused", refused, len(want))
	}

	// Batches of 1..9 entries with every other entry predecoded (as on
	// the leader), then one batch of the last 24 decoded in the FSM by
	// several goroutines (as on a follower).
	f, err := openFSM(filepath.Join(t.TempDir(), "fsm.db"), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	var got []string
	const tail = 24
	for pos, n := 0, 1; pos < len(logs); pos, n = pos+n, n%9+1 {
		follower := pos >= len(logs)-tail
		if pos+n > len(logs)-tail && !follower {
			n = len(logs) - tail - pos
		}
		if follower {
			n = tail
		}
		batch := logs[pos:min(pos+n, len(logs))]
		var dones []func()
		for k, l := range batch {
			if k%2 == 0 && !follower {
				dones = append(dones, f.predecode(l.Data))
			}
		}
		for _, r := range f.ApplyBatch(batch) {
			ar := r.(*applyResult)
			if ar.Err != nil {
				got = append(got, "err "+ar.Err.Error())
			} else {
				got = append(got, fmt.Sprintf("ok %s", ar.Values))
			}
		}
		for _, d := range dones {
			d()
		}
		if f.applied.Load() != batch[len(batch)-1].Index {
			t.Fatalf("applied %d after batch ending at %d", f.applied.Load(), batch[len(batch)-1].Index)
		}
	}
	if len(f.pre) != 0 {
		t.Fatalf("%d predecoded entries left behind", len(f.pre))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: batched %q, alone %q", i+1, got[i], want[i])
		}
	}
	dump := func(db *bbolt.DB) string {
		var buf bytes.Buffer
		_ = db.View(func(tx *bbolt.Tx) error {
			return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
				if bytes.Equal(name, bMeta) {
					return nil // the applied marker exists only under the FSM
				}
				return b.ForEach(func(k, v []byte) error {
					fmt.Fprintf(&buf, "%s/%s=%s\n", name, k, v)
					return nil
				})
			})
		})
		return buf.String()
	}
	f.mu.RLock()
	a, b := dump(f.db), dump(ref)
	f.mu.RUnlock()
	if a != b {
		t.Fatalf("batched state differs from one-by-one:\n%s\n---\n%s", a, b)
	}
	if ix := indexOf(ref); !reflect.DeepEqual(f.ix.mac, ix.mac) || !reflect.DeepEqual(f.ix.state, ix.state) ||
		!reflect.DeepEqual(f.ix.ref, ix.ref) {
		t.Fatalf("indexes differ: %v %v %v / %v %v %v", f.ix.mac, f.ix.state, f.ix.ref, ix.mac, ix.state, ix.ref)
	}
	checkIndex(t, ref)
}

// TestPutSiteV2RefusesTakenID: put_site and put_rack (1, 2), which logs
// written before commands 22 and 23 hold, replay as they applied then,
// replacing a record of the same ID; put_site_v2 and put_rack_v2 refuse a
// create of a stored ID with ErrConflict and still update with CAS.
func TestPutSiteV2RefusesTakenID(t *testing.T) {
	db := testDB(t)
	ok := func(idx uint64, c *command) {
		t.Helper()
		if _, err := run(t, db, idx, c); err != nil {
			t.Fatalf("%s at %d: %v", c.Type, idx, err)
		}
	}
	ok(1, &command{Type: CmdPutSite, Site: &Site{Meta: Meta{ID: "s"}, Name: "a"}})
	ok(2, &command{Type: CmdPutSite, Site: &Site{Meta: Meta{ID: "s"}, Name: "b"}}) // the old meaning: replaced
	if _, err := run(t, db, 3, &command{Type: CmdPutSiteV2, Site: &Site{Meta: Meta{ID: "s"}, Name: "c"}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("put_site_v2 create over a stored ID: %v, want ErrConflict", err)
	}
	ok(4, &command{Type: CmdPutSiteV2, Site: &Site{Meta: Meta{ID: "s", ResourceVersion: 2}, Name: "d"}})
	ok(5, &command{Type: CmdPutRack, Rack: &Rack{Meta: Meta{ID: "r"}, Site: "s", Name: "a"}})
	ok(6, &command{Type: CmdPutRack, Rack: &Rack{Meta: Meta{ID: "r"}, Site: "s", Name: "b"}})
	if _, err := run(t, db, 7, &command{Type: CmdPutRackV2, Rack: &Rack{Meta: Meta{ID: "r"}, Site: "s", Name: "c"}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("put_rack_v2 create over a stored ID: %v, want ErrConflict", err)
	}
	ok(8, &command{Type: CmdPutRackV2, Rack: &Rack{Meta: Meta{ID: "r2"}, Site: "s", Name: "new"}})
}
