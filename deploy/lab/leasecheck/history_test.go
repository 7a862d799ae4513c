package leasecheck

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func ack(mac, ip string, sentMS, recvMS int, lease time.Duration, k Kind) Ack {
	return Ack{MAC: mac, IP: netip.MustParseAddr(ip), Server: netip.MustParseAddr("10.95.0.1"), Kind: k,
		Sent: at(sentMS), Recv: at(recvMS), Lease: lease}
}

const (
	macA = "02:00:00:00:00:01"
	macB = "02:00:00:00:00:02"
	macC = "02:00:00:00:00:03"
	ipX  = "10.95.8.7"
	ipY  = "10.95.8.8"
)

// TestCheckCatchesPlantedOverlap: the checker is not vacuous. A history in
// which B is ACKed an address 1 ms before A's lease (counted from A's send
// time) ends is a violation, reported with both holds; the same history
// with B's ACK at the instant A's ends is clean.
func TestCheckCatchesPlantedOverlap(t *testing.T) {
	ok := History{Acks: []Ack{
		ack(macA, ipX, 0, 5, 20*time.Second, KindSelect),
		ack(macB, ipX, 19_990, 20_000, 20*time.Second, KindSelect), // begins as A's ends: no overlap
		ack(macC, ipY, 0, 3, 20*time.Second, KindSelect),
	}}
	r := Check(ok)
	if len(r.Violations) != 0 || r.Acks != 3 || r.Clients != 3 || r.Addresses != 2 || r.Reused != 1 || r.Handovers != 1 || r.MinGap != 0 {
		t.Fatalf("clean history: %+v\n%s", r, r.Summary(5))
	}

	bad := History{Acks: append([]Ack(nil), ok.Acks...)}
	bad.Acks[1].Recv = at(19_999) // 1 ms before A's end
	r = Check(bad)
	if len(r.Violations) != 1 {
		t.Fatalf("planted overlap not found: %+v", r)
	}
	v := r.Violations[0]
	if v.A.MAC != macA || v.B.MAC != macB || v.Overlap != time.Millisecond || v.A.IP.String() != ipX {
		t.Fatalf("violation %v", v)
	}
	if s := r.Summary(5); !strings.Contains(s, macA) || !strings.Contains(s, macB) || !strings.Contains(s, "overlap 1ms") {
		t.Fatalf("summary does not name both holds: %s", s)
	}
}

// TestCheckLeaseFromSendTime: a client's hold ends at send time + lease
// (RFC 2131 §4.4.1), not at the ACK's arrival + lease: a slow ACK does not
// lengthen it. So the next client's ACK arriving between the two ends is
// clean; counted from the arrival it would not be.
func TestCheckLeaseFromSendTime(t *testing.T) {
	h := History{Acks: []Ack{
		ack(macA, ipX, 0, 900, 20*time.Second, KindSelect),           // ends at 20.000 s, not 20.900 s
		ack(macB, ipX, 20_100, 20_200, 20*time.Second, KindSelect),   // begins at 20.2 s
		ack(macA, ipY, 40_000, 40_001, 10*time.Second, KindSelect),   // a second address, no conflict
		ack(macA, ipY, 45_000, 45_002, 10*time.Second, KindRenew),    // renewal of it by the same client
		ack(macC, ipY, 54_000, 54_500, 10*time.Second, KindReboot),   // 1 s before A's renewed lease ends
		ack(macB, ipX, 30_000, 30_100, 20*time.Second, KindRebind),   // B's own rebind: same client
		ack(macC, ipX, 49_000, 50_000, 20*time.Second, KindSelect),   // B's rebound lease ends at 50.0 s
		ack(macC, ipX, 60_000, 60_010, 20*time.Second, KindRenew),    // C renews
		ack(macA, ipX, 79_000, 80_010, 20*time.Second, KindSelect),   // C's renewed hold ends 80.0 s
		ack(macB, ipY, 120_000, 120_010, 20*time.Second, KindSelect), // long after
	}}
	r := Check(h)
	if len(r.Violations) != 1 {
		t.Fatalf("want exactly the ipY overlap, got %d:\n%s", len(r.Violations), r.Summary(10))
	}
	v := r.Violations[0]
	if v.A.MAC != macA || v.B.MAC != macC || v.A.IP.String() != ipY || v.Overlap != 500*time.Millisecond {
		t.Fatalf("violation %v", v)
	}
}

// TestCheckStops: a release or a NAK ends a hold early, so another client
// may take the address after it, and not before.
func TestCheckStops(t *testing.T) {
	acks := []Ack{
		ack(macA, ipX, 0, 2, 20*time.Second, KindSelect),
		ack(macB, ipX, 5_000, 5_010, 20*time.Second, KindSelect),
	}
	for _, c := range []struct {
		name   string
		stops  []Stop
		errors int
	}{
		{"no stop", nil, 1},
		{"release before", []Stop{{MAC: macA, IP: netip.MustParseAddr(ipX), At: at(4_000), Reason: "release"}}, 0},
		{"nak before", []Stop{{MAC: macA, IP: netip.MustParseAddr(ipX), At: at(5_010), Reason: "nak"}}, 0},
		{"release after", []Stop{{MAC: macA, IP: netip.MustParseAddr(ipX), At: at(6_000), Reason: "release"}}, 1},
		{"another client's release", []Stop{{MAC: macC, IP: netip.MustParseAddr(ipX), At: at(1_000), Reason: "release"}}, 1},
		{"a release before the ACK", []Stop{{MAC: macA, IP: netip.MustParseAddr(ipX), At: at(1), Reason: "release"}}, 1},
	} {
		r := Check(History{Acks: acks, Stops: c.stops})
		if len(r.Violations) != c.errors {
			t.Errorf("%s: %d violations, want %d\n%s", c.name, len(r.Violations), c.errors, r.Summary(5))
		}
	}
}

// TestCheckGrantsAndStore: a grant of the log inside another client's hold
// is caught even with no ACK to the second client; the end-of-run store
// must cover the last hold of each address.
func TestCheckGrantsAndStore(t *testing.T) {
	r := Check(History{Acks: []Ack{ack(macA, ipX, 0, 2, 20*time.Second, KindSelect)}})
	x := netip.MustParseAddr(ipX)
	if p := CheckGrants(r, []Grant{{MAC: macA, IP: x, State: "bound", At: at(1)}, {MAC: macB, IP: x, State: "bound", At: at(20_000)}}); len(p) != 0 {
		t.Fatalf("clean grants: %v", p)
	}
	p := CheckGrants(r, []Grant{{MAC: macB, IP: x, State: "bound", At: at(19_999)}})
	if len(p) != 1 || !strings.Contains(p[0], macB) || !strings.Contains(p[0], macA) {
		t.Fatalf("planted grant: %v", p)
	}
	for _, c := range []struct {
		name string
		recs map[netip.Addr]Record
		bad  int
	}{
		{"covered", map[netip.Addr]Record{x: {MAC: macA, IP: x, Expiry: at(20_004), State: "bound"}}, 0},
		{"exact", map[netip.Addr]Record{x: {MAC: macA, IP: x, Expiry: at(20_000), State: "bound"}}, 0},
		{"later holder", map[netip.Addr]Record{x: {MAC: macB, IP: x, Expiry: at(60_000), State: "bound"}}, 0},
		{"short", map[netip.Addr]Record{x: {MAC: macA, IP: x, Expiry: at(19_000), State: "bound"}}, 1},
		{"missing", map[netip.Addr]Record{}, 1},
		{"misfiled", map[netip.Addr]Record{x: {MAC: macA, IP: x, Expiry: at(20_000), State: "bound"},
			netip.MustParseAddr(ipY): {MAC: macB, IP: x, Expiry: at(1), State: "bound"}}, 1},
		{"declined by holder", map[netip.Addr]Record{x: {MAC: macA, IP: x, Expiry: at(90_000), State: "declined"}}, 1},
	} {
		if p := CheckStore("n1", r, c.recs); len(p) != c.bad {
			t.Errorf("%s: %d problems, want %d: %v", c.name, len(p), c.bad, p)
		}
	}
}
