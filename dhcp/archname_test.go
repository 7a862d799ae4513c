package dhcp

import "testing"

// TestArchName pins the one table of option 93 names (RFC 4578 §2.1, IANA
// registry): every value Kiln boots has its own word, 7 and 9 are both x64
// UEFI, and anything else is "other".
func TestArchName(t *testing.T) {
	for a, want := range map[uint16]string{
		ArchBIOS: "bios", ArchEFIIA32: "efi_ia32", ArchEFIx64: "efi_x64", ArchEFIBC: "efi_x64",
		ArchEFIARM64: "efi_arm64", ArchHTTPx64: "http_x64", ArchHTTPARM64: "http_arm64", ArchNone: "none",
		1: "other", 10: "other", 0x1234: "other",
	} {
		if got := ArchName(a); got != want {
			t.Errorf("ArchName(%d) = %q, want %q", a, got, want)
		}
	}
}
