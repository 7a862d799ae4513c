package lifecycle

import (
	"strings"
	"testing"

	"kiln/api/agentapi"
	"kiln/store"
)

// Layer choice by hardware and role, from inspection inputs as the agent
// sends them (through inspectionFrom, as AgentRegister records them).
func TestChooseLayers(t *testing.T) {
	rel := store.Image{Meta: store.Meta{ID: "img-rel"}, Layers: []store.Layer{
		{Name: "base", Image: "img-rel", When: store.LayerAlways},
		{Name: "control-plane", Image: "img-cp", When: store.LayerControlPlane, PartName: "kiln-layer-control-plane"},
		{Name: "gpu", Image: "img-gpu", When: store.LayerNvidiaGPU, PartName: "kiln-layer-gpu"},
		{Name: "secure-runtime", Image: "img-sr", When: store.LayerVirt, PartName: "kiln-layer-secure-runtime"},
	}}
	vga := agentapi.PCIDevice{Address: "0000:00:02.0", VendorID: 0x1234, DeviceID: 0x1111, Class: 0x030000}
	nvidia := agentapi.PCIDevice{Address: "0000:01:00.0", VendorID: 0x10de, DeviceID: 0x2204, Class: 0x030000}
	nvidia3D := agentapi.PCIDevice{Address: "0000:02:00.0", VendorID: 0x10de, DeviceID: 0x20b0, Class: 0x030200}
	nvAudio := agentapi.PCIDevice{Address: "0000:01:00.1", VendorID: 0x10de, DeviceID: 0x1aef, Class: 0x040300}
	worker := &store.Claim{Image: "img-rel", Cluster: &store.ClusterSpec{Role: "worker"}}
	for _, tc := range []struct {
		name   string
		claim  *store.Claim
		inv    agentapi.Inventory
		want   []string
		reason map[string]string // substring of the reason, chosen or skipped
	}{
		{"plain worker, no GPU", worker, agentapi.Inventory{PCI: []agentapi.PCIDevice{vga}, CPUFlags: []string{"sse2"}},
			[]string{"base"}, map[string]string{"gpu": "no PCI device of vendor 10de", "secure-runtime": "neither vmx nor svm", "control-plane": "role worker"}},
		{"GPU present", worker, agentapi.Inventory{PCI: []agentapi.PCIDevice{vga, nvidia}},
			[]string{"base", "gpu"}, map[string]string{"gpu": "0000:01:00.0 10de:2204 class 0x030000"}},
		{"NVIDIA 3D controller", worker, agentapi.Inventory{PCI: []agentapi.PCIDevice{nvidia3D}},
			[]string{"base", "gpu"}, map[string]string{"gpu": "class 0x030200"}},
		{"NVIDIA audio only is no GPU", worker, agentapi.Inventory{PCI: []agentapi.PCIDevice{nvAudio}},
			[]string{"base"}, map[string]string{"gpu": "among 1"}},
		{"not inspected for PCI", worker, agentapi.Inventory{}, []string{"base"},
			map[string]string{"gpu": "no PCI devices in the inspection", "secure-runtime": "no CPU flags"}},
		{"control-plane claim", &store.Claim{Image: "img-rel", Cluster: &store.ClusterSpec{Role: "control-plane"}}, agentapi.Inventory{},
			[]string{"base", "control-plane"}, map[string]string{"control-plane": "cluster role control-plane"}},
		{"init claim", &store.Claim{Image: "img-rel", Cluster: &store.ClusterSpec{Role: "init"}}, agentapi.Inventory{},
			[]string{"base", "control-plane"}, map[string]string{"control-plane": "cluster role init"}},
		{"claim role without cluster block", &store.Claim{Image: "img-rel", Role: "control-plane"}, agentapi.Inventory{},
			[]string{"base", "control-plane"}, map[string]string{"control-plane": "claim role control-plane"}},
		{"vmx", worker, agentapi.Inventory{CPUFlags: []string{"fpu", "VMX", "sse2"}}, []string{"base", "secure-runtime"},
			map[string]string{"secure-runtime": "cpu flag vmx"}},
		{"svm", worker, agentapi.Inventory{CPUFlags: []string{"svm"}}, []string{"base", "secure-runtime"},
			map[string]string{"secure-runtime": "cpu flag svm"}},
		{"everything", &store.Claim{Image: "img-rel", Cluster: &store.ClusterSpec{Role: "control-plane"}},
			agentapi.Inventory{PCI: []agentapi.PCIDevice{nvidia}, CPUFlags: []string{"vmx"}},
			[]string{"base", "control-plane", "gpu", "secure-runtime"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hw := hardwareFrom(tc.inv)
			m := store.Machine{Claim: tc.claim, Discovered: &hw}
			chosen, skipped := chooseLayers(rel, m)
			var names []string
			for _, l := range chosen {
				names = append(names, l.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("chosen %v, want %v", names, tc.want)
			}
			if len(chosen)+len(skipped) != len(rel.Layers) {
				t.Fatalf("chosen %d + skipped %d != %d layers", len(chosen), len(skipped), len(rel.Layers))
			}
			for _, l := range append(chosen, skipped...) {
				if l.Reason == "" {
					t.Fatalf("layer %s without a reason", l.Name)
				}
				if want, ok := tc.reason[l.Name]; ok && !strings.Contains(l.Reason, want) {
					t.Errorf("layer %s reason %q, want it to contain %q", l.Name, l.Reason, want)
				}
			}
			if chosen[0].Name != "base" || chosen[0].Reason != "always" {
				t.Fatalf("base first, always: %+v", chosen[0])
			}
		})
	}
}
