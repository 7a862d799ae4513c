package store_test

import (
	"context"
	"errors"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// put_baseline (35): a baseline per hardware model, its ID derived from
// vendor and model (case- and space-insensitive), compare-and-set (a
// resource_version 0 write sets it whatever is stored, as for images), checked
// (vendor, model, components, image URIs), with an event; it survives a
// reopen (the log replays).
func TestPutBaseline(t *testing.T) {
	dir := t.TempDir()
	s := storetest.OpenLocal(t, dir)
	ctx := context.Background()
	w := store.W{Actor: "api:test", Reason: "baseline_set"}
	b := store.Baseline{Vendor: "QEMU", Model: "Standard PC (i440FX + PIIX, 1996)",
		Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "2.1.0", ImageURI: "http://10.0.0.1:8080/images/bios-2.1.0.fw"}},
		BIOS:     map[string]string{"ProcVirtualization": "Disabled"}}
	got, err := s.PutBaseline(ctx, b, w)
	if err != nil || got.ID != store.BaselineID("qemu ", " standard pc (i440fx + piix, 1996)") || got.ResourceVersion == 0 {
		t.Fatalf("create: %+v, %v", got, err)
	}
	got.BIOS["SriovGlobalEnable"] = "Enabled"
	upd, err := s.PutBaseline(ctx, got, w)
	if err != nil || upd.ResourceVersion <= got.ResourceVersion || len(upd.BIOS) != 2 {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	if _, err := s.PutBaseline(ctx, got, w); !errors.Is(err, store.ErrConflict) { // stale resource_version
		t.Fatalf("stale update: %v, want conflict", err)
	}
	for name, bad := range map[string]store.Baseline{
		"no model":       {Vendor: "QEMU"},
		"repeated":       {Vendor: "A", Model: "B", Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "1"}, {Component: "BIOS", Version: "2"}}},
		"no version":     {Vendor: "A", Model: "B", Firmware: []store.BaselineFirmware{{Component: "BIOS"}}},
		"ftp image":      {Vendor: "A", Model: "B", Firmware: []store.BaselineFirmware{{Component: "BIOS", Version: "1", ImageURI: "ftp://x/y"}}},
		"empty attr key": {Vendor: "A", Model: "B", BIOS: map[string]string{"": "x"}},
	} {
		if _, err := s.PutBaseline(ctx, bad, w); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("%s: %v, want invalid", name, err)
		}
	}
	evs, err := s.Events(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Subject == "baseline/"+got.ID && (e.Kind == "created" || e.Kind == "updated") {
			n++
		}
	}
	if n != 2 { // the stale update wrote nothing
		t.Fatalf("%d baseline events, want 2", n)
	}
	s.Close()
	s = storetest.OpenLocal(t, dir)
	list, err := s.ListBaselines()
	if err != nil || len(list) != 1 || list[0].BIOS["SriovGlobalEnable"] != "Enabled" || list[0].Firmware[0].Version != "2.1.0" {
		t.Fatalf("after reopen: %+v, %v", list, err)
	}
	if b, err := s.BaselineFor("qemu", "standard pc (i440fx + piix, 1996)"); err != nil || b.ID != got.ID {
		t.Fatalf("BaselineFor: %+v, %v", b, err)
	}
	if _, err := s.BaselineFor("qemu", "other"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("BaselineFor other model: %v", err)
	}
	if store.CmdPutBaseline != 35 || store.CmdPutBaseline.String() != "put_baseline" {
		t.Fatalf("command number %d %s", store.CmdPutBaseline, store.CmdPutBaseline)
	}
}
