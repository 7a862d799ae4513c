package intake

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Errors of package intake. Row-level problems are reported as *ErrRows.
var (
	// ErrFormat: the format is not one of csv, json, netbox.
	ErrFormat = errors.New("intake: unknown format (want csv, json or netbox)")
	// ErrTooManyRows: the file holds more than MaxRows machines.
	ErrTooManyRows = errors.New("intake: too many rows")
	// ErrEmpty: the file holds no machine rows.
	ErrEmpty = errors.New("intake: no rows")
)

// Formats accepted by Parse.
const (
	FormatCSV    = "csv"
	FormatJSON   = "json"
	FormatNetBox = "netbox"
)

// Limits of one import file.
const (
	MaxRows      = 50000 // machines per file
	maxDisks     = 64    // disks per machine
	maxCPUs      = 65536 // logical CPUs per machine
	maxMemoryGiB = 1 << 20
	maxRackUnit  = rules.MaxRackUnit
)

// Row is one parsed machine with the 1-based line it started on.
type Row struct {
	Line    int
	Machine store.Machine
}

// Parse reads r in format (csv|json|netbox) and returns the machines it
// describes, each State registered with its intended fields, in file order.
// Errors: ErrFormat, ErrEmpty, ErrTooManyRows, *ErrRows (every bad row with
// line and field; no machines are returned then), or a read error.
func Parse(r io.Reader, format string) ([]store.Machine, error) {
	rows, err := ParseRows(r, format)
	if err != nil {
		return nil, err
	}
	out := make([]store.Machine, len(rows))
	for i := range rows {
		out[i] = rows[i].Machine
	}
	return out, nil
}

// ParseRows is Parse keeping each machine's line, so that the caller that
// checks rows against each other and against stored records (names,
// serials and MACs are unique across machines: store.ImportMachines) can
// report *ErrRows with lines too.
func ParseRows(r io.Reader, format string) ([]Row, error) {
	var raws []rawRow
	var errs []RowError
	var err error
	switch strings.ToLower(strings.TrimSpace(format)) {
	case FormatCSV, "":
		raws, errs, err = readCSV(r, false)
	case FormatNetBox:
		raws, errs, err = readCSV(r, true)
	case FormatJSON:
		raws, errs, err = readJSON(r)
	default:
		return nil, fmt.Errorf("%w: %q", ErrFormat, format)
	}
	if err != nil {
		return nil, err
	}
	if len(raws) > MaxRows {
		return nil, fmt.Errorf("%w: %d > %d", ErrTooManyRows, len(raws), MaxRows)
	}
	if len(raws) == 0 && len(errs) == 0 {
		return nil, ErrEmpty
	}
	rows := make([]Row, 0, len(raws))
	for _, raw := range raws {
		m, rerrs := raw.machine()
		errs = append(errs, rerrs...)
		if len(rerrs) > 0 {
			continue
		}
		rows = append(rows, Row{Line: raw.line, Machine: m})
	}
	if len(errs) > 0 {
		sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
		return nil, &ErrRows{Rows: errs}
	}
	return rows, nil
}

// rawRow is one row before validation: column → text, plus the typed
// values a JSON row may carry directly.
type rawRow struct {
	line   int
	vals   map[string]string
	macs   []string          // JSON array form of macs (nil: split vals["macs"])
	labels map[string]string // JSON object form of labels, or NetBox-derived labels
	netbox bool
}

// columns is Kiln's own column set.
var columns = []string{"name", "serial", "vendor", "model", "site", "rack", "u", "bmc_address", "bmc_mac",
	"macs", "cpus", "memory_gib", "disks", "boot_mode", "ipv4", "labels", "root_disk_serial",
	"root_disk_min_gib", "wipe"}

func isColumn(c string) bool {
	for _, k := range columns {
		if k == c {
			return true
		}
	}
	return false
}

// netboxColumns maps a normalised NetBox export header to a Kiln column, or
// to "label:KEY" for columns kept as labels.
var netboxColumns = map[string]string{
	"name":          "name",
	"serial":        "serial",
	"serial_number": "serial",
	"manufacturer":  "vendor",
	"device_type":   "model",
	"type":          "model",
	"site":          "site",
	"rack":          "rack",
	"position":      "u",
	"position_(u)":  "u",
	"primary_ipv4":  "ipv4",
	"primary_ip4":   "ipv4",
	"ipv4_address":  "ipv4",
	"asset_tag":     "label:asset_tag",
	"role":          "label:role",
	"device_role":   "label:role",
	"tenant":        "label:tenant",
	"location":      "label:location",
	"platform":      "label:platform",
	"status":        "label:netbox_status",
	"id":            "label:netbox_id",
}

func normHeader(h string) string {
	h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
	h = strings.ToLower(h)
	h = strings.Join(strings.Fields(h), "_")
	return h
}

func readCSV(r io.Reader, netbox bool) ([]rawRow, []RowError, error) {
	cr := csv.NewReader(bufio.NewReader(r))
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.Comment = '#'
	header, err := cr.Read()
	if err == io.EOF {
		return nil, nil, ErrEmpty
	}
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return nil, []RowError{{Line: pe.Line, Field: "", Msg: pe.Err.Error()}}, nil
		}
		return nil, nil, fmt.Errorf("intake: read header: %w", err)
	}
	headerLine, _ := cr.FieldPos(0)
	cols := make([]string, len(header))
	var errs []RowError
	seen := map[string]bool{}
	for i, h := range header {
		n := normHeader(h)
		if netbox {
			k, ok := netboxColumns[n]
			if !ok {
				cols[i] = "" // ignored column of the export
				continue
			}
			n = k
		} else if !isColumn(n) {
			errs = append(errs, RowError{headerLine, h, "unknown column (want one of " + strings.Join(columns, ", ") + ")"})
			continue
		}
		if seen[n] {
			errs = append(errs, RowError{headerLine, h, "column given twice"})
			continue
		}
		seen[n] = true
		cols[i] = n
	}
	if !seen["name"] {
		errs = append(errs, RowError{headerLine, "name", "missing required column"})
	}
	if !netbox && !seen["macs"] {
		errs = append(errs, RowError{headerLine, "macs", "missing required column"})
	}
	if len(errs) > 0 {
		return nil, errs, nil
	}
	var rows []rawRow
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				errs = append(errs, RowError{Line: pe.Line, Field: "", Msg: pe.Err.Error()})
				return rows, errs, nil // the reader cannot resynchronise after a quoting error
			}
			return nil, nil, fmt.Errorf("intake: read: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if len(rows) >= MaxRows {
			return nil, nil, fmt.Errorf("%w: more than %d", ErrTooManyRows, MaxRows)
		}
		if len(rec) != len(cols) {
			errs = append(errs, RowError{line, "", fmt.Sprintf("row has %d fields, header has %d", len(rec), len(cols))})
			continue
		}
		raw := rawRow{line: line, vals: map[string]string{}, netbox: netbox}
		for i, v := range rec {
			c := cols[i]
			v = strings.TrimSpace(v)
			if c == "" || v == "" {
				continue
			}
			if k, ok := strings.CutPrefix(c, "label:"); ok {
				if raw.labels == nil {
					raw.labels = map[string]string{}
				}
				raw.labels[k] = v
				continue
			}
			raw.vals[c] = v
		}
		rows = append(rows, raw)
	}
	return rows, errs, nil
}

func readJSON(r io.Reader) ([]rawRow, []RowError, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, nil, fmt.Errorf("intake: read: %w", err)
	}
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	lineAt := func(off int64) int {
		if off > int64(len(data)) {
			off = int64(len(data))
		}
		return 1 + bytes.Count(data[:off], []byte("\n"))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, nil, ErrEmpty
	}
	if err != nil {
		return nil, []RowError{{Line: lineAt(dec.InputOffset()), Msg: "invalid JSON: " + err.Error()}}, nil
	}
	// Accept {"machines": [...]} as well as a bare array.
	if d, ok := tok.(json.Delim); ok && d == '{' {
		key, err := dec.Token()
		if err != nil {
			return nil, []RowError{{Line: lineAt(dec.InputOffset()), Msg: "invalid JSON: " + err.Error()}}, nil
		}
		if k, _ := key.(string); k != "machines" {
			return nil, []RowError{{Line: lineAt(dec.InputOffset()), Field: fmt.Sprint(key), Msg: `want an array or {"machines": [...]}`}}, nil
		}
		if tok, err = dec.Token(); err != nil {
			return nil, []RowError{{Line: lineAt(dec.InputOffset()), Msg: "invalid JSON: " + err.Error()}}, nil
		}
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, []RowError{{Line: lineAt(dec.InputOffset()), Msg: `want an array of machines or {"machines": [...]}`}}, nil
	}
	var rows []rawRow
	var errs []RowError
	for dec.More() {
		// InputOffset is the end of the previous token; the element starts at
		// the first non-space byte after it (and after a separating comma).
		off := dec.InputOffset()
		for off < int64(len(data)) && (data[off] == ',' || unicode.IsSpace(rune(data[off]))) {
			off++
		}
		line := lineAt(off)
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				errs = append(errs, RowError{line, "", "each machine must be a JSON object"})
				continue
			}
			errs = append(errs, RowError{line, "", "invalid JSON: " + err.Error()})
			return rows, errs, nil
		}
		if len(rows) >= MaxRows {
			return nil, nil, fmt.Errorf("%w: more than %d", ErrTooManyRows, MaxRows)
		}
		raw := rawRow{line: line, vals: map[string]string{}}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := obj[k]
			if !isColumn(k) {
				errs = append(errs, RowError{line, k, "unknown field"})
				continue
			}
			switch x := v.(type) {
			case nil:
			case string:
				raw.vals[k] = strings.TrimSpace(x)
			case json.Number:
				raw.vals[k] = x.String()
			case bool:
				raw.vals[k] = strconv.FormatBool(x)
			case []any:
				if k != "macs" {
					errs = append(errs, RowError{line, k, "must not be an array"})
					continue
				}
				raw.macs = []string{}
				for _, e := range x {
					s, ok := e.(string)
					if !ok {
						errs = append(errs, RowError{line, k, "array elements must be strings"})
						break
					}
					raw.macs = append(raw.macs, s)
				}
			case map[string]any:
				if k != "labels" {
					errs = append(errs, RowError{line, k, "must not be an object"})
					continue
				}
				raw.labels = map[string]string{}
				for lk, lv := range x {
					s, ok := lv.(string)
					if !ok {
						errs = append(errs, RowError{line, k, fmt.Sprintf("label %q: value must be a string", lk)})
						continue
					}
					raw.labels[lk] = s
				}
			default:
				errs = append(errs, RowError{line, k, "unsupported JSON type"})
			}
		}
		rows = append(rows, raw)
	}
	if _, err := dec.Token(); err != nil {
		errs = append(errs, RowError{lineAt(dec.InputOffset()), "", "invalid JSON: " + err.Error()})
	}
	return rows, errs, nil
}

var diskRe = regexp.MustCompile(`^(?i)(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*([kmgtp]i?b|b)?$`)

// machine validates the row and builds its registered machine.
func (raw rawRow) machine() (store.Machine, []RowError) {
	var errs []RowError
	bad := func(field, format string, a ...any) {
		errs = append(errs, RowError{raw.line, field, fmt.Sprintf(format, a...)})
	}
	text := func(field string) string {
		v := raw.vals[field]
		if err := rules.CheckText(v, rules.MaxTextLen); err != nil {
			bad(field, "%v", err)
			return ""
		}
		return v
	}
	m := store.Machine{State: store.StateRegistered}
	m.Name = raw.vals["name"]
	if err := rules.CheckName(m.Name); err != nil {
		bad("name", "%v", err)
	}
	m.Intended.Serial = text("serial")
	m.Intended.Vendor = text("vendor")
	m.Intended.Model = text("model")
	m.Site = text("site")
	m.Rack = text("rack")
	if v := raw.vals["u"]; v != "" {
		f, err := strconv.ParseFloat(v, 64) // NetBox exports positions as "12.0"
		if err != nil || f < 1 || f > maxRackUnit || f != math.Trunc(f) {
			bad("u", "%q: want a whole rack unit 1..%d", v, maxRackUnit)
		} else {
			m.RackUnit = int(f)
		}
	}
	if v := raw.vals["bmc_address"]; v != "" {
		if err := rules.CheckHostPort(v); err != nil {
			bad("bmc_address", "%v", err)
		} else {
			m.Intended.BMCAddress = v
		}
	}
	if v := raw.vals["bmc_mac"]; v != "" {
		mac, err := store.ParseMachineMAC(v)
		if err != nil {
			bad("bmc_mac", "%v", err)
		}
		m.Intended.BMCMAC = mac
	}
	macs := raw.macs
	if macs == nil && raw.vals["macs"] != "" {
		macs = strings.Split(raw.vals["macs"], ";")
	}
	seen := map[string]bool{}
	for _, s := range macs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		mac, err := store.ParseMachineMAC(s)
		if err != nil {
			bad("macs", "%v", err)
			continue
		}
		if seen[mac] {
			bad("macs", "mac %s listed twice", mac)
			continue
		}
		seen[mac] = true
		m.Intended.NICs = append(m.Intended.NICs, store.NIC{MAC: mac})
	}
	if m.Intended.BMCMAC != "" && seen[m.Intended.BMCMAC] {
		bad("bmc_mac", "mac %s is also listed in macs (the BMC has its own NIC)", m.Intended.BMCMAC)
	}
	if len(m.Intended.NICs) == 0 && !raw.netbox && len(errs) == 0 {
		bad("macs", "at least one MAC is required")
	}
	if v := raw.vals["cpus"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxCPUs {
			bad("cpus", "%q: want a whole number 1..%d", v, maxCPUs)
		}
		m.Intended.CPUs = n
	}
	if v := raw.vals["memory_gib"]; v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f*(1<<30) >= 1) || f > maxMemoryGiB {
			bad("memory_gib", "%q: want a number of GiB of at least one byte", v)
		} else {
			m.Intended.MemoryBytes = uint64(f * (1 << 30))
		}
	}
	if v := raw.vals["disks"]; v != "" {
		d, err := parseDisks(v)
		if err != nil {
			bad("disks", "%q: %v", v, err)
		}
		m.Intended.Disks = d
	}
	switch v := strings.ToLower(raw.vals["boot_mode"]); v {
	case "":
	case "uefi", "efi":
		m.BootMode = store.BootModeUEFI
	case "legacy", "bios":
		m.BootMode = store.BootModeLegacy
	default:
		bad("boot_mode", "%q: want uefi or legacy", raw.vals["boot_mode"])
	}
	if v := raw.vals["ipv4"]; v != "" {
		addr := v
		if p, err := netip.ParsePrefix(v); err == nil { // NetBox writes 10.0.0.5/24
			addr = p.Addr().String()
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil || !ip.Is4() {
			bad("ipv4", "%q: want an IPv4 address", v)
		} else {
			m.IPv4 = ip.String()
		}
	}
	labels := map[string]string{}
	for k, v := range raw.labels {
		labels[k] = v
	}
	if v := raw.vals["labels"]; v != "" {
		for _, kv := range strings.Split(v, ";") {
			kv = strings.TrimSpace(kv)
			if kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				bad("labels", "%q: want key=value", kv)
				continue
			}
			labels[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
	}
	for k, v := range labels {
		if err := rules.CheckLabel(k, v); err != nil {
			bad("labels", "%v", err)
		}
	}
	if len(labels) > 0 {
		m.Labels = labels
	}
	m.RootDisk.Serial = text("root_disk_serial")
	if v := raw.vals["root_disk_min_gib"]; v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1<<30 {
			bad("root_disk_min_gib", "%q: want a number of GiB >= 0", v)
		} else {
			m.RootDisk.MinSizeBytes = uint64(f * (1 << 30))
		}
	}
	if v := raw.vals["wipe"]; v != "" {
		switch strings.ToLower(v) {
		case "true", "yes", "1", "y":
			m.Wipe = true
		case "false", "no", "0", "n":
		default:
			bad("wipe", "%q: want true or false", v)
		}
	}
	return m, errs
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50,
}

// parseDisks reads "2x960GB", "960GB" or groups joined by '+'
// ("2x960GB+4x3.84TB"). Decimal units (GB, TB) are powers of 10, binary
// units (GiB, TiB) powers of 2; a bare number is bytes.
func parseDisks(v string) ([]store.Disk, error) {
	var out []store.Disk
	for _, g := range strings.Split(v, "+") {
		sm := diskRe.FindStringSubmatch(strings.TrimSpace(g))
		if sm == nil {
			return nil, errors.New(`want COUNTxSIZE, e.g. "2x960GB" or "2x960GB+4x3.84TB"`)
		}
		n := 1
		if sm[1] != "" {
			var err error
			if n, err = strconv.Atoi(sm[1]); err != nil || n < 1 {
				return nil, errors.New("disk count must be at least 1")
			}
		}
		f, err := strconv.ParseFloat(sm[2], 64)
		if err != nil || !(f > 0) {
			return nil, errors.New("disk size must be > 0")
		}
		bytes := f * sizeUnits[strings.ToLower(sm[3])]
		if bytes > 1<<62 {
			return nil, errors.New("disk size too large")
		}
		if bytes < 1 {
			return nil, errors.New("disk size must be at least 1 byte")
		}
		if len(out)+n > maxDisks {
			return nil, fmt.Errorf("more than %d disks", maxDisks)
		}
		for i := 0; i < n; i++ {
			out = append(out, store.Disk{SizeBytes: uint64(bytes)})
		}
	}
	return out, nil
}
