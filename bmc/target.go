package bmc

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
)

// Driver names accepted in Target.Driver.
const (
	DriverRedfish = "redfish" // DMTF Redfish over HTTPS (bmclib provider "gofish")
	DriverIPMI    = "ipmi"    // IPMI 2.0 lanplus via ipmitool (bmclib provider "ipmitool")
	DriverAuto    = "auto"    // Redfish if the address answers /redfish/v1, else IPMI
)

// Default ports when Target.Address carries none.
const (
	DefaultRedfishPort = 443
	DefaultIPMIPort    = 623
)

// Target identifies one BMC and how to talk to it. Password is a secret: it is omitted
// from JSON and redacted by String, GoString and LogValue.
type Target struct {
	// Address is "host", "host:port" or "https://host[:port]" (IPv6 hosts in brackets).
	Address string
	// Driver is "redfish", "ipmi" or "auto" ("" means "auto").
	Driver string
	// Username and Password authenticate to the BMC.
	Username string
	Password string `json:"-"`
	// InsecureTLS disables certificate verification (Redfish); off by default.
	InsecureTLS bool
	// CACertPEM, when set, is the only trust root for the BMC's certificate.
	CACertPEM []byte
}

// String renders the target without its password.
func (t Target) String() string {
	pw := ""
	if t.Password != "" {
		pw = "[REDACTED]"
	}
	return fmt.Sprintf("bmc.Target{Address:%q Driver:%q Username:%q Password:%q InsecureTLS:%t CA:%d bytes}",
		t.Address, t.Driver, t.Username, pw, t.InsecureTLS, len(t.CACertPEM))
}

// GoString is String, so %#v does not print the password either.
func (t Target) GoString() string { return t.String() }

// Format makes every fmt verb (%v, %+v, %s, %#v) print String.
func (t Target) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(t.String())) }

// LogValue implements slog.LogValuer without the password.
func (t Target) LogValue() slog.Value {
	return slog.GroupValue(slog.String("address", t.Address), slog.String("driver", t.Driver),
		slog.String("username", t.Username))
}

// PowerState is a machine's power state as reported by its BMC: "on" or "off".
type PowerState string

// Power states.
const (
	PowerOn  PowerState = "on"
	PowerOff PowerState = "off"
)

// PowerAction is a power command. Redfish ResetType mapping (DSP2046 ComputerSystem.Reset):
// on=On, off=ForceOff, soft_off=GracefulShutdown, cycle=ForceRestart (On when off),
// reset=PowerCycle; IPMI: chassis power on|off|soft|cycle|reset.
type PowerAction string

// Power actions.
const (
	ActionOn      PowerAction = "on"
	ActionOff     PowerAction = "off"
	ActionSoftOff PowerAction = "soft_off"
	ActionCycle   PowerAction = "cycle"
	ActionReset   PowerAction = "reset"
)

// BootMode is the firmware mode for the next boot: "uefi" or "legacy".
type BootMode string

// Boot modes.
const (
	BootUEFI   BootMode = "uefi"
	BootLegacy BootMode = "legacy"
)

// Inventory is what a BMC reports about its machine. Empty fields mean "not offered".
type Inventory struct {
	Serial       string   // ComputerSystem.SerialNumber
	Manufacturer string   // ComputerSystem.Manufacturer
	Model        string   // ComputerSystem.Model
	UUID         string   // ComputerSystem.UUID
	NICMACs      []string // EthernetInterface.MACAddress, lower-case aa:bb:cc:dd:ee:ff, sorted
}

// endpoint splits Address into host and port (default port given).
func (t Target) endpoint(defPort int) (host string, port int, err error) {
	a := strings.TrimSpace(t.Address)
	a = strings.TrimPrefix(strings.TrimPrefix(a, "https://"), "http://")
	a = strings.TrimSuffix(a, "/")
	if a == "" || strings.ContainsAny(a, "/?#@ ") {
		return "", 0, fmt.Errorf("%w: address %q", ErrInvalidTarget, t.Address)
	}
	if h, p, e := net.SplitHostPort(a); e == nil {
		n, perr := strconv.Atoi(p)
		if perr != nil || n <= 0 || n > 65535 || h == "" {
			return "", 0, fmt.Errorf("%w: address %q", ErrInvalidTarget, t.Address)
		}
		return h, n, nil
	}
	return strings.Trim(a, "[]"), defPort, nil
}
