package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// bind applies one CmdBindLeases at time at (index idx) and returns the
// per-change errors.
func bind(t *testing.T, db *bbolt.DB, idx uint64, at time.Time, ls ...Lease) []error {
	t.Helper()
	vals, err := run(t, db, idx, &command{Type: CmdBindLeases, Time: at, Leases: ls})
	if err != nil {
		t.Fatalf("bind_leases refused as a whole: %v", err)
	}
	errs, err := leaseErrors(vals, nil, len(ls))
	if err != nil {
		t.Fatal(err)
	}
	return errs
}

func addrRec(t *testing.T, db *bbolt.DB, ip string) (Lease, bool) {
	t.Helper()
	var l Lease
	found := false
	_ = db.View(func(tx *bbolt.Tx) error {
		if raw := tx.Bucket(bLeaseAddrs).Get([]byte(ip)); raw != nil {
			found = true
			return json.Unmarshal(raw, &l)
		}
		return nil
	})
	return l, found
}

// The FSM holds the address invariant whatever the callers believe: a
// binding or a decline of an address another client holds unexpired is
// refused with *AddressTakenError naming the holder, judged at the
// command's (leader's) time; the holder may renew; once the binding
// expires or is released, another client may take it; a decline keeps the
// address from everyone, its decliner included, until it runs out. In one
// batch each change is decided on its own, in order.
func TestBindLeasesInvariant(t *testing.T) {
	db := testDB(t)
	const a, b, c = "02:00:00:00:00:0A", "02:00:00:00:00:0b", "02:00:00:00:00:0c"
	const x = "10.96.0.100"
	h := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	lease := func(mac, state string, until time.Time) Lease {
		return Lease{MAC: mac, IP: x, State: state, Expiry: until}
	}
	steps := []struct {
		name  string
		at    time.Time
		l     Lease
		taken string // holder MAC of the refusal; "" = accepted
	}{
		{"a binds x", h(0), lease(a, LeaseBound, h(60)), ""},
		{"b may not bind what a holds", h(1), lease(b, LeaseBound, h(61)), "02:00:00:00:00:0a"},
		{"b may not decline what a holds", h(1), lease(b, LeaseDeclined, h(11)), "02:00:00:00:00:0a"},
		{"b may not release what a holds", h(1), lease(b, LeaseReleased, h(1)), "02:00:00:00:00:0a"},
		{"a renews", h(30), lease(a, LeaseBound, h(90)), ""},
		{"still a's just before the new expiry", h(89), lease(b, LeaseBound, h(149)), "02:00:00:00:00:0a"},
		{"b binds once a's binding expired", h(90), lease(b, LeaseBound, h(150)), ""},
		{"a's late release changes nothing of b's", h(91), lease(a, LeaseReleased, h(91)), "02:00:00:00:00:0b"},
		{"b releases", h(92), lease(b, LeaseReleased, h(92)), ""},
		{"c declines the free address", h(93), lease(c, LeaseDeclined, h(103)), ""},
		{"a may not bind a declined address", h(94), lease(a, LeaseBound, h(154)), "02:00:00:00:00:0c"},
		{"nor may the decliner", h(94), lease(c, LeaseBound, h(154)), "02:00:00:00:00:0c"},
		{"a binds once the decline ran out", h(103), lease(a, LeaseBound, h(163)), ""},
	}
	for i, s := range steps {
		errs := bind(t, db, uint64(10+i), s.at, s.l)
		var te *AddressTakenError
		switch {
		case s.taken == "" && errs[0] != nil:
			t.Fatalf("%s: refused: %v", s.name, errs[0])
		case s.taken != "" && !errors.As(errs[0], &te):
			t.Fatalf("%s: got %v, want *AddressTakenError", s.name, errs[0])
		case s.taken != "" && (te.Holder.MAC != s.taken || !errors.Is(errs[0], ErrAddressTaken) || te.IP != x):
			t.Fatalf("%s: refusal %+v does not name holder %s", s.name, te, s.taken)
		}
	}
	if l, _ := addrRec(t, db, x); l.MAC != "02:00:00:00:00:0a" || l.State != LeaseBound || !l.Expiry.Equal(h(163)) {
		t.Fatalf("final record %+v", l)
	}

	// One batch: each change decided in order on the state the previous left.
	const y, z = "10.96.0.101", "10.96.0.102"
	errs := bind(t, db, 100, h(200),
		Lease{MAC: b, IP: y, State: LeaseBound, Expiry: h(260)},
		Lease{MAC: c, IP: y, State: LeaseBound, Expiry: h(260)}, // y was just taken by b
		Lease{MAC: "zz", IP: z, State: LeaseBound},              // malformed MAC
		Lease{MAC: c, IP: "10.96.0.300", State: LeaseBound},     // not an address
		Lease{MAC: c, IP: z, State: "offered"},                  // not a state the log holds
		Lease{MAC: c, IP: z, State: LeaseBound, Expiry: h(260)})
	if errs[0] != nil || !errors.Is(errs[1], ErrAddressTaken) || errs[5] != nil {
		t.Fatalf("batch: %v", errs)
	}
	for _, e := range errs[2:5] {
		if !errors.Is(e, ErrInvalid) {
			t.Fatalf("malformed change: %v, want ErrInvalid", e)
		}
	}
	if l, _ := addrRec(t, db, y); l.MAC != "02:00:00:00:00:0b" {
		t.Fatalf("y held by %+v, want b", l)
	}
	// A release is stamped with the leader's time, not the caller's.
	if errs := bind(t, db, 101, h(201), Lease{MAC: b, IP: y, State: LeaseReleased, Expiry: h(999)}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if l, _ := addrRec(t, db, y); l.State != LeaseReleased || !l.Expiry.Equal(h(201)) {
		t.Fatalf("release stored as %+v", l)
	}
	// Events: one per change of holder or state, none for a renewal or a refusal.
	n := 0
	for _, ev := range allEvents(t, db) {
		if ev.Kind == "lease" {
			n++
		}
	}
	// a, b, b released, c declined, a again; b@y, c@z, b@y released.
	if n != 8 {
		t.Fatalf("%d lease events, want 8", n)
	}
}

// A release commits late: the client released x through one node and at
// once got x again through another, whose binding committed first. Under
// CmdBindLeasesV2 the late release names the binding it ends (by its
// Expiry) and leaves the newer binding alone, so x is not given to a second
// client while the first holds its new ACK; a release naming the current
// binding ends it. CmdBindLeases (18) replays as it was acknowledged: its
// late release ends the newer binding (what deploy/lab/leasecheck found).
func TestLateReleaseKeepsNewerBinding(t *testing.T) {
	const a, b = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
	const x = "10.96.0.110"
	h := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	apply := func(db *bbolt.DB, typ CommandType, idx uint64, at time.Time, l Lease) error {
		t.Helper()
		vals, err := run(t, db, idx, &command{Type: typ, Time: at, Leases: []Lease{l}})
		if err != nil {
			t.Fatalf("%s refused as a whole: %v", typ, err)
		}
		errs, err := leaseErrors(vals, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		return errs[0]
	}
	for _, c := range []struct {
		typ       CommandType
		keepsNewA bool
	}{{CmdBindLeasesV2, true}, {CmdBindLeases, false}} {
		db := testDB(t)
		steps := []struct {
			at    time.Time
			l     Lease
			taken bool
		}{
			{h(0), Lease{MAC: a, IP: x, State: LeaseBound, Expiry: h(20)}, false},     // a's first binding
			{h(13), Lease{MAC: a, IP: x, State: LeaseBound, Expiry: h(33)}, false},    // a's new binding (another node)
			{h(14), Lease{MAC: a, IP: x, State: LeaseReleased, Expiry: h(20)}, false}, // the late release of the first
			{h(14), Lease{MAC: b, IP: x, State: LeaseBound, Expiry: h(34)}, c.keepsNewA},
		}
		for i, st := range steps {
			err := apply(db, c.typ, uint64(10+i), st.at, st.l)
			if st.taken != errors.Is(err, ErrAddressTaken) || (!st.taken && err != nil) {
				t.Fatalf("%s step %d (%s %s): %v, want taken=%v", c.typ, i, st.l.MAC, st.l.State, err, st.taken)
			}
		}
		l, _ := addrRec(t, db, x)
		if want := a; !c.keepsNewA {
			if l.MAC != b {
				t.Fatalf("%s: record %+v, want b's (18 replays as acknowledged)", c.typ, l)
			}
		} else if l.MAC != want || l.State != LeaseBound || !l.Expiry.Equal(h(33)) {
			t.Fatalf("%s: record %+v, want a's newer binding until %s", c.typ, l, h(33))
		}
		if !c.keepsNewA {
			continue
		}
		// A release naming the current binding ends it, at the leader's time;
		// a second one (the record is no binding now) changes nothing.
		if err := apply(db, c.typ, 20, h(15), Lease{MAC: a, IP: x, State: LeaseReleased, Expiry: h(33)}); err != nil {
			t.Fatal(err)
		}
		if l, _ := addrRec(t, db, x); l.State != LeaseReleased || !l.Expiry.Equal(h(15)) {
			t.Fatalf("release of the current binding stored as %+v", l)
		}
		if err := apply(db, c.typ, 21, h(16), Lease{MAC: a, IP: x, State: LeaseReleased, Expiry: h(33)}); err != nil {
			t.Fatal(err)
		}
		if l, _ := addrRec(t, db, x); !l.Expiry.Equal(h(15)) {
			t.Fatalf("a second release changed the record: %+v", l)
		}
		if err := apply(db, c.typ, 22, h(16), Lease{MAC: b, IP: x, State: LeaseBound, Expiry: h(36)}); err != nil {
			t.Fatalf("b after a's release: %v", err)
		}
	}
}

// A binding of a client that commits after the same client's longer one
// (its REQUEST older, its commit held up) keeps the longer expiry under
// CmdBindLeasesV2, so another client cannot take the address before the
// ACKed lease ends; CmdBindLeases (18) replays as it was: the record is
// shortened and the other client gets it (what deploy/lab/leasecheck found).
func TestLateBindingNeverShortens(t *testing.T) {
	const a, b = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
	const x = "10.96.0.111"
	h := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, c := range []struct {
		typ  CommandType
		keep bool
	}{{CmdBindLeasesV2, true}, {CmdBindLeases, false}} {
		db := testDB(t)
		for i, st := range []struct {
			at time.Time
			l  Lease
		}{
			{h(0), Lease{MAC: a, IP: x, State: LeaseBound, Expiry: h(40)}}, // the newer REQUEST's binding
			{h(1), Lease{MAC: a, IP: x, State: LeaseBound, Expiry: h(35)}}, // an older REQUEST's, committed late
		} {
			vals, err := run(t, db, uint64(10+i), &command{Type: c.typ, Time: st.at, Leases: []Lease{st.l}})
			if err != nil {
				t.Fatal(err)
			}
			if errs, err := leaseErrors(vals, nil, 1); err != nil || errs[0] != nil {
				t.Fatalf("%s step %d: %v %v", c.typ, i, errs, err)
			}
		}
		vals, err := run(t, db, 20, &command{Type: c.typ, Time: h(36), Leases: []Lease{{MAC: b, IP: x, State: LeaseBound, Expiry: h(56)}}})
		if err != nil {
			t.Fatal(err)
		}
		errs, _ := leaseErrors(vals, nil, 1)
		if c.keep != errors.Is(errs[0], ErrAddressTaken) {
			t.Fatalf("%s: b's binding at 36 s: %v (a's binding should run to 40 s: %v)", c.typ, errs[0], c.keep)
		}
		if l, _ := addrRec(t, db, x); c.keep && (l.MAC != a || !l.Expiry.Equal(h(40))) {
			t.Fatalf("%s: record %+v, want a's until 40 s", c.typ, l)
		}
	}
}

// Issue 11: reloading leases must never let a stale record for an address
// replace a live binding. The per-MAC records of the older command 10 come
// in MAC order when the address view is rebuilt (a snapshot from before
// it), and in log order on replay; in both, a stale record of one client
// (expired or released) for the address another client holds live loses,
// whichever comes first.
func TestStaleLeaseNeverReplacesLiveBinding(t *testing.T) {
	const x = "10.96.0.100"
	live := Lease{MAC: "02:00:00:00:00:01", IP: x, State: LeaseBound, Expiry: t0.Add(time.Hour)}
	stale := []Lease{
		{MAC: "02:00:00:00:00:02", IP: x, State: LeaseBound, Expiry: t0.Add(-time.Hour)}, // expired
		{MAC: "02:00:00:00:00:00", IP: x, State: LeaseReleased, Expiry: t0},              // released, sorts first
	}
	for _, s := range stale {
		for _, order := range [][]Lease{{live, s}, {s, live}} {
			// Replay of command 10 in either order.
			db := testDB(t)
			for i, l := range order {
				if _, err := run(t, db, uint64(i+1), &command{Type: CmdPutLeases, Time: t0, Leases: []Lease{l}}); err != nil {
					t.Fatal(err)
				}
			}
			if got, _ := addrRec(t, db, x); got.MAC != live.MAC || got.State != LeaseBound {
				t.Fatalf("replay %s then %s: address view holds %+v", order[0].MAC, order[1].MAC, got)
			}
			// The same records rebuilt from the per-MAC bucket (MAC order).
			if err := db.Update(func(tx *bbolt.Tx) error {
				if err := tx.DeleteBucket(bLeaseAddrs); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(bLeaseAddrs); err != nil {
					return err
				}
				return rebuildLeaseAddrs(tx)
			}); err != nil {
				t.Fatal(err)
			}
			if got, _ := addrRec(t, db, x); got.MAC != live.MAC || got.State != LeaseBound {
				t.Fatalf("rebuild: address view holds %+v", got)
			}
			// And the invariant then protects the live binding.
			if errs := bind(t, db, 10, t0.Add(time.Minute), Lease{MAC: s.MAC, IP: x, State: LeaseBound, Expiry: t0.Add(2 * time.Hour)}); !errors.Is(errs[0], ErrAddressTaken) {
				t.Fatalf("stale client took the live address: %v", errs[0])
			}
		}
	}
}

// A refused change writes nothing and tells the watchers nothing; an
// accepted one reaches them through the transaction's pending records.
func TestBindLeasesTellsWatchersCommittedOnly(t *testing.T) {
	db := testDB(t)
	x := newIdxTx(indexOf(db))
	c := &command{Type: CmdBindLeases, Time: t0, Leases: []Lease{
		{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)},
		{MAC: "02:00:00:00:00:02", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)},
	}}
	if err := db.Update(func(tx *bbolt.Tx) error { _, _, _, err := apply(tx, x, 1, c); return err }); err != nil {
		t.Fatal(err)
	}
	if len(x.leases) != 1 || x.leases[0].MAC != "02:00:00:00:00:01" {
		t.Fatalf("pending records %+v, want the one accepted binding", x.leases)
	}
	if _, err := run(t, db, 2, &command{Type: CmdBindLeases, Time: t0}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("empty bind_leases: %v, want ErrBadCommand", err)
	}
}

// memSink is a raft.SnapshotSink into memory.
type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// A watcher follows the FSM: applied gets each committed change, and a
// Restore (a snapshot replacing the state) resets it to the restored
// address view, rebuilt from the per-MAC records when the snapshot predates
// the address view.
func TestLeaseWatcherFollowsApplyAndRestore(t *testing.T) {
	f, err := newFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.close() })
	var mu sync.Mutex
	view := map[string]Lease{}
	resets := 0
	st := &Store{fsm: f}
	stop, err := st.WatchLeases(func(all []Lease) {
		mu.Lock()
		defer mu.Unlock()
		resets++
		clear(view)
		for _, l := range all {
			view[l.IP] = l
		}
	}, func(ls []Lease) {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range ls {
			view[l.IP] = l
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	entry := func(idx uint64, c *command) *raft.Log {
		c.Time = t0
		data, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		return &raft.Log{Index: idx, Type: raft.LogCommand, Data: data}
	}
	res := f.ApplyBatch([]*raft.Log{
		entry(1, &command{Type: CmdBindLeases, Leases: []Lease{{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)}}}),
		entry(2, &command{Type: CmdBindLeases}), // refused as a whole: nothing published
		entry(3, &command{Type: CmdBindLeases, Leases: []Lease{{MAC: "02:00:00:00:00:02", IP: "10.0.0.1", State: LeaseBound, Expiry: t0.Add(time.Hour)},
			{MAC: "02:00:00:00:00:02", IP: "10.0.0.2", State: LeaseBound, Expiry: t0.Add(time.Hour)}}}),
	})
	if r := res[1].(*applyResult); r.Err == nil {
		t.Fatal("empty bind_leases applied")
	}
	mu.Lock()
	if len(view) != 2 || view["10.0.0.1"].MAC != "02:00:00:00:00:01" || view["10.0.0.2"].MAC != "02:00:00:00:00:02" || resets != 1 {
		t.Fatalf("watcher view %+v after %d resets", view, resets)
	}
	mu.Unlock()

	// A snapshot from before the address view: per-MAC records only.
	old, err := openFSMFile(filepath.Join(t.TempDir(), "old.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Update(func(tx *bbolt.Tx) error {
		if err := tx.DeleteBucket(bLeaseAddrs); err != nil {
			return err
		}
		raw, _ := json.Marshal(Lease{MAC: "02:00:00:00:00:07", IP: "10.0.0.7", State: LeaseBound, Expiry: t0.Add(time.Hour)})
		return tx.Bucket(bLeases).Put([]byte("02:00:00:00:00:07"), raw)
	}); err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := old.View(func(tx *bbolt.Tx) error { _, err := tx.WriteTo(&sink); return err }); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if err := f.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if resets != 2 || len(view) != 1 || view["10.0.0.7"].MAC != "02:00:00:00:00:07" {
		t.Fatalf("after restore: view %+v, %d resets", view, resets)
	}
	if l, err := st.AddressLease("10.0.0.7"); err != nil || l.MAC != "02:00:00:00:00:07" {
		t.Fatalf("restored address view: %+v %v", l, err)
	}
}

// FuzzLeaseErrors: the per-change results of a bind_leases come back over
// the forward RPC as JSON values; whatever their bytes, decoding them never
// panics, a result that does not decode fails the whole write with
// ErrBadCommand, and each decoded change is nil, an *AddressTakenError or
// ErrInvalid.
func FuzzLeaseErrors(f *testing.F) {
	ok, _ := json.Marshal(leaseOutcome{Lease: Lease{MAC: "02:00:00:00:00:01", IP: "10.0.0.1", State: LeaseBound}})
	taken, _ := json.Marshal(leaseOutcome{Lease: Lease{IP: "10.0.0.1"}, Holder: &Lease{MAC: "02:00:00:00:00:02", State: LeaseBound}})
	bad, _ := json.Marshal(leaseOutcome{Error: "store: invalid argument: MAC"})
	for _, v := range [][]byte{ok, taken, bad, []byte(`{}`), []byte(`null`), []byte(`{"holder":null,"error":""}`), []byte(`[`)} {
		f.Add(v, ok)
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		errs, err := leaseErrors([]json.RawMessage{a, b}, nil, 2)
		if err != nil {
			if !errors.Is(err, ErrBadCommand) || errs != nil {
				t.Fatalf("whole-write error %v (errs %v)", err, errs)
			}
			return
		}
		for _, e := range errs {
			var te *AddressTakenError
			if e != nil && !errors.As(e, &te) && !errors.Is(e, ErrInvalid) {
				t.Fatalf("unclassified change error %v", e)
			}
		}
	})
}
