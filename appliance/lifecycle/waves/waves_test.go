package waves

import (
	"strings"
	"testing"
	"time"
)

// checkAssign verifies that no wave of p exceeds a limit: per group the
// cap of its size, per rack PerRack, and every machine has a wave.
func checkAssign(t *testing.T, ms []Machine, p Plan, sizes ...map[string]int) {
	t.Helper()
	size := map[string]int{}
	for _, m := range ms {
		size[m.Site+"/"+m.Group]++
	}
	for _, s := range sizes {
		for k, v := range s {
			size[k] = v
		}
	}
	type key struct {
		site string
		wave int
		k    string
	}
	inG, inR := map[key]int{}, map[key]int{}
	for _, m := range ms {
		w := p.Assign[m.ID]
		if w < 1 {
			t.Fatalf("machine %s has no wave", m.ID)
		}
		inG[key{m.Site, w, m.Group}]++
		inR[key{m.Site, w, m.Rack}]++
	}
	for k, n := range inG {
		if c := p.Limits.GroupCap(size[k.site+"/"+k.k]); n > c {
			t.Fatalf("wave %d of %s: %d of group %s, cap %d", k.wave, k.site, n, k.k, c)
		}
	}
	for k, n := range inR {
		if n > p.Limits.PerRack {
			t.Fatalf("wave %d: %d of rack %s, limit %d", k.wave, n, k.k, p.Limits.PerRack)
		}
	}
}

// 12,000 servers in 6 sites (50 racks of 40, 4 clusters of 500 per site):
// both limits give 20 waves (500 / 25 and 40 / 2) and the plan reaches
// that bound; sites in parallel take 20 waves, in turn 120.
func TestPlan12000(t *testing.T) {
	for _, layout := range []string{"packed", "striped"} {
		f, err := ParseFleet("sites=6,racks=50,per-rack=40,clusters=4,layout=" + layout)
		if err != nil {
			t.Fatal(err)
		}
		ms := f.Machines()
		if len(ms) != 12000 {
			t.Fatalf("%d machines", len(ms))
		}
		steps := DefaultSteps("os_image")
		p := Compute(ms, nil, Limits{}, steps, true)
		checkAssign(t, ms, p)
		for _, sp := range p.Sites {
			if sp.LowerBound != 20 || sp.Waves != 20 || sp.MaxWave != 100 {
				t.Fatalf("%s: site %+v", layout, sp)
			}
		}
		if p.Waves != 20 || p.WaveDuration != 32*time.Minute || p.Total != 20*32*time.Minute {
			t.Fatalf("%s: waves %d wave %s total %s", layout, p.Waves, p.WaveDuration, p.Total)
		}
		if !strings.Contains(p.CriticalPath, "site s1: 20 waves × 32m") {
			t.Fatalf("critical path %q", p.CriticalPath)
		}
		serial := Compute(ms, nil, Limits{}, steps, false)
		if serial.Waves != 120 || serial.Total != 120*32*time.Minute {
			t.Fatalf("serial: %d %s", serial.Waves, serial.Total)
		}
	}
}

// The 5 % rounds down with a floor of one: a 12-machine claim has one out
// at a time; when the cluster limit binds harder than the rack limit the
// plan names the cluster; a group's size counts unselected machines.
func TestPlanLimitsInteract(t *testing.T) {
	var l Limits
	if l.GroupCap(12) != 1 || l.GroupCap(500) != 25 || l.GroupCap(39) != 1 || l.GroupCap(40) != 2 {
		t.Fatal(l.GroupCap(12), l.GroupCap(500), l.GroupCap(39), l.GroupCap(40))
	}
	// 24 machines in 6 racks, 2 claims of 12: 1 per claim per wave → 12 waves.
	var ms []Machine
	for i := 0; i < 24; i++ {
		ms = append(ms, Machine{ID: string(rune('a'+i)) + "x", Rack: string(rune('A' + i/4)), Group: []string{"a", "b"}[i%2]})
	}
	p := Compute(ms, nil, Limits{}, DefaultSteps("os_image"), true)
	checkAssign(t, ms, p)
	if p.Waves != 12 || p.Sites[0].MaxWave != 2 || !strings.Contains(p.Sites[0].Binding, "cluster a: 12 machines") {
		t.Fatalf("%+v", p.Sites[0])
	}
	// 25 %: 3 per claim, then the racks bind (4 per rack, 2 at once → 2 waves), the claims need 4.
	p = Compute(ms, nil, Limits{ClusterPercent: 25}, DefaultSteps("os_image"), true)
	checkAssign(t, ms, p)
	if p.Waves != 4 || p.Sites[0].LowerBound != 4 {
		t.Fatalf("25%%: %+v", p.Sites[0])
	}
	// The claim holds 240 machines (only 12 selected): 5 % of 240 = 12 at once, so the racks bind.
	big := map[string]int{"/a": 240, "/b": 240}
	p = Compute(ms, big, Limits{}, DefaultSteps("os_image"), true)
	checkAssign(t, ms, p, big)
	if p.Waves != 2 || !strings.HasPrefix(p.Sites[0].Binding, "rack") {
		t.Fatalf("group sizes: %+v", p.Sites[0])
	}
}

func TestParseFleet(t *testing.T) {
	for _, bad := range []string{"", "sites=6", "racks=2,per-rack=x", "racks=1,per-rack=1,colour=red", "racks=1,per-rack=1,layout=round"} {
		if _, err := ParseFleet(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}
