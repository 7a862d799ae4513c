package bmc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// sdrStatus maps the status column of "ipmitool sdr elist" (ipmitool's reading of the
// threshold comparison bits, IPMI 2.0 §35.14 Get Sensor Reading byte 3) to a health.
var sdrStatus = map[string]HealthState{
	"ok": HealthOK, "ns": HealthOK, // ns: no reading (sensor absent or scanning off)
	"nc": HealthWarning, "lnc": HealthWarning, "unc": HealthWarning,
	"cr": HealthCritical, "lcr": HealthCritical, "ucr": HealthCritical,
	"nr": HealthCritical, "lnr": HealthCritical, "unr": HealthCritical,
}

// sensorReading is one row of "ipmitool sdr elist": Name | ID | status | entity | reading.
type sensorReading struct {
	Name, Status, Reading string
	Health                HealthState
}

// sdrEmptyLines are what ipmitool 1.8.19 prints on stdout (exit status 0) for a BMC
// whose SDR repository holds no record.
var sdrEmptyLines = map[string]bool{"SDRR successfully erased": true, "Err in cmd get sensor sdr info": true}

// parseSDRElist strictly parses "ipmitool sdr elist" output: every non-blank line has
// five "|"-separated fields and a status from sdrStatus; anything else is ErrBadAnswer
// (except sdrEmptyLines).
func parseSDRElist(out string) ([]sensorReading, error) {
	var rs []sensorReading
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || sdrEmptyLines[l] {
			continue
		}
		f := strings.Split(l, "|")
		if len(f) != 5 {
			return nil, fmt.Errorf("%w: sdr elist line %d: %d fields, want 5", ErrBadAnswer, n, len(f))
		}
		st := strings.TrimSpace(f[2])
		h, ok := sdrStatus[st]
		if !ok {
			return nil, fmt.Errorf("%w: sdr elist line %d: status %.12q", ErrBadAnswer, n, st)
		}
		rs = append(rs, sensorReading{Name: clip(f[0], 64), Status: st, Reading: clip(f[4], 64), Health: h})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: sdr elist: %v", ErrBadAnswer, err)
	}
	return rs, nil
}

// selEntry is one record of "ipmitool sel elist":
// ID | date | time | sensor | event | Asserted/Deasserted [| detail].
type selEntry struct {
	ID, Sensor, Event, Detail string
	Asserted                  bool
	Time                      time.Time // zero for "Pre-Init" or an unparsed date
	Severity                  HealthState
}

// selCritical and selWarning are the event texts (ipmitool's names for IPMI 2.0
// Table 42-2 generic threshold offsets and Table 42-3 sensor-specific offsets) whose
// assertion means a critical condition, or one needing attention.
var (
	selCritical = []string{
		"Upper Critical going high", "Upper Non-recoverable going high",
		"Lower Critical going low", "Lower Non-recoverable going low",
		"IERR", "Thermal Trip", "FRB1/BIST failure", "FRB2/Hang in POST failure",
		"FRB3/Processor startup/init failure", "Configuration Error",
		"Uncorrectable machine check exception", "Uncorrectable ECC", "Parity",
		"Memory Scrub Error", "Memory Device Disabled", "Failure detected",
		"Soft-power control failure", "PCI PERR", "PCI SERR", "Bus Uncorrectable error",
		"Bus Fatal Error", "Drive Fault", "Critical Overtemperature",
	}
	selWarning = []string{
		"Upper Non-critical going high", "Lower Non-critical going low",
		"Correctable ECC", "Correctable ECC logging limit reached", "Predictive failure",
		"Power Supply AC lost", "AC lost", "Bus Correctable error", "Bus Degraded",
		"System Firmware Error", "Hard reset", "Power cycle", "Correctable machine check error",
	}
)

// selSeverity classifies a SEL event text: Critical, Warning or OK (not health-relevant).
func selSeverity(event string) HealthState {
	for _, c := range selCritical {
		if strings.EqualFold(event, c) {
			return HealthCritical
		}
	}
	for _, w := range selWarning {
		if strings.EqualFold(event, w) {
			return HealthWarning
		}
	}
	return HealthOK
}

// parseSELTime reads ipmitool's date and time columns; "Pre-Init" (a timestamp from
// before the BMC's clock was set, IPMI 2.0 §37.1) and unknown layouts give zero.
func parseSELTime(date, clock string) time.Time {
	s := date + " " + clock
	for _, layout := range []string{"01/02/2006 15:04:05", "01/02/2006 03:04:05 PM", "01/02/06 15:04:05",
		"01/02/2006 15:04:05 MST", "01/02/2006 03:04:05 PM MST"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// parseSELElist parses "ipmitool sel elist" output, oldest first. "SEL has no entries"
// is an empty log. Every other non-blank line must start with a hexadecimal record ID
// and a "|" (else ErrBadAnswer); records of fewer than six fields (OEM records) and
// events without an Asserted/Deasserted direction are kept with Severity OK.
func parseSELElist(out string) ([]selEntry, error) {
	var es []selEntry
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l == "SEL has no entries" {
			continue
		}
		f := strings.Split(l, "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if _, err := strconv.ParseUint(f[0], 16, 16); len(f) < 2 || err != nil {
			return nil, fmt.Errorf("%w: sel elist line %d: no record ID", ErrBadAnswer, n)
		}
		e := selEntry{ID: f[0], Severity: HealthOK}
		if len(f) >= 6 {
			e.Time = parseSELTime(f[1], f[2])
			e.Sensor, e.Event = clip(f[3], 64), clip(f[4], 64)
			if len(f) > 6 {
				e.Detail = clip(strings.Join(f[6:], " | "), 128)
			}
			switch f[5] {
			case "Asserted":
				e.Asserted, e.Severity = true, selSeverity(f[4])
			case "Deasserted":
				e.Severity = selSeverity(f[4])
			}
		}
		es = append(es, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: sel elist: %v", ErrBadAnswer, err)
	}
	return es, nil
}

// selHealth is the system health the SEL implies — the worst severity among events
// whose last record (for that sensor and event) is an assertion — and the SEL's
// Warning/Critical records as events, newest first.
func selHealth(es []selEntry) (HealthState, []HealthEvent) {
	last := map[string]selEntry{}
	var events []HealthEvent
	for _, e := range es {
		if e.Severity == HealthOK {
			continue
		}
		last[e.Sensor+"\x00"+e.Event] = e
		dir := "Deasserted"
		if e.Asserted {
			dir = "Asserted"
		}
		msg := e.Sensor + " " + e.Event + " " + dir
		if e.Detail != "" {
			msg += " (" + e.Detail + ")"
		}
		events = append(events, HealthEvent{Time: e.Time, Source: "sel", Severity: e.Severity, Message: msg, ID: e.ID})
	}
	h := HealthOK
	for _, e := range last {
		if e.Asserted {
			h = worse(h, e.Severity)
		}
	}
	// the SEL is in record order: newest last
	for i, j := 0, len(events)-1; i < j; i, j = i+1, j-1 {
		events[i], events[j] = events[j], events[i]
	}
	return h, events
}

// ipmitoolStdout runs ipmitool like ipmitool() but returns stdout alone, so a warning
// on stderr cannot be read as data; a failure carries stderr.
func (d *ipmiDriver) ipmitoolStdout(ctx context.Context, args ...string) (string, error) {
	base := []string{"-I", "lanplus", "-H", d.host, "-p", strconv.Itoa(d.port), "-U", d.t.Username, "-E",
		"-C", d.c.cfg.IPMICipherSuite}
	cmd := exec.CommandContext(ctx, d.path, append(base, args...)...)
	cmd.Env = []string{"IPMITOOL_PASSWORD=" + d.t.Password}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", d.diagnose(ctx, fmt.Errorf("ipmitool %s: %v: %s", strings.Join(args, " "), err, stderr.String()))
	}
	return stdout.String(), nil
}

func (d *ipmiDriver) health(ctx context.Context) (Health, error) {
	out, err := d.ipmitoolStdout(ctx, "-N", "5", "sdr", "elist")
	if err != nil {
		return Health{}, err
	}
	sensors, err := parseSDRElist(out)
	if err != nil {
		return Health{}, err
	}
	if len(sensors) == 0 {
		return Health{}, fmt.Errorf("%w: the BMC's SDR repository lists no sensor", ErrUnsupported)
	}
	out, err = d.ipmitoolStdout(ctx, "-N", "5", "sel", "elist")
	if err != nil {
		return Health{}, err
	}
	sel, err := parseSELElist(out)
	if err != nil {
		return Health{}, err
	}
	sys, events := selHealth(sel)
	var sensorEvents []HealthEvent
	for _, s := range sensors {
		sys = worse(sys, s.Health)
		if s.Health == HealthWarning || s.Health == HealthCritical {
			sensorEvents = append(sensorEvents, HealthEvent{Source: "sensor", Severity: s.Health,
				Message: s.Name + " " + s.Status + ": " + s.Reading, ID: s.Name})
		}
	}
	// current sensor states first (undated), then the SEL, newest first
	ev := append(sensorEvents, events...)
	if len(ev) > MaxHealthEvents {
		ev = ev[:MaxHealthEvents]
	}
	return Health{System: sys, Events: ev}, nil
}
