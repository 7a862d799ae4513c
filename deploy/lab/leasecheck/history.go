package leasecheck

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// Kind says which exchange of RFC 2131 §4.4 an ACK or NAK answered.
type Kind string

// The exchanges a simulated client makes (RFC 2131 §4.4.1, §4.4.2, §4.4.5).
const (
	KindSelect Kind = "select" // SELECTING: REQUEST after an OFFER (option 54 and 50)
	KindReboot Kind = "reboot" // INIT-REBOOT: broadcast REQUEST, option 50, no option 54
	KindRenew  Kind = "renew"  // RENEWING: REQUEST unicast to the granting server, ciaddr set
	KindRebind Kind = "rebind" // REBINDING: REQUEST broadcast, ciaddr set
)

// Ack is one DHCPACK a client accepted. The client holds IP from Recv (the
// ACK's arrival) until Sent + Lease: RFC 2131 §4.4.1 has the client count
// the lease from the time it sent the request, which is never later than
// the server's own time, so this end is never past the server's. Sent is
// the first transmission of the REQUEST's xid (a retransmission the server
// answered was sent later, so the first is the earlier, safer end). All
// times are the one host clock every node and client of the lab reads.
type Ack struct {
	MAC    string     // the client's chaddr, lower-case aa:bb:cc:dd:ee:ff
	IP     netip.Addr // yiaddr
	Server netip.Addr // option 54 of the ACK
	Kind   Kind
	Sent   time.Time     // first transmission of the REQUEST
	Recv   time.Time     // the ACK's arrival
	Lease  time.Duration // option 51
}

// End is when the client stops using IP unless it renews: Sent + Lease.
func (a Ack) End() time.Time { return a.Sent.Add(a.Lease) }

// Stop is an event that ends a client's use of an address before its lease
// ends: a DHCPRELEASE the client sent (it stops using the address before
// sending, RFC 2131 §4.4.6) or a DHCPNAK it received for that address
// (RFC 2131 §4.4.5: it stops at once).
type Stop struct {
	MAC    string
	IP     netip.Addr
	At     time.Time
	Reason string // "release" | "nak"
}

// History is everything the clients of one run saw: the ACKs they accepted
// and the stops. Order does not matter; Check sorts.
type History struct {
	Acks  []Ack
	Stops []Stop
}

// Hold is one interval over which client MAC held IP, [From, To), from one
// ACK (truncated by the client's next stop of that address).
type Hold struct {
	MAC      string
	IP       netip.Addr
	From, To time.Time
	Ack      Ack
}

func (h Hold) String() string {
	return fmt.Sprintf("%s held %s %s..%s (%s ACK from %s, sent %s, lease %s)", h.MAC, h.IP,
		h.From.Format("15:04:05.000000"), h.To.Format("15:04:05.000000"), h.Ack.Kind, h.Ack.Server,
		h.Ack.Sent.Format("15:04:05.000000"), h.Ack.Lease)
}

// Violation is two distinct clients holding one address at overlapping
// times: A began first; they overlap for Overlap.
type Violation struct {
	A, B    Hold
	Overlap time.Duration
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: overlap %s: [%s] and [%s]", v.A.IP, v.Overlap, v.A, v.B)
}

// Result is what Check found.
type Result struct {
	Acks       int // ACKs accepted
	Clients    int // distinct MACs that got at least one ACK
	Addresses  int // distinct addresses ACKed
	Reused     int // addresses held by two or more clients over the run
	Handovers  int // times an address passed from one client to another
	Violations []Violation
	// MinGap is the shortest time between one client's hold of an address
	// ending and the next client's beginning (the closest handover); zero
	// when there was no handover.
	MinGap time.Duration
	// Holds are the intervals, by address then start (for further checks).
	Holds map[netip.Addr][]Hold
}

// holds turns the history into hold intervals: each ACK gives [Recv,
// Sent+Lease), ended early at the first stop of the same client and address
// at or after Recv. An ACK whose interval is empty (a lease of 0, or a stop
// at its arrival) holds nothing.
func (h History) holds() map[netip.Addr][]Hold {
	type key struct {
		mac string
		ip  netip.Addr
	}
	stops := map[key][]time.Time{}
	for _, s := range h.Stops {
		k := key{s.MAC, s.IP}
		stops[k] = append(stops[k], s.At)
	}
	for _, v := range stops {
		sort.Slice(v, func(i, j int) bool { return v[i].Before(v[j]) })
	}
	out := map[netip.Addr][]Hold{}
	for _, a := range h.Acks {
		end := a.End()
		st := stops[key{a.MAC, a.IP}]
		if i := sort.Search(len(st), func(i int) bool { return !st[i].Before(a.Recv) }); i < len(st) && st[i].Before(end) {
			end = st[i]
		}
		if !end.After(a.Recv) {
			continue
		}
		out[a.IP] = append(out[a.IP], Hold{MAC: a.MAC, IP: a.IP, From: a.Recv, To: end, Ack: a})
	}
	for _, v := range out {
		sort.Slice(v, func(i, j int) bool {
			if !v[i].From.Equal(v[j].From) {
				return v[i].From.Before(v[j].From)
			}
			return v[i].MAC < v[j].MAC
		})
	}
	return out
}

// Check proves, over the history, that no two distinct clients held one
// address at overlapping times: for every address, every pair of holds of
// different MACs is disjoint (half-open intervals, so one ending at the
// instant the next begins is no overlap). There is no tolerance: the lab's
// nodes and clients read one clock, and each client's end is computed from
// its send time (see Ack), so a correct server never produces an overlap,
// however slow the network. Every overlapping pair is a Violation.
func Check(h History) Result {
	r := Result{Acks: len(h.Acks), Holds: h.holds()}
	clients := map[string]bool{}
	for _, a := range h.Acks {
		clients[a.MAC] = true
	}
	r.Clients, r.Addresses = len(clients), len(r.Holds)
	first := true
	for _, hs := range r.Holds {
		macs := map[string]bool{}
		// active: holds that began earlier and have not ended by the
		// current one's start; sorted by start, so a sweep suffices.
		var active []Hold
		var last *Hold // the hold with the latest end so far
		for i := range hs {
			cur := hs[i]
			macs[cur.MAC] = true
			keep := active[:0]
			for _, a := range active {
				if a.To.After(cur.From) {
					keep = append(keep, a)
				}
			}
			active = keep
			for _, a := range active {
				if a.MAC != cur.MAC {
					end := a.To
					if cur.To.Before(end) {
						end = cur.To
					}
					r.Violations = append(r.Violations, Violation{A: a, B: cur, Overlap: end.Sub(cur.From)})
				}
			}
			if last != nil && last.MAC != cur.MAC {
				r.Handovers++
				if gap := cur.From.Sub(last.To); gap >= 0 && (first || gap < r.MinGap) {
					r.MinGap, first = gap, false
				}
			}
			if last == nil || last.MAC != cur.MAC {
				c := cur
				last = &c
			} else if cur.To.After(last.To) {
				last.To = cur.To
			}
			active = append(active, cur)
		}
		if len(macs) > 1 {
			r.Reused++
		}
	}
	sort.Slice(r.Violations, func(i, j int) bool { return r.Violations[i].B.From.Before(r.Violations[j].B.From) })
	return r
}

// Summary lists the first n violations, one a line.
func (r Result) Summary(n int) string {
	var b strings.Builder
	for i, v := range r.Violations {
		if i == n {
			fmt.Fprintf(&b, "... and %d more\n", len(r.Violations)-n)
			break
		}
		b.WriteString(v.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Record is one address's committed state as a node's store holds it at the
// end of a run (the store's lease_addrs bucket: one record per address).
type Record struct {
	MAC    string     `json:"mac"`
	IP     netip.Addr `json:"ip"`
	Expiry time.Time  `json:"expiry"`
	State  string     `json:"state"` // bound | released | declined
}

// Grant is a change of an address's holder or state as the replicated log
// recorded it (a "lease" event: its time is the leader's time of the
// command that made the change, and renewals make none).
type Grant struct {
	MAC   string
	IP    netip.Addr
	State string
	At    time.Time
}

// CheckGrants proves the log never gave an address to a client while
// another client held it by an ACK: a grant (state bound or declined) of
// IP to MAC at time At is a violation when a hold of IP by another client
// has From <= At < To. This also covers grants whose ACK never reached the
// client (the server died between commit and send), which the clients'
// history alone cannot see. It returns one line per violation.
func CheckGrants(r Result, grants []Grant) []string {
	var out []string
	for _, g := range grants {
		if g.State == "released" {
			continue
		}
		hs := r.Holds[g.IP]
		// Holds are sorted by From: only those beginning at or before At.
		n := sort.Search(len(hs), func(i int) bool { return hs[i].From.After(g.At) })
		for _, h := range hs[:n] {
			if h.MAC != g.MAC && g.At.Before(h.To) {
				out = append(out, fmt.Sprintf("%s: the log gave it to %s (%s) at %s while [%s]", g.IP, g.MAC, g.State,
					g.At.Format("15:04:05.000000"), h))
			}
		}
	}
	return out
}

// CheckStore checks one node's records at the end of a run against the
// history. Each record is filed under its own address (the bucket's key,
// passed as the map key) and names a client; and for every address a client
// was ACKed, the client whose hold ends last must be covered by the log:
// the record is that client's, with an expiry at or after the hold's end
// (bound: the committed lease runs at least as long as the client believes;
// released: the release committed after the client stopped), or another
// client's (a later grant, which CheckGrants judges). A record missing for
// an ACKed address is an ACK the log lost. It returns one line per problem.
func CheckStore(node string, r Result, recs map[netip.Addr]Record) []string {
	var out []string
	for key, rec := range recs {
		if rec.IP != key || rec.MAC == "" {
			out = append(out, fmt.Sprintf("%s: record under %s names %s for %q", node, key, rec.IP, rec.MAC))
		}
	}
	for ip, hs := range r.Holds {
		last := hs[0]
		for _, h := range hs[1:] {
			if h.To.After(last.To) {
				last = h
			}
		}
		rec, ok := recs[ip]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: no record of %s, which was ACKed [%s]", node, ip, last))
		case rec.MAC != last.MAC:
			// A later grant to another client: CheckGrants.
		case rec.State == "bound" || rec.State == "released":
			if rec.Expiry.Before(last.To) {
				out = append(out, fmt.Sprintf("%s: %s is %s by %s until %s, before the end of the client's hold [%s]",
					node, ip, rec.State, rec.MAC, rec.Expiry.Format("15:04:05.000000"), last))
			}
		default:
			out = append(out, fmt.Sprintf("%s: %s is %s by %s, which holds it [%s]", node, ip, rec.State, rec.MAC, last))
		}
	}
	sort.Strings(out)
	return out
}
