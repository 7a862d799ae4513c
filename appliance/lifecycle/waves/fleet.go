package waves

import (
	"fmt"
	"strconv"
	"strings"
)

// Fleet is a synthetic fleet description (`kiln campaign plan --fleet`):
// Sites sites, each with Racks racks of PerRack machines, the machines of
// a site split into Clusters claims. Layout "packed" (default) fills a
// cluster's racks before the next cluster's, as a cluster is usually
// racked; "striped" puts every cluster in every rack (machine i of a rack
// in cluster i mod Clusters).
type Fleet struct {
	Sites    int    `json:"sites"`
	Racks    int    `json:"racks"` // per site
	PerRack  int    `json:"per_rack"`
	Clusters int    `json:"clusters"` // per site
	Layout   string `json:"layout,omitempty"`
}

// ParseFleet reads "sites=6,racks=50,per-rack=40,clusters=4[,layout=striped]".
// A missing field: sites 1, clusters 1, layout packed; racks and per-rack
// are required.
func ParseFleet(s string) (Fleet, error) {
	f := Fleet{Sites: 1, Clusters: 1, Layout: "packed"}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return f, fmt.Errorf("fleet: %q: want key=value", kv)
		}
		if k == "layout" {
			if v != "packed" && v != "striped" {
				return f, fmt.Errorf("fleet: layout %q: want packed or striped", v)
			}
			f.Layout = v
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1_000_000 {
			return f, fmt.Errorf("fleet: %s=%q: want a whole number from 1 to 1000000", k, v)
		}
		switch k {
		case "sites":
			f.Sites = n
		case "racks":
			f.Racks = n
		case "per-rack", "per_rack":
			f.PerRack = n
		case "clusters":
			f.Clusters = n
		default:
			return f, fmt.Errorf("fleet: unknown key %q (sites, racks, per-rack, clusters, layout)", k)
		}
	}
	if f.Racks == 0 || f.PerRack == 0 {
		return f, fmt.Errorf("fleet: racks and per-rack are required")
	}
	if f.Sites*f.Racks*f.PerRack > 10_000_000 {
		return f, fmt.Errorf("fleet: %d machines: at most 10,000,000", f.Sites*f.Racks*f.PerRack)
	}
	return f, nil
}

// Machines lists the fleet's machines (IDs s1-r001-01; racks s1-r001;
// clusters s1-c1).
func (f Fleet) Machines() []Machine {
	var out []Machine
	perSite := f.Racks * f.PerRack
	for s := 1; s <= f.Sites; s++ {
		site := fmt.Sprintf("s%d", s)
		for r := 0; r < f.Racks; r++ {
			rack := fmt.Sprintf("%s-r%03d", site, r+1)
			for u := 0; u < f.PerRack; u++ {
				i := r*f.PerRack + u
				c := i * f.Clusters / perSite // packed: contiguous racks per cluster
				if f.Layout == "striped" {
					c = u % f.Clusters
				}
				out = append(out, Machine{ID: fmt.Sprintf("%s-%02d", rack, u+1), Site: site, Rack: rack,
					Group: fmt.Sprintf("%s-c%d", site, c+1)})
			}
		}
	}
	return out
}
