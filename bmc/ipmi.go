package bmc

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/go-logr/logr"
)

type ipmiDriver struct {
	c    *Controller
	t    Target
	host string
	port int
	path string
	bl   *bmclib.Client
}

func newIPMIDriver(c *Controller, t Target) (*ipmiDriver, error) {
	host, port, err := t.endpoint(DefaultIPMIPort)
	if err != nil {
		return nil, err
	}
	path := c.cfg.IpmitoolPath
	if path == "" {
		if path, err = exec.LookPath("ipmitool"); err != nil {
			return nil, fmt.Errorf("%w: ipmitool not installed", ErrUnsupported)
		}
	}
	return &ipmiDriver{c: c, t: t, host: host, port: port, path: path}, nil
}

// client opens bmclib restricted to its ipmitool provider. The password reaches ipmitool
// through the IPMITOOL_PASSWORD environment variable (-E), never argv.
func (d *ipmiDriver) client(ctx context.Context) (*bmclib.Client, error) {
	if d.bl != nil {
		return d.bl, nil
	}
	cl := bmclib.NewClient(d.host, d.t.Username, d.t.Password,
		bmclib.WithLogger(logr.Discard()),
		bmclib.WithIpmitoolPort(strconv.Itoa(d.port)),
		bmclib.WithIpmitoolCipherSuite(d.c.cfg.IPMICipherSuite),
		bmclib.WithIpmitoolPath(d.path),
		bmclib.WithPerProviderTimeout(remaining(ctx, d.c.cfg.CallTimeout)),
	)
	if err := cl.For("ipmitool").Open(ctx); err != nil {
		return nil, d.diagnose(ctx, err)
	}
	d.bl = cl
	return cl, nil
}

// diagnose tells a refused login from an absent BMC. ipmitool prints the same
// "Unable to establish IPMI v2 / RMCP+ session" for both; with -v it adds the RAKP
// failure (wrong password: "RAKP 2 HMAC is invalid"; unknown user: "unauthorized name")
// when a BMC answered, and "Get Auth Capabilities error" when none did.
func (d *ipmiDriver) diagnose(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "Unable to establish IPMI v2") {
		return err
	}
	out, _ := d.ipmitool(ctx, "-v", "-N", "2", "-R", "1", "chassis", "power", "status")
	low := strings.ToLower(out)
	switch {
	case strings.Contains(low, "rakp"), strings.Contains(low, "unauthorized"), strings.Contains(low, "hmac"):
		return fmt.Errorf("%w: BMC refused the session (RAKP)", ErrAuth)
	case strings.Contains(low, "auth capabilities error"), strings.Contains(low, "error issuing"):
		return fmt.Errorf("%w: no RMCP+ answer from %s:%d", ErrUnreachable, d.host, d.port)
	}
	return err
}

// ipmitool runs ipmitool with the target's session options before args; the password
// travels in the environment only.
func (d *ipmiDriver) ipmitool(ctx context.Context, args ...string) (string, error) {
	base := []string{"-I", "lanplus", "-H", d.host, "-p", strconv.Itoa(d.port), "-U", d.t.Username, "-E",
		"-C", d.c.cfg.IPMICipherSuite}
	cmd := exec.CommandContext(ctx, d.path, append(base, args...)...)
	cmd.Env = []string{"IPMITOOL_PASSWORD=" + d.t.Password}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (d *ipmiDriver) close() {}

// parseIPMIPower strictly parses "ipmitool chassis power status" output: exactly one
// non-empty line "Chassis Power is on" or "Chassis Power is off".
func parseIPMIPower(out string) (PowerState, error) {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 1 {
		switch lines[0] {
		case "Chassis Power is on":
			return PowerOn, nil
		case "Chassis Power is off":
			return PowerOff, nil
		}
	}
	s := strings.Join(lines, " | ")
	if len(s) > 80 {
		s = s[:80]
	}
	return "", fmt.Errorf("%w: power status %q", ErrBadAnswer, s)
}

func (d *ipmiDriver) powerState(ctx context.Context) (PowerState, error) {
	cl, err := d.client(ctx)
	if err != nil {
		return "", err
	}
	out, err := cl.For("ipmitool").GetPowerState(ctx)
	if err != nil {
		return "", d.diagnose(ctx, err)
	}
	return parseIPMIPower(out)
}

func (d *ipmiDriver) power(ctx context.Context, a PowerAction) error {
	cl, err := d.client(ctx)
	if err != nil {
		return err
	}
	state := map[PowerAction]string{ActionOn: "on", ActionOff: "off", ActionSoftOff: "soft",
		ActionCycle: "cycle", ActionReset: "reset"}[a]
	if state == "" {
		return fmt.Errorf("%w: action %q", ErrInvalidTarget, string(a))
	}
	ok, err := cl.For("ipmitool").SetPowerState(ctx, state)
	if err != nil {
		return d.diagnose(ctx, err)
	}
	if !ok {
		return fmt.Errorf("%w: power %s not acknowledged", ErrRejected, state)
	}
	return nil
}

// bootFlags is IPMI 2.0 §28.13 boot option parameter 5 (boot flags), data bytes 1-2.
type bootFlags struct {
	Valid      bool // byte 1 bit 7
	Persistent bool // byte 1 bit 6 (0 = next boot only)
	EFI        bool // byte 1 bit 5 (0 = PC compatible / legacy)
	Device     byte // byte 2 bits 5:2 boot device selector: 1 = force PXE
}

// parseBootParam5 strictly parses "ipmitool chassis bootparam get 5" output, reading the
// raw "Boot parameter data:" hex (5 bytes) rather than ipmitool's prose.
func parseBootParam5(out string) (bootFlags, error) {
	var data string
	n := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(l, "Boot parameter data:"); ok {
			data = strings.TrimSpace(v)
			n++
		}
	}
	if err := sc.Err(); err != nil { // e.g. a line over 64 KiB: the lines after it were not read
		return bootFlags{}, fmt.Errorf("%w: bootparam 5: %v", ErrBadAnswer, err)
	}
	if n != 1 {
		return bootFlags{}, fmt.Errorf("%w: bootparam 5: %d data lines", ErrBadAnswer, n)
	}
	b, err := hex.DecodeString(data)
	if err != nil || len(b) != 5 {
		if len(data) > 20 {
			data = data[:20]
		}
		return bootFlags{}, fmt.Errorf("%w: bootparam 5 data %q", ErrBadAnswer, data)
	}
	return bootFlags{Valid: b[0]&0x80 != 0, Persistent: b[0]&0x40 != 0, EFI: b[0]&0x20 != 0,
		Device: (b[1] >> 2) & 0x0f}, nil
}

func (d *ipmiDriver) readBootFlags(ctx context.Context) (bootFlags, error) {
	out, err := d.ipmitool(ctx, "-N", "5", "chassis", "bootparam", "get", "5")
	if err != nil {
		if ctx.Err() != nil {
			return bootFlags{}, ctx.Err()
		}
		return bootFlags{}, d.diagnose(ctx, fmt.Errorf("bootparam get 5: %v: %s", err, out))
	}
	return parseBootParam5(out)
}

func (d *ipmiDriver) setNextBootPXE(ctx context.Context, m BootMode) error {
	cl, err := d.client(ctx)
	if err != nil {
		return err
	}
	ok, err := cl.For("ipmitool").SetBootDevice(ctx, "pxe", false, m == BootUEFI)
	if err != nil {
		return d.diagnose(ctx, err)
	}
	if !ok {
		return fmt.Errorf("%w: bootdev pxe not acknowledged", ErrRejected)
	}
	got, err := d.readBootFlags(ctx)
	if err != nil {
		return err
	}
	want := bootFlags{Valid: true, Persistent: false, EFI: m == BootUEFI, Device: 1}
	if d.c.cfg.IPMIIgnoreValidBit {
		want.Valid = got.Valid
	}
	if got != want {
		return fmt.Errorf("%w: read back valid=%t persistent=%t efi=%t device=%d, want valid=true persistent=false efi=%t device=1 (PXE)",
			ErrBootNotApplied, got.Valid, got.Persistent, got.EFI, got.Device, want.EFI)
	}
	return nil
}

func (d *ipmiDriver) inventory(context.Context) (Inventory, error) {
	return Inventory{}, fmt.Errorf("%w: inventory over IPMI (FRU) is not implemented", ErrUnsupported)
}
