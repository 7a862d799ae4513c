package inventory

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kiln/api/agentapi"
)

// sysfsTree materialises testdata/NAME.sysfs (lines "relative/path<TAB>first line",
// copied from a real /sys; the file names hold ':' so they live in a listing, not
// in the repository tree) below a new root.
func sysfsTree(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".sysfs"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		p, v, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		write(t, root, p, v)
	}
	return root
}

func TestPCIHost(t *testing.T) {
	root := sysfsTree(t, "host")
	got, err := PCI(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 {
		t.Fatalf("got %d devices: %+v", len(got), got)
	}
	want0 := agentapi.PCIDevice{Address: "0000:00:00.0", VendorID: 0x8086, DeviceID: 0x0d57, Class: 0x060000}
	want3 := agentapi.PCIDevice{Address: "0000:00:03.0", VendorID: 0x1af4, DeviceID: 0x1041, Class: 0x020000}
	if got[0] != want0 || got[3] != want3 {
		t.Errorf("got %+v", got)
	}
}

func TestPCIGPUAndTPM(t *testing.T) {
	root := sysfsTree(t, "gpu")
	if err := os.MkdirAll(filepath.Join(root, "sys/class/tpm/tpmrm0"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := PCI(root)
	if err != nil {
		t.Fatal(err)
	}
	gpu := agentapi.PCIDevice{Address: "0000:3b:00.0", VendorID: 0x10de, DeviceID: 0x1eb8, Class: 0x030200}
	if len(got) != 2 || got[1] != gpu {
		t.Errorf("got %+v", got)
	}
	if got[1].Class>>16 != 0x03 {
		t.Errorf("base class of %x", got[1].Class)
	}
	if tpm := TPM(root); tpm == nil || tpm.Version != "2.0" {
		t.Errorf("tpm %+v", tpm)
	}
	// An unparsable entry is skipped, not fatal.
	write(t, root, "sys/bus/pci/devices/0000:3c:00.0/vendor", "garbage")
	if got, _ := PCI(root); len(got) != 2 {
		t.Errorf("got %+v", got)
	}
}

func TestNoPCINoTPM(t *testing.T) {
	root := t.TempDir()
	if got, err := PCI(root); err != nil || got != nil {
		t.Errorf("PCI on an empty root: %v %v", got, err)
	}
	if tpm := TPM(root); tpm != nil {
		t.Errorf("TPM on an empty root: %+v", tpm)
	}
	if f := CPUFlags(root); f != nil {
		t.Errorf("flags on an empty root: %v", f)
	}
}

func TestTPM12Caps(t *testing.T) {
	b, err := os.ReadFile("testdata/tpm12-caps.txt")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	write(t, root, "sys/class/tpm/tpm0/device/caps", string(b))
	tpm := TPM(root)
	if tpm == nil || tpm.Version != "1.2" || tpm.Manufacturer != "IFX" {
		t.Errorf("tpm %+v", tpm)
	}
}

func TestCPUFlags(t *testing.T) {
	for _, c := range []struct {
		file     string
		has, not []string
	}{
		{"cpuinfo-host-xeon.txt", []string{"aes", "avx2", "sha_ni", "sse2"}, []string{"vmx", "svm"}},
		{"cpuinfo-amd-epyc.txt", []string{"svm", "sha_ni", "npt"}, []string{"vmx", "sysret_ss_attrs"}},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		flags := ParseCPUFlags(bytes.NewReader(b))
		if !slices.IsSorted(flags) || len(flags) < 50 {
			t.Errorf("%s: %d flags, sorted %v", c.file, len(flags), slices.IsSorted(flags))
		}
		for _, f := range c.has {
			if !slices.Contains(flags, f) {
				t.Errorf("%s lacks %s", c.file, f)
			}
		}
		for _, f := range c.not {
			if slices.Contains(flags, f) {
				t.Errorf("%s has %s", c.file, f)
			}
		}
		root := t.TempDir()
		write(t, root, "proc/cpuinfo", string(b))
		if !slices.Equal(CPUFlags(root), flags) {
			t.Errorf("CPUFlags(root) differs")
		}
	}
}

func TestParseHexID(t *testing.T) {
	for _, c := range []struct {
		in   string
		bits int
		want uint64
		ok   bool
	}{
		{"0x10de\n", 16, 0x10de, true}, {"0x030200", 24, 0x030200, true}, {"0xffff00", 24, 0xffff00, true},
		{"0x10de0", 16, 0, false}, {"10de", 16, 0, false}, {"0x", 16, 0, false}, {"0x-1", 16, 0, false},
		{"0x+1", 16, 0, false}, {"0x1000000", 24, 0, false},
	} {
		got, err := ParseHexID(c.in, c.bits)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseHexID(%q, %d) = %x, %v", c.in, c.bits, got, err)
		}
	}
	if VendorString(0x49424d00) != "IBM" || VendorString(0x494e5443) != "INTC" || VendorString(0x01020304) != "" {
		t.Error("VendorString")
	}
}

func FuzzParseCPUFlags(f *testing.F) {
	for _, n := range []string{"cpuinfo-host-xeon.txt", "cpuinfo-amd-epyc.txt"} {
		b, _ := os.ReadFile(filepath.Join("testdata", n))
		f.Add(b)
	}
	f.Add([]byte("flags: a b a\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		flags := ParseCPUFlags(bytes.NewReader(b))
		if !slices.IsSorted(flags) {
			t.Fatalf("unsorted %v", flags)
		}
		for i, w := range flags {
			if w == "" || strings.ContainsAny(w, " \t\n") || (i > 0 && flags[i-1] == w) {
				t.Fatalf("bad flag %q in %v", w, flags)
			}
		}
	})
}

func FuzzParseHexID(f *testing.F) {
	for _, s := range []string{"0x10de\n", "0x030200", "0x", "0xzz", "  0x1 "} {
		f.Add(s, 16)
		f.Add(s, 24)
	}
	f.Fuzz(func(t *testing.T, s string, bits int) {
		if bits <= 0 || bits > 64 {
			return
		}
		v, err := ParseHexID(s, bits)
		if err == nil && bits < 64 && v>>bits != 0 {
			t.Fatalf("%q: %x exceeds %d bits", s, v, bits)
		}
	})
}

func FuzzParseTPMCaps(f *testing.F) {
	b, _ := os.ReadFile("testdata/tpm12-caps.txt")
	f.Add(b)
	f.Add([]byte("Manufacturer: 0x00000001\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		man, _ := ParseTPMCaps(b)
		if len(man) > 64 {
			t.Fatalf("manufacturer %q", man)
		}
	})
}
