package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

const goodCSV = `# rack plan hall1 r01
name,serial,vendor,model,site,rack,u,bmc_address,bmc_mac,macs,cpus,memory_gib,disks,boot_mode,ipv4,labels,root_disk_serial,root_disk_min_gib,wipe
node-01,SN001,Dell,R650,hall1,r01,10,10.99.1.10:623,AA:BB:CC:00:00:01,52:54:00:00:00:01;52-54-00-00-01-01,64,512,2x960GB+4x3.84TB,uefi,10.99.0.10,pool=gpu;zone=a,S3Z1,100,true
"node-02",SN002,Dell,R650,hall1,r01,11,bmc-node-02.hall1,,5254.0000.0002,64,512.5,960GB,legacy,,,,,
`

func TestParseCSV(t *testing.T) {
	ms, err := Parse(strings.NewReader(goodCSV), "csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d machines", len(ms))
	}
	a := ms[0]
	if a.State != store.StateRegistered || a.Name != "node-01" || a.Intended.Serial != "SN001" || a.Intended.Vendor != "Dell" ||
		a.Intended.Model != "R650" || a.Site != "hall1" || a.Rack != "r01" || a.RackUnit != 10 ||
		a.Intended.BMCAddress != "10.99.1.10:623" || a.Intended.BMCMAC != "aa:bb:cc:00:00:01" || a.Intended.CPUs != 64 ||
		a.Intended.MemoryBytes != 512<<30 || a.BootMode != store.BootModeUEFI || a.IPv4 != "10.99.0.10" ||
		a.Labels["pool"] != "gpu" || a.Labels["zone"] != "a" || a.RootDisk.Serial != "S3Z1" || a.RootDisk.MinSizeBytes != 100<<30 || !a.Wipe {
		t.Fatalf("row 1: %+v", a)
	}
	if len(a.Intended.NICs) != 2 || a.Intended.NICs[0].MAC != "52:54:00:00:00:01" || a.Intended.NICs[1].MAC != "52:54:00:00:01:01" {
		t.Fatalf("nics %+v", a.Intended.NICs)
	}
	if len(a.Intended.Disks) != 6 || a.Intended.Disks[0].SizeBytes != 960e9 || a.Intended.Disks[5].SizeBytes != 3.84e12 {
		t.Fatalf("disks %+v", a.Intended.Disks)
	}
	b := ms[1]
	if b.Name != "node-02" || b.Intended.NICs[0].MAC != "52:54:00:00:00:02" || b.BootMode != store.BootModeLegacy ||
		b.Intended.MemoryBytes != uint64(512.5*(1<<30)) || len(b.Intended.Disks) != 1 || b.Wipe || b.Labels != nil {
		t.Fatalf("row 2: %+v", b)
	}
}

// TestBadRows: every bad row is reported with its line and field, and
// nothing is returned.
func TestBadRows(t *testing.T) {
	in := `name,serial,macs,u,cpus,memory_gib,disks,boot_mode,ipv4,labels,wipe,bmc_address,bmc_mac
ok-1,S1,52:54:00:00:00:01,1,8,16,1x1TB,uefi,10.0.0.1,a=b,true,10.0.0.2,
bad mac,S2,52:54:00:zz:00:02,1,8,16,1x1TB,uefi,,,,,
ok-3,S3,52:54:00:00:00:03,0,eight,16,1x1TB,uefi,,,,,
ok-4,S4,52:54:00:00:00:04,1,8,-1,2x,efi32,fe80::1,novalue,maybe,bmc:0,52:54:00:00:00:04

ok-6,S6,01:00:5e:00:00:07,1,8,16,1x1TB,uefi,,,,,
ok-7,S7,,1,8,16,1x1TB,uefi,,,,,
ok-8,S8,52:54:00:00:00:08;FF-FF-FF-FF-FF-FF,1,8,16,1x1TB,uefi,,,,,00:00:00:00:00:00
ok-9,S9,52:54:00:00:00:09
`
	ms, err := Parse(strings.NewReader(in), "csv")
	var rows *ErrRows
	if !errors.As(err, &rows) || ms != nil {
		t.Fatalf("want *ErrRows and no machines, got %v, %d", err, len(ms))
	}
	got := map[string]bool{}
	for _, r := range rows.Rows {
		got[fmt.Sprintf("%d:%s", r.Line, r.Field)] = true
		if r.Msg == "" {
			t.Fatalf("empty message %+v", r)
		}
	}
	want := []string{"3:name", "3:macs", "4:u", "4:cpus", "5:memory_gib", "5:disks", "5:boot_mode", "5:ipv4", "5:labels",
		"5:wipe", "5:bmc_address", "5:bmc_mac", "7:macs", "8:macs", "9:macs", "9:bmc_mac", "10:"}
	for _, w := range want {
		if !got[w] {
			t.Errorf("missing row error %s; got %v", w, rows.Rows)
		}
	}
	if len(rows.Rows) != len(want) {
		t.Errorf("got %d row errors, want %d: %+v", len(rows.Rows), len(want), rows.Rows)
	}
	for i := 1; i < len(rows.Rows); i++ {
		if rows.Rows[i].Line < rows.Rows[i-1].Line {
			t.Fatal("row errors not in line order")
		}
	}
	if !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("error text %q", err)
	}
}

func TestHeaderErrors(t *testing.T) {
	for _, tc := range []struct{ in, field string }{
		{"name,macs,colour\nx,52:54:00:00:00:01,red\n", "colour"},
		{"serial\nS1\n", "name"},
		{"name,macs,MACS\nx,52:54:00:00:00:01,52:54:00:00:00:02\n", "MACS"},
		{"name,macs\n\"x,52:54:00:00:00:01\n", ""},
	} {
		_, err := Parse(strings.NewReader(tc.in), "csv")
		var rows *ErrRows
		if !errors.As(err, &rows) || rows.Rows[0].Field != tc.field {
			t.Errorf("%q: got %v", tc.in, err)
		}
	}
	if _, err := Parse(strings.NewReader(""), "csv"); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty: %v", err)
	}
	if _, err := Parse(strings.NewReader("name,macs\n"), "csv"); !errors.Is(err, ErrEmpty) {
		t.Errorf("header only: %v", err)
	}
	if _, err := Parse(strings.NewReader("x"), "xlsx"); !errors.Is(err, ErrFormat) {
		t.Errorf("format: %v", err)
	}
}

// netboxExport is the header and rows of a NetBox device list exported as
// CSV ("Export → All data"), with the UI's verbose column names.
const netboxExport = `ID,Name,Status,Tenant,Site,Location,Rack,Position,Role,Manufacturer,Type,Platform,Serial number,Asset tag,IP Address,Primary IPv4,Face,Airflow,Comments
101,r01-n10,Active,k8s,hall1,Row A,r01,10.0,Worker,Dell,PowerEdge R650,flatcar,SN-101,AT-0101,,10.99.0.10/24,Front,Front to rear,
102,r01-n11,Planned,,hall1,Row A,r01,11.0,Worker,Dell,PowerEdge R650,,SN-102,,,,Front,,"racked, not cabled"
`

func TestParseNetBox(t *testing.T) {
	ms, err := Parse(strings.NewReader(netboxExport), "netbox")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d", len(ms))
	}
	a := ms[0]
	if a.Name != "r01-n10" || a.Site != "hall1" || a.Rack != "r01" || a.RackUnit != 10 || a.Intended.Vendor != "Dell" ||
		a.Intended.Model != "PowerEdge R650" || a.Intended.Serial != "SN-101" || a.IPv4 != "10.99.0.10" ||
		a.Labels["asset_tag"] != "AT-0101" || a.Labels["role"] != "Worker" || a.Labels["tenant"] != "k8s" ||
		a.Labels["location"] != "Row A" || a.Labels["netbox_id"] != "101" || a.Labels["netbox_status"] != "Active" || len(a.Intended.NICs) != 0 {
		t.Fatalf("netbox row: %+v labels %v", a, a.Labels)
	}
	// The bulk-import column names work too.
	ms, err = Parse(strings.NewReader("name,device_role,manufacturer,device_type,site,rack,position,serial,asset_tag\nn1,worker,HPE,DL360,h1,r9,42,SN9,AT9\n"), "netbox")
	if err != nil || ms[0].Intended.Model != "DL360" || ms[0].RackUnit != 42 || ms[0].Labels["role"] != "worker" {
		t.Fatalf("bulk-import columns: %v %+v", err, ms)
	}
	// A bad position is reported with NetBox's line.
	_, err = Parse(strings.NewReader("Name,Position\nn1,10.5\n"), "netbox")
	var rows *ErrRows
	if !errors.As(err, &rows) || rows.Rows[0].Line != 2 || rows.Rows[0].Field != "u" {
		t.Fatalf("netbox bad row: %v", err)
	}
}

func TestParseJSON(t *testing.T) {
	in := `{"machines": [
  {"name": "j1", "serial": "S1", "macs": ["52:54:00:00:00:01", "52:54:00:00:00:02"], "cpus": 8,
   "memory_gib": 32, "labels": {"pool": "gpu"}, "wipe": true, "u": 3, "disks": "2x1TB"},
  {"name": "j2", "macs": "52:54:00:00:00:03;52:54:00:00:00:04"}
]}`
	ms, err := Parse(strings.NewReader(in), "json")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || len(ms[0].Intended.NICs) != 2 || ms[0].Intended.CPUs != 8 || !ms[0].Wipe || ms[0].Labels["pool"] != "gpu" ||
		ms[0].RackUnit != 3 || len(ms[0].Intended.Disks) != 2 || len(ms[1].Intended.NICs) != 2 {
		t.Fatalf("%+v", ms)
	}
	bad := `[
  {"name": "j1", "macs": ["52:54:00:00:00:01"]},
  {"name": "j2", "macs": ["33:33:00:00:00:01"],
   "colour": "red"},
  {"name": "j3", "macs": [1], "cpus": "many"},
  "not an object"
]`
	_, err = Parse(strings.NewReader(bad), "json")
	var rows *ErrRows
	if !errors.As(err, &rows) {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rows.Rows {
		got[fmt.Sprintf("%d:%s", r.Line, r.Field)] = true
	}
	for _, w := range []string{"3:colour", "3:macs", "5:macs", "6:"} {
		if !got[w] {
			t.Errorf("missing %s in %+v", w, rows.Rows)
		}
	}
	if _, err := Parse(strings.NewReader(`{"nodes": []}`), "json"); !errors.As(err, &rows) {
		t.Errorf("wrong top-level key: %v", err)
	}
	if _, err := Parse(strings.NewReader(`[{"name": "x", "macs": "52:54:00:00:00:01"}`), "json"); !errors.As(err, &rows) {
		t.Errorf("truncated: %v", err)
	}
}

// plan writes an n-row rack plan in Kiln's CSV (40 machines per rack).
func plan(n int) string {
	var b strings.Builder
	b.WriteString("name,serial,vendor,model,site,rack,u,bmc_address,macs,cpus,memory_gib,disks,boot_mode,labels\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "n%05d,SN%06d,Dell,R650,hall1,r%03d,%d,10.98.%d.%d,02:00:00:%02x:%02x:01;02:00:00:%02x:%02x:02,64,512,2x960GB,uefi,pool=p%d\n",
			i, i, i/40, i%40+1, i/250, i%250+1, i>>8, i&0xff, i>>8, i&0xff, i%4)
	}
	return b.String()
}

func TestParse2000RowPlan(t *testing.T) {
	ms, err := Parse(strings.NewReader(plan(2000)), "csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2000 || ms[1999].Name != "n01999" || ms[1999].Rack != "r049" || len(ms[1999].Intended.NICs) != 2 {
		t.Fatalf("%d machines, last %+v", len(ms), ms[len(ms)-1])
	}
	// One bad row among 2,000 rejects the whole plan. (Duplicates across
	// rows are the store's rule: lifecycle's TestImport2000RowsOneStoredDuplicate.)
	p := strings.Replace(plan(2000), "n01234,SN001234", "n01234,SN\x01", 1)
	_, err = Parse(strings.NewReader(p), "csv")
	var rows *ErrRows
	if !errors.As(err, &rows) || len(rows.Rows) != 1 || rows.Rows[0].Line != 1236 || rows.Rows[0].Field != "serial" {
		t.Fatalf("bad serial: %v", err)
	}
}

func BenchmarkParse2000(b *testing.B) {
	p := plan(2000)
	for i := 0; i < b.N; i++ {
		if _, err := Parse(strings.NewReader(p), "csv"); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParse: any accepted file yields machines that hold the import rules (a name of the
// name rule, printable fields, lower-case unicast EUI-48 MACs — that a MAC is used once is
// the store's rule, store.ImportMachines, not the parser's), and the same
// machines written in the other form — Kiln's JSON import format, every field of each
// machine — parse back to exactly the same machines (CSV/NetBox/JSON ⇄ JSON equivalence).
func FuzzParse(f *testing.F) {
	f.Add(goodCSV, "csv")
	f.Add(netboxExport, "netbox")
	f.Add(`[{"name":"j","macs":["52:54:00:00:00:01"],"labels":{"a":"b"}}]`, "json")
	f.Add(`{"machines":[{"name":"j","macs":"52:54:00:00:00:01","disks":"3x1.5TiB"}]}`, "json")
	f.Add("name,macs\nx,\"52:54:00:00:00:01\"\"\n", "csv")
	f.Add("name,macs,disks\nx,52:54:00:00:00:01,99999999x1PB\n", "csv")
	f.Add("name,macs,disks,memory_gib\nx,52:54:00:00:00:01,0.5b,0.0000000001\n", "csv")
	f.Add("name,macs,memory_gib,root_disk_min_gib,u,cpus,wipe,boot_mode,ipv4,bmc_mac,labels\nx,52-54-00-00-00-01,1.5,0.001,12.0,8,yes,BIOS,10.0.0.5/24,AA:BB:CC:00:00:01, a = b ; c=d \n", "csv")
	f.Fuzz(func(t *testing.T, in, format string) {
		ms, err := Parse(strings.NewReader(in), format)
		if err != nil {
			return
		}
		withoutNIC := false
		for _, m := range ms {
			if rules.CheckName(m.Name) != nil || m.State != store.StateRegistered || len(m.Intended.Disks) > maxDisks {
				t.Fatalf("invalid machine %+v", m)
			}
			for _, v := range []string{m.Intended.Serial, m.Intended.Vendor, m.Intended.Model, m.Site, m.Rack, m.RootDisk.Serial} {
				if rules.CheckText(v, rules.MaxTextLen) != nil {
					t.Fatalf("field %q of %s", v, m.Name)
				}
			}
			all := []string{m.Intended.BMCMAC}
			for _, n := range m.Intended.NICs {
				all = append(all, n.MAC)
			}
			for _, mac := range all {
				if mac == "" {
					continue
				}
				if norm, err := store.ParseMachineMAC(mac); err != nil || norm != mac {
					t.Fatalf("mac %q of %s (normalized %q, %v)", mac, m.Name, norm, err)
				}
			}
			withoutNIC = withoutNIC || len(m.Intended.NICs) == 0
		}
		if withoutNIC {
			return // NetBox rows may lack MACs; the JSON form requires one
		}
		js := toJSON(t, ms)
		again, err := Parse(strings.NewReader(js), "json")
		if err != nil {
			t.Fatalf("%q (%s) accepted, but its JSON form is refused: %v\n%s", in, format, err, js)
		}
		if !reflect.DeepEqual(again, ms) {
			t.Fatalf("%q (%s) and its JSON form differ:\n%+v\n%+v\n%s", in, format, ms, again, js)
		}
	})
}

// toJSON writes machines in Kiln's JSON import format, every field the import sets.
func toJSON(t *testing.T, ms []store.Machine) string {
	t.Helper()
	gib := func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'g', -1, 64) }
	var rows []map[string]any
	for _, m := range ms {
		r := map[string]any{"name": m.Name}
		set := func(k, v string) {
			if v != "" {
				r[k] = v
			}
		}
		set("serial", m.Intended.Serial)
		set("vendor", m.Intended.Vendor)
		set("model", m.Intended.Model)
		set("site", m.Site)
		set("rack", m.Rack)
		set("bmc_address", m.Intended.BMCAddress)
		set("bmc_mac", m.Intended.BMCMAC)
		set("boot_mode", string(m.BootMode))
		set("ipv4", m.IPv4)
		set("root_disk_serial", m.RootDisk.Serial)
		if m.RackUnit != 0 {
			r["u"] = m.RackUnit
		}
		if m.Intended.CPUs != 0 {
			r["cpus"] = m.Intended.CPUs
		}
		if m.Intended.MemoryBytes != 0 {
			r["memory_gib"] = json.Number(gib(m.Intended.MemoryBytes))
		}
		if m.RootDisk.MinSizeBytes != 0 {
			r["root_disk_min_gib"] = json.Number(gib(m.RootDisk.MinSizeBytes))
		}
		if m.Wipe {
			r["wipe"] = true
		}
		var disks []string
		for _, d := range m.Intended.Disks {
			disks = append(disks, strconv.FormatUint(d.SizeBytes, 10))
		}
		set("disks", strings.Join(disks, "+"))
		var macs []string
		for _, n := range m.Intended.NICs {
			macs = append(macs, n.MAC)
		}
		r["macs"] = macs
		if len(m.Labels) > 0 {
			r["labels"] = m.Labels
		}
		rows = append(rows, r)
	}
	b, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSizesBelowOneByteRefused: a disk or memory size that rounds to 0 bytes was accepted
// and stored as "no disk size" / "no memory" (found by FuzzParse's JSON round trip).
func TestSizesBelowOneByteRefused(t *testing.T) {
	for _, tc := range []struct{ col, val string }{{"disks", "0.5b"}, {"disks", "2x0.1"}, {"memory_gib", "0.0000000001"}} {
		in := "name,macs," + tc.col + "\nx,52:54:00:00:00:01," + tc.val + "\n"
		var re *ErrRows
		if _, err := Parse(strings.NewReader(in), "csv"); !errors.As(err, &re) || re.Rows[0].Field != tc.col {
			t.Errorf("%s=%s: %v, want a row error on %s", tc.col, tc.val, err, tc.col)
		}
	}
}
