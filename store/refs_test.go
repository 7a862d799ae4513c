package store

import (
	"errors"
	"reflect"
	"testing"

	"go.etcd.io/bbolt"
)

// TestApplyClaimNeedsImage: under CmdPutMachinesV2 a claim that a write adds
// or changes must name a stored image, and CmdDeleteImageV2 refuses an image
// a claim names, in any machine state; both are decided inside apply. The
// replaced commands (3, 8) replay with their old meaning.
func TestApplyClaimNeedsImage(t *testing.T) {
	db := testDB(t)
	idx := uint64(0)
	do := func(c *command) error {
		idx++
		_, err := run(t, db, idx, c)
		return err
	}
	put := func(typ CommandType, m Machine) error {
		return do(&command{Type: typ, Machines: []Machine{m}})
	}
	if err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Claim: &Claim{Image: "img-1"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("claim naming a missing image: %v, want ErrInvalid", err)
	}
	if _, ok := machineAt(t, db, "m-1"); ok {
		t.Fatal("refused create was written")
	}
	if err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Claim: &Claim{}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("claim without image: %v, want ErrInvalid", err)
	}
	if err := do(&command{Type: CmdPutImage, Image: &Image{Meta: Meta{ID: "img-1"}, Name: "os"}}); err != nil {
		t.Fatal(err)
	}
	if err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-1"}, Claim: &Claim{Image: "img-1"}}); err != nil {
		t.Fatalf("claim naming a stored image: %v", err)
	}
	// The image is in use in every state a claimed machine goes through.
	for _, s := range []MachineState{StateRegistered, StateInspecting, StateAvailable, StateProvisioning, StateProvisioned, StateFailed} {
		if s != StateRegistered {
			m, _ := machineAt(t, db, "m-1")
			m.State = s
			if err := put(CmdPutMachinesV2, m); err != nil {
				t.Fatalf("to %s: %v", s, err)
			}
		}
		err := do(&command{Type: CmdDeleteImageV2, ID: "img-1"})
		if !errors.Is(err, ErrImageInUse) {
			t.Fatalf("delete of an image claimed by a %s machine: %v, want ErrImageInUse", s, err)
		}
		if want := "store: image is named by a machine's claim: image img-1 is claimed by machine m-1 (" + string(s) + "); release the machine first"; err.Error() != want {
			t.Fatalf("message %q, want %q", err, want)
		}
	}
	if _, err := getIn(db, bImages, "img-1"); err != nil {
		t.Fatal("refused delete removed the image")
	}
	// Dropping the claim frees the image.
	m, _ := machineAt(t, db, "m-1")
	m.Claim = nil
	if err := put(CmdPutMachinesV2, m); err != nil {
		t.Fatal(err)
	}
	if err := do(&command{Type: CmdDeleteImageV2, ID: "img-1"}); err != nil {
		t.Fatalf("delete of an unclaimed image: %v", err)
	}
	if err := do(&command{Type: CmdDeleteImageV2, ID: "img-1"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}

	// Replay of the old commands: a dangling claim is accepted (command 3),
	// an update that keeps it is accepted under V2, one that changes it to
	// another missing image is not; command 8 deletes a claimed image.
	if err := put(CmdPutMachines, Machine{Meta: Meta{ID: "m-2"}, Claim: &Claim{Image: "gone"}}); err != nil {
		t.Fatalf("command 3 with a dangling claim: %v", err)
	}
	m2, _ := machineAt(t, db, "m-2")
	m2.Name = "renamed"
	if err := put(CmdPutMachinesV2, m2); err != nil {
		t.Fatalf("V2 update keeping an old claim: %v", err)
	}
	m2, _ = machineAt(t, db, "m-2")
	m2.Claim = &Claim{Image: "also-gone"}
	if err := put(CmdPutMachinesV2, m2); !errors.Is(err, ErrInvalid) {
		t.Fatalf("V2 update changing the claim to a missing image: %v", err)
	}
	if err := do(&command{Type: CmdPutImage, Image: &Image{Meta: Meta{ID: "img-2"}, Name: "os2"}}); err != nil {
		t.Fatal(err)
	}
	if err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-3"}, Claim: &Claim{Image: "img-2"}}); err != nil {
		t.Fatal(err)
	}
	if err := do(&command{Type: CmdDeleteImage, ID: "img-2"}); err != nil {
		t.Fatalf("command 8 replays unchecked: %v", err)
	}
	// Deleting the machine drops its claim from the index.
	if err := do(&command{Type: CmdPutImage, Image: &Image{Meta: Meta{ID: "img-3"}, Name: "os3"}}); err != nil {
		t.Fatal(err)
	}
	if err := put(CmdPutMachinesV2, Machine{Meta: Meta{ID: "m-4"}, Claim: &Claim{Image: "img-3"}}); err != nil {
		t.Fatal(err)
	}
	if err := do(&command{Type: CmdDeleteMachine, ID: "m-4"}); err != nil {
		t.Fatal(err)
	}
	if err := do(&command{Type: CmdDeleteImageV2, ID: "img-3"}); err != nil {
		t.Fatalf("delete after the claiming machine was deleted: %v", err)
	}
	checkIndex(t, db)
}

func getIn(db interface {
	View(func(*bbolt.Tx) error) error
}, bucket []byte, id string) ([]byte, error) {
	var out []byte
	err := db.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucket).Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		out = append(out, v...)
		return nil
	})
	return out, err
}

// TestApplyImportConflicts: CmdImportMachines refuses, all at once and
// naming each, every name, serial (any case), BMC MAC and NIC MAC that a
// stored machine or an earlier imported machine holds — NIC and BMC MACs
// in one space — and writes nothing; an import is create-only.
func TestApplyImportConflicts(t *testing.T) {
	db := testDB(t)
	stored := Machine{Meta: Meta{ID: "m-a"}, Name: "a", Intended: Hardware{Serial: "SN-1", BMCMAC: "02:00:00:00:0b:01",
		NICs: []NIC{{MAC: "02:00:00:00:0a:01"}}}}
	if _, err := run(t, db, 1, &command{Type: CmdPutMachinesV2, Machines: []Machine{stored}}); err != nil {
		t.Fatal(err)
	}
	rows := []Machine{
		{Meta: Meta{ID: "i-0"}, Name: "a", Intended: nic("02:00:00:00:0a:10")},                                                       // name of m-a
		{Meta: Meta{ID: "i-1"}, Name: "b", Intended: Hardware{Serial: "sn-1", NICs: []NIC{{MAC: "02:00:00:00:0a:11"}}}},              // serial of m-a, other case
		{Meta: Meta{ID: "i-2"}, Name: "c", Intended: nic("02:00:00:00:0b:01")},                                                       // NIC MAC = m-a's BMC MAC
		{Meta: Meta{ID: "i-3"}, Name: "d", Intended: Hardware{BMCMAC: "02:00:00:00:0a:01", NICs: []NIC{{MAC: "02:00:00:00:0a:13"}}}}, // BMC MAC = m-a's NIC MAC
		{Meta: Meta{ID: "i-4"}, Name: "e", Intended: Hardware{BMCMAC: "02:00:00:00:0b:14", NICs: []NIC{{MAC: "02:00:00:00:0a:14"}}}},
		{Meta: Meta{ID: "i-5"}, Name: "e", Intended: Hardware{Serial: "X", NICs: []NIC{{MAC: "02:00:00:00:0B:14"}}}}, // name and a MAC of row 4
		{Meta: Meta{ID: "i-6"}, Name: "f", Intended: Hardware{Serial: "x", NICs: []NIC{{MAC: "02:00:00:00:0a:16"}}}}, // serial of row 5
		{Meta: Meta{ID: "i-7"}, Name: "g", Intended: nic("02:00:00:00:0a:17")},                                       // fine
	}
	_, err := run(t, db, 2, &command{Type: CmdImportMachines, Machines: rows})
	var ice *ImportConflictError
	if !errors.As(err, &ice) || !errors.Is(err, ErrConflict) {
		t.Fatalf("import: %v, want *ImportConflictError", err)
	}
	want := []Conflict{
		{Index: 0, Field: "name", Value: "a", Holder: "m-a", HolderName: "a", HolderIndex: -1},
		{Index: 1, Field: "serial", Value: "sn-1", Holder: "m-a", HolderName: "a", HolderIndex: -1},
		{Index: 2, Field: "macs", Value: "02:00:00:00:0b:01", Holder: "m-a", HolderName: "a", HolderIndex: -1},
		{Index: 3, Field: "bmc_mac", Value: "02:00:00:00:0a:01", Holder: "m-a", HolderName: "a", HolderIndex: -1},
		{Index: 5, Field: "name", Value: "e", HolderIndex: 4},
		{Index: 5, Field: "macs", Value: "02:00:00:00:0b:14", HolderIndex: 4},
		{Index: 6, Field: "serial", Value: "x", HolderIndex: 5},
	}
	if !reflect.DeepEqual(ice.Conflicts, want) {
		t.Fatalf("conflicts\n got %+v\nwant %+v", ice.Conflicts, want)
	}
	for _, r := range rows {
		if _, ok := machineAt(t, db, r.ID); ok {
			t.Fatalf("refused import wrote %s", r.ID)
		}
	}
	if n := len(allEvents(t, db)); n != 1 {
		t.Fatalf("%d events after a refused import, want 1", n)
	}
	checkIndex(t, db)

	// The clean rows import; an import naming a stored ID is refused.
	if _, err := run(t, db, 3, &command{Type: CmdImportMachines, Machines: []Machine{rows[4], rows[7]}}); err != nil {
		t.Fatalf("clean import: %v", err)
	}
	if m, ok := machineAt(t, db, "i-7"); !ok || m.State != StateRegistered {
		t.Fatalf("imported machine %+v", m)
	}
	if _, err := run(t, db, 4, &command{Type: CmdImportMachines, Machines: []Machine{{Meta: Meta{ID: "m-a"}, Name: "z"}}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("import over a stored ID: %v", err)
	}
	// A value freed by a delete can be imported again.
	if _, err := run(t, db, 5, &command{Type: CmdDeleteMachine, ID: "m-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, db, 6, &command{Type: CmdImportMachines, Machines: []Machine{rows[0], rows[1], rows[2], rows[3]}}); err != nil {
		t.Fatalf("import after the holder was deleted: %v", err)
	}
	checkIndex(t, db)
}
