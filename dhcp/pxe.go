package dhcp

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Option codes the package reads or writes that dhcpv4 has no helper for.
const (
	optUserClass      = 77  // RFC 3004
	optIPXEEncap      = 175 // iPXE encapsulated options
	optClientArch     = 93  // RFC 4578 §2.1
	optClientMachine  = 97  // RFC 4578 §2.3 (UUID/GUID)
	optVendorSpecific = 43  // RFC 2132 §8.4, PXE spec 2.1 vendor options
	optRelayAgentInfo = 82  // RFC 3046
)

// client is what the handler learns about the asking machine.
type client struct {
	mac     net.HardwareAddr
	arch    uint16 // ArchNone when option 93 is absent
	vendor  string // option 60
	pxe     bool   // option 60 starts with PXEClient
	http    bool   // UEFI HTTP boot: option 60 HTTPClient or arch 16/19
	ipxe    bool   // iPXE second pass (option 77 "iPXE" or option 175)
	known   bool
	machine MachineInfo
}

// classify reads options 60, 77, 93 and 175 (RFC 4578, RFC 3004, PXE 2.1).
func classify(req *dhcpv4.DHCPv4) client {
	c := client{mac: req.ClientHWAddr, arch: ArchNone}
	if a := req.Options.Get(dhcpv4.GenericOptionCode(optClientArch)); len(a) >= 2 {
		c.arch = binary.BigEndian.Uint16(a[:2])
	}
	c.vendor = string(req.Options.Get(dhcpv4.OptionClassIdentifier))
	c.pxe = strings.HasPrefix(c.vendor, "PXEClient")
	c.http = strings.HasPrefix(c.vendor, "HTTPClient") || c.arch == ArchHTTPx64 || c.arch == ArchHTTPARM64
	c.ipxe = req.Options.Has(dhcpv4.GenericOptionCode(optIPXEEncap)) || isIPXEUserClass(req.Options.Get(dhcpv4.GenericOptionCode(optUserClass)))
	return c
}

// isIPXEUserClass accepts option 77 as the raw string "iPXE" (what iPXE
// sends) or as a well-formed RFC 3004 §2 list of length-prefixed instances
// (each of length ≥ 1, together filling the option), one of them "iPXE". A
// malformed list is not read at all, even when an "iPXE" instance precedes
// the fault.
func isIPXEUserClass(b []byte) bool {
	if bytes.Equal(b, []byte("iPXE")) {
		return true
	}
	found := false
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || 1+n > len(b) {
			return false
		}
		found = found || bytes.Equal(b[1:1+n], []byte("iPXE"))
		b = b[1+n:]
	}
	return found
}

// archLabel is ArchName, the metric label of an option 93 value.
func archLabel(a uint16) string { return ArchName(a) }

// ArchName names a client system architecture type (option 93, RFC 4578
// §2.1 and the IANA "Processor Architecture Types" registry, which names 7
// x64 UEFI and 9 EBC, RFC 4578's erratum) with a short word that is a
// valid label value and metric label: "bios" (0, Intel x86PC), "efi_ia32"
// (6), "efi_x64" (7 and 9, which x64 firmware sends), "efi_arm64" (11),
// "http_x64" (16, x64 UEFI boot from HTTP), "http_arm64" (19), "none"
// (ArchNone: option 93 absent) and "other" for any other value. The one
// table of these names: the metric labels of this package and the
// appliance's kiln.io/arch label of discovered machines both use it.
func ArchName(a uint16) string {
	switch a {
	case ArchBIOS:
		return "bios"
	case ArchEFIIA32:
		return "efi_ia32"
	case ArchEFIx64, ArchEFIBC:
		return "efi_x64"
	case ArchEFIARM64:
		return "efi_arm64"
	case ArchHTTPx64:
		return "http_x64"
	case ArchHTTPARM64:
		return "http_arm64"
	case ArchNone:
		return "none"
	}
	return "other"
}

// boot is the first-stage (or second-pass) answer for a client.
type boot struct {
	file string // BOOTP file and option 67
	http bool   // answer with option 60 HTTPClient
	pxe  bool   // answer with option 60 PXEClient and option 43
}

// bootFor applies the boot-file rules (DESIGN "Boot flow"):
//   - unknown MAC and !BootUnknown, or Netboot=false: no boot file;
//   - iPXE second pass: MachineInfo.ScriptURL or {HTTPBootURL}/ipxe/{mac};
//   - UEFI HTTP boot: {HTTPBootURL}/{override|HTTPBootFiles[arch]|HTTPBootFiles[16]};
//   - PXE/TFTP: override or TFTPBootFiles[arch]; unknown arch: none.
func (s *Server) bootFor(c *client) (boot, bool) {
	if (c.known && !c.machine.Netboot) || (!c.known && !s.cfg.BootUnknown) {
		return boot{}, false
	}
	if c.ipxe {
		if c.known && c.machine.ScriptURL != "" {
			return boot{file: c.machine.ScriptURL, pxe: c.pxe}, true
		}
		if s.cfg.HTTPBootURL == "" {
			return boot{}, false
		}
		return boot{file: s.cfg.HTTPBootURL + "/ipxe/" + strings.ToLower(c.mac.String()), pxe: c.pxe}, true
	}
	if c.http {
		if s.cfg.HTTPBootURL == "" {
			return boot{}, false
		}
		f := c.machine.BootOverride
		if f == "" {
			f = s.cfg.HTTPBootFiles[c.arch]
		}
		if f == "" {
			f = s.cfg.HTTPBootFiles[ArchHTTPx64]
		}
		if f == "" {
			return boot{}, false
		}
		return boot{file: s.cfg.HTTPBootURL + "/" + f, http: true}, true
	}
	if !c.pxe && c.arch == ArchNone {
		return boot{}, false // a plain DHCP client (an OS, dhclient): no boot file
	}
	f := c.machine.BootOverride
	if f == "" {
		f = s.cfg.TFTPBootFiles[c.arch]
	}
	if f == "" {
		return boot{}, false
	}
	return boot{file: f, pxe: c.pxe}, true
}
