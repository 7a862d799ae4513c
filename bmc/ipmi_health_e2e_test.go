package bmc

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/deploy/lab/testreq"
)

// TestIPMIHealthAgainstIPMISim reads health from OpenIPMI's ipmi_sim (the lab BMC with its
// CPU Temp threshold sensor, deploy/lab/ipmi/sensors.emu.in): OK at 40 °C; Critical while
// the reading is above the upper critical threshold (sdr "ucr", SEL threshold assertions);
// OK again once it falls back (the SEL records the deassertions); Critical for an IERR added
// to the SEL (Add SEL Entry, IPMI 2.0 §31.6), which is never deasserted, until the SEL is
// cleared. A wrong password and an absent BMC are errors, never a health.
func TestIPMIHealthAgainstIPMISim(t *testing.T) {
	testreq.Root(t, "a network namespace and ipmi_sim", "ip", "ipmi_sim", "ipmitool")
	const user, pass = "kilnhealth", "Ipmi-Health-74x"
	lab := startIPMILab(t, user, pass, []string{"/bin/true"})
	reg := prometheus.NewRegistry()
	c, err := New(Config{CallTimeout: 15 * time.Second, BackoffBase: 200 * time.Millisecond, IPMICipherSuite: "3",
		IpmitoolPath: lab.wrapper}, reg)
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{Address: lab.addr, Driver: DriverIPMI, Username: user, Password: pass}
	ctx := context.Background()
	raw := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(lab.wrapper, append([]string{"-I", "lanplus", "-C", "3", "-H", lab.addr, "-U", user, "-E"}, args...)...)
		cmd.Env = []string{"IPMITOOL_PASSWORD=" + pass}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ipmitool %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	healthUntil := func(what string, ok func(Health) bool) Health {
		t.Helper()
		var h Health
		var err error
		end := time.Now().Add(15 * time.Second)
		for time.Now().Before(end) {
			if h, err = c.Health(ctx, tg); err == nil && ok(h) {
				return h
			}
			time.Sleep(300 * time.Millisecond)
		}
		t.Fatalf("waiting for %s: last health %+v, %v\nsdr: %s\nsel: %s", what, h, err, raw("sdr", "elist"), raw("sel", "elist"))
		return h
	}

	h := healthUntil("OK at 40 °C", func(h Health) bool { return h.System == HealthOK })
	if h.Chassis != HealthUnknown || len(h.Events) != 0 {
		t.Fatalf("at 40 °C: %+v; want OK, chassis unknown, no events", h)
	}
	if err := lab.bmc.SetCPUTemp(95); err != nil {
		t.Fatal(err)
	}
	h = healthUntil("Critical at 95 °C", func(h Health) bool { return h.System == HealthCritical && len(h.Events) >= 3 })
	if e := h.Events[0]; e.Source != "sensor" || e.Severity != HealthCritical || e.ID != "CPU Temp" || !strings.Contains(e.Message, "ucr") {
		t.Fatalf("first event %+v; want the CPU Temp sensor at ucr", e)
	}
	var sawUCR bool
	for _, e := range h.Events[1:] {
		if e.Source != "sel" {
			t.Fatalf("event after the sensors: %+v; want SEL records", e)
		}
		sawUCR = sawUCR || (e.Severity == HealthCritical && strings.Contains(e.Message, "Upper Critical going high Asserted"))
	}
	if !sawUCR {
		t.Fatalf("events %+v: no SEL upper-critical assertion", h.Events)
	}
	t.Logf("at 95 °C: %+v", h)

	if err := lab.bmc.SetCPUTemp(40); err != nil {
		t.Fatal(err)
	}
	h = healthUntil("OK after the reading falls back", func(h Health) bool { return h.System == HealthOK })
	if len(h.Events) < 4 || h.Events[0].Source != "sel" || !strings.Contains(h.Events[0].Message, "Deasserted") {
		t.Fatalf("after deassertion: %+v; want the SEL records, newest (a deassertion) first", h)
	}

	// an IERR (sensor type 07h processor, sensor-specific offset 00h), added as a system
	// event record: record ID 0000 (the BMC assigns it), type 02h, timestamp (the BMC's),
	// generator 0020h, EvM rev 04h, sensor type 07h, sensor 02h, event type 6Fh assertion,
	// data 00h ffh ffh
	raw("raw", "0x0a", "0x44", "0x00", "0x00", "0x02", "0x00", "0x00", "0x00", "0x00", "0x20", "0x00",
		"0x04", "0x07", "0x02", "0x6f", "0x00", "0xff", "0xff")
	h = healthUntil("Critical after an IERR", func(h Health) bool { return h.System == HealthCritical })
	if e := h.Events[0]; e.Source != "sel" || e.Severity != HealthCritical || !strings.Contains(e.Message, "IERR Asserted") {
		t.Fatalf("newest event %+v; want the IERR", e)
	}
	raw("sel", "clear")
	healthUntil("OK after sel clear", func(h Health) bool { return h.System == HealthOK && len(h.Events) == 0 })

	bad := tg
	bad.Password = "not-the-password"
	if h, err := c.Health(ctx, bad); !errors.Is(err, ErrAuth) || h.System != "" || strings.Contains(err.Error(), bad.Password) {
		t.Fatalf("wrong password: %+v, %v", h, err)
	}
	gone := tg
	gone.Address = "10.74.1.3"
	fast, _ := New(Config{CallTimeout: 3 * time.Second, NoRetries: true, IPMICipherSuite: "3", IpmitoolPath: lab.wrapper}, nil)
	if h, err := fast.Health(ctx, gone); (!errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrTimeout)) || h.System != "" {
		t.Fatalf("absent BMC: %+v, %v (reason %q)", h, err, Reason(err))
	}
}
