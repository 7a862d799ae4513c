package rules

import (
	"errors"
	"strings"
	"testing"

	"kiln/deploy/lab/testkit"
	"kiln/store"
)

// Every hostile text in every free-text field of a machine is refused with
// that field's name; MACs are normalised; the claim rule names its fields.
func TestCheckIntendedNamesTheField(t *testing.T) {
	for name, v := range testkit.HostileText {
		for field, set := range map[string]func(m *store.Machine){
			"name":             func(m *store.Machine) { m.Name = v },
			"site":             func(m *store.Machine) { m.Site = v },
			"rack":             func(m *store.Machine) { m.Rack = v },
			"boot_override":    func(m *store.Machine) { m.BootOverride = v },
			"root_disk.serial": func(m *store.Machine) { m.RootDisk.Serial = v },
			"intended.serial":  func(m *store.Machine) { m.Intended.Serial = v },
			"intended.vendor":  func(m *store.Machine) { m.Intended.Vendor = v },
			"labels.k":         func(m *store.Machine) { m.Labels = map[string]string{"k": v} },
		} {
			m := store.Machine{Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:00:00:01"}}}}
			set(&m)
			var fe *FieldError
			if err := CheckIntended(&m, true); !errors.As(err, &fe) || fe.Field != field {
				t.Errorf("%s in %s: %v", name, field, err)
			}
		}
	}
	m := store.Machine{Name: "n1", IPv4: "10.0.0.5", BootMode: store.BootModeUEFI, RackUnit: MaxRackUnit,
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "52-54-00-AA-BB-01"}}, BMCMAC: "52:54:00:AA:BB:02"}}
	if err := CheckIntended(&m, true); err != nil || m.Intended.NICs[0].MAC != "52:54:00:aa:bb:01" || m.Intended.BMCMAC != "52:54:00:aa:bb:02" {
		t.Fatalf("good machine: %v %+v", err, m.Intended)
	}
	for field, bad := range map[string]store.Machine{
		"rack_unit":            {RackUnit: MaxRackUnit + 1},
		"boot_mode":            {BootMode: "efi"},
		"ipv4":                 {IPv4: "fd00::1"},
		"intended.nics[1].mac": {Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:00:00:01"}, {MAC: "52:54:00:00:00:01"}}}},
		"intended.cpus":        {Intended: store.Hardware{CPUs: -1}},
		"labels.zone-":         {Labels: map[string]string{"zone-": "a"}},
	} {
		var fe *FieldError
		if err := CheckIntended(&bad, true); !errors.As(err, &fe) || fe.Field != field || !strings.HasPrefix(err.Error(), field+": ") {
			t.Errorf("%s: %v", field, err)
		}
	}
	// hw false leaves the stored hardware alone (an update that does not replace it).
	old := store.Machine{Intended: store.Hardware{CPUs: -1}}
	if err := CheckIntended(&old, false); err != nil {
		t.Errorf("hardware checked although not replaced: %v", err)
	}
	for field, cl := range map[string]store.Claim{
		"claim.image":    {},
		"claim.hostname": {Image: "i", Hostname: "Bad_Host"},
		"claim.role":     {Image: "i", Role: "a\x1bb"},
		"claim.labels.k": {Image: "i", Labels: map[string]string{"k": "a=b"}},
	} {
		var fe *FieldError
		if err := CheckClaim("claim", cl); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v", field, err)
		}
	}
	if err := CheckClaim("claim", store.Claim{Image: "img-1", Hostname: "w1.hall1", Role: "worker"}); err != nil {
		t.Errorf("good claim: %v", err)
	}
	if CheckBMCDriver("telnet") == nil || CheckBMCDriver("auto") != nil || CheckImageFormat("lz4") == nil || CheckImageFormat("zstd") != nil {
		t.Error("driver or format rule")
	}
}
