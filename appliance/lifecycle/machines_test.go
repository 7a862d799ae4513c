package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/appliance/lifecycle/intake"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
	"kiln/store/storetest"
)

// newWriterTest is a controller over a real local store (storetest.NewLocal), for the tests
// of the machine-record writes in machines.go.
func newWriterTest(t *testing.T, mod ...func(*Config)) (*Controller, *store.Store) {
	t.Helper()
	st := storetest.NewLocal(t)
	cfg := Config{ImageBaseURL: "http://127.0.0.1:8080"}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := New(cfg, st, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

func fieldOf(err error) string {
	var fe *rules.FieldError
	if errors.As(err, &fe) && errors.Is(err, ErrInvalid) {
		return fe.Field
	}
	return ""
}

// CreateMachine applies the machine rules (normalising MACs) and records a
// registered machine; UpdateIntended keeps the boot token, the state and
// the claim, needs the current resource version and applies the same rules.
func TestCreateAndUpdateIntended(t *testing.T) {
	c, st := newWriterTest(t)
	ctx := context.Background()
	w := store.W{Actor: "test"}
	for _, bad := range []struct {
		in    Intended
		field string
	}{
		{Intended{Name: "a b", Hardware: store.Hardware{Serial: "S"}}, "name"},
		{Intended{Hardware: store.Hardware{NICs: []store.NIC{{MAC: "ff:ff:ff:ff:ff:ff"}}}}, "intended.nics[0].mac"},
		{Intended{Labels: map[string]string{"zone": "a,b"}, Hardware: store.Hardware{Serial: "S"}}, "labels.zone"},
		{Intended{RackUnit: 101, Hardware: store.Hardware{Serial: "S"}}, "rack_unit"},
		{Intended{Name: "empty"}, "intended.nics"},
	} {
		if _, err := c.CreateMachine(ctx, bad.in, w); fieldOf(err) != bad.field {
			t.Errorf("%+v: %v, want a FieldError on %s", bad.in, err, bad.field)
		}
	}
	m, err := c.CreateMachine(ctx, Intended{Name: "n1", Labels: map[string]string{"zone": "a"},
		Hardware: store.Hardware{NICs: []store.NIC{{MAC: "52-54-00-AA-00-01"}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != store.StateRegistered || m.Intended.NICs[0].MAC != "52:54:00:aa:00:01" || m.ID == "" {
		t.Fatalf("created %+v", m)
	}
	// A running agent's token survives an intended-field update.
	b, err := c.BootFor(ctx, "52:54:00:aa:00:01")
	if err != nil || b.Token == "" {
		t.Fatalf("boot %+v %v", b, err)
	}
	m, _ = st.GetMachine(m.ID)
	name, rack := "n1-renamed", "r7"
	out, err := c.UpdateIntended(ctx, m.ID, IntendedPatch{ResourceVersion: m.ResourceVersion, Name: &name, Rack: &rack}, w)
	if err != nil {
		t.Fatal(err)
	}
	if out.Name != name || out.Rack != rack || out.BootTokenHash == "" || out.BootTokenHash != m.BootTokenHash ||
		out.State != m.State || !c.VerifyAgentToken(m.ID, b.Token) {
		t.Fatalf("updated %+v (token kept: %v)", out, c.VerifyAgentToken(m.ID, b.Token))
	}
	// The version read before is stale now.
	if _, err := c.UpdateIntended(ctx, m.ID, IntendedPatch{ResourceVersion: m.ResourceVersion, Name: &name}, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale version: %v", err)
	}
	if _, err := c.UpdateIntended(ctx, m.ID, IntendedPatch{Name: &name}, w); fieldOf(err) != "resource_version" {
		t.Fatalf("no version: %v", err)
	}
	badLabels := map[string]string{"zone-": "x"}
	if _, err := c.UpdateIntended(ctx, m.ID, IntendedPatch{ResourceVersion: out.ResourceVersion, Labels: &badLabels}, w); fieldOf(err) != "labels.zone-" {
		t.Fatalf("bad label: %v", err)
	}
	if _, err := c.UpdateIntended(ctx, "m-nope", IntendedPatch{ResourceVersion: 1, Name: &name}, w); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown machine: %v", err)
	}
}

// DHCP discovery goes through the controller's discovery limits: the
// discovered cap counts it, and a MAC already recorded is not recorded again.
func TestDiscoverDHCPTakesTheDiscoveryLimits(t *testing.T) {
	c, st := newWriterTest(t, func(cfg *Config) { cfg.MaxDiscovered = 2 })
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		created, err := c.DiscoverDHCP(ctx, fmt.Sprintf("52:54:00:bb:00:%02x", i), "efi-x86_64", "PXEClient,x=y")
		if err != nil {
			t.Fatal(err)
		}
		if created != (i < 2) {
			t.Fatalf("discovery %d: created %v with cap 2", i, created)
		}
	}
	if created, err := c.DiscoverDHCP(ctx, "52:54:00:BB:00:00", "bios", ""); created || err != nil {
		t.Fatalf("known MAC recorded again: %v %v", created, err)
	}
	m, err := st.MachineByMAC("52:54:00:bb:00:01")
	if err != nil {
		t.Fatal(err)
	}
	if m.State != store.StateDiscovered || m.BootTokenHash != "" || m.Labels[LabelDiscoveredBy] != DiscoveredByDHCP ||
		m.Labels[LabelArch] != "efi-x86_64" || m.Labels[LabelVendorClass] != "PXEClientxy" {
		t.Fatalf("recorded %+v", m)
	}
	if err := rules.CheckLabels("labels", m.Labels); err != nil {
		t.Fatalf("a discovered record's labels break the label rule: %v", err)
	}
	// The iPXE path shares the cap.
	if b, err := c.BootFor(ctx, "52:54:00:bb:00:09"); err != nil || b.Action != BootLocal {
		t.Fatalf("iPXE discovery over the cap: %+v %v", b, err)
	}
	if _, err := c.DiscoverDHCP(ctx, "01:00:5e:00:00:01", "", ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("group MAC: %v", err)
	}
}

// mergeInventory keeps what the BMC does not offer, adds the NICs it lists
// in the store's MAC form, and skips MACs the store's rule refuses.
func TestMergeInventoryKeepsWhatTheBMCDoesNotOffer(t *testing.T) {
	m := store.Machine{Discovered: &store.Hardware{Serial: "agent-serial", CPUs: 64, NICs: []store.NIC{{MAC: "52:54:00:00:00:01", LinkUp: true}}}}
	mergeInventory(&m, Inventory{Model: "R9000\x1b[31m", NICMACs: []string{"52:54:00:00:00:01", "52-54-00-00-00-02", "ff:ff:ff:ff:ff:ff"}})
	d := m.Discovered
	if d.Serial != "agent-serial" || d.CPUs != 64 || d.Model != "R9000 [31m" || len(d.NICs) != 2 || !d.NICs[0].LinkUp ||
		d.NICs[1].MAC != "52:54:00:00:00:02" {
		t.Fatalf("merged: %+v", d)
	}
}

// labelValue leaves only what a label value may hold.
func TestLabelValueIsALabel(t *testing.T) {
	for in, want := range map[string]string{
		"PXEClient:Arch:00007:UNDI:003016": "PXEClient:Arch:00007:UNDI:003016",
		"a b,c=d\x00é":                     "abcd",
		"":                                 "",
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
	}
	if got := labelValue(strings.Repeat("y", 100)); len(got) != 63 {
		t.Errorf("long value kept %d bytes", len(got))
	}
}

// An imported machine is checked by the same record rule as the API's
// writes: a label key the rule refuses is a bad row, and a machine the
// import accepted takes a later intended-field update (issue 11: intake
// accepted "zone-", which the API refused, so every later PATCH failed).
func TestImportAndUpdateShareTheRule(t *testing.T) {
	c, st := newWriterTest(t)
	ctx := context.Background()
	w := store.W{Actor: "test"}
	var rows *intake.ErrRows
	_, err := c.Import(ctx, strings.NewReader("name,serial,macs,labels\nn1,S1,52:54:00:cc:00:01,zone-=a\n"), "csv", w)
	if !errors.As(err, &rows) || len(rows.Rows) != 1 || rows.Rows[0].Line != 2 || rows.Rows[0].Field != "labels" {
		t.Fatalf("label key zone- imported: %v", err)
	}
	res, err := c.Import(ctx, strings.NewReader("name,serial,macs,labels,u\nn1,S1,52-54-00-CC-00-01,zone=a,42\n"), "csv", w)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMachine(res.IDs[0])
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"zone": "b", "pool": "gpu"}
	out, err := c.UpdateIntended(ctx, m.ID, IntendedPatch{ResourceVersion: m.ResourceVersion, Labels: &labels}, w)
	if err != nil || out.Labels["zone"] != "b" || out.RackUnit != 42 || out.Intended.NICs[0].MAC != "52:54:00:cc:00:01" {
		t.Fatalf("update of an imported machine: %+v %v", out, err)
	}
}
