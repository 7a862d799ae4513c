package dhcp

import (
	"net"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Sharing the answering among servers: RFC 3074 load balancing (DHC Load
// Balancing Algorithm). Every server hashes the client's chaddr with the
// RFC's Pearson hash into one of 256 buckets and the buckets are spread
// over the members (bucket mod len(members), members in the order
// Membership.Members gives, the same on every server), so exactly one
// server answers a client at first. A server that does not own the client
// still answers once the client's secs field (RFC 2131 §2: seconds since it
// began acquiring) reaches Config.BalanceWait — the owner may be down. See
// DESIGN.md for why this and not a proxy to one answering node.

// loadbMixTable is the "mixing table" of RFC 3074 §6: the 256 byte values
// in the RFC's pseudo-random order.
var loadbMixTable = [256]byte{
	251, 175, 119, 215, 81, 14, 79, 191, 103, 49, 181, 143, 186, 157, 0, 232,
	31, 32, 55, 60, 152, 58, 17, 237, 174, 70, 160, 144, 220, 90, 57, 223,
	59, 3, 18, 140, 111, 166, 203, 196, 134, 243, 124, 95, 222, 179, 197, 65,
	180, 48, 36, 15, 107, 46, 233, 130, 165, 30, 123, 161, 209, 23, 97, 16,
	40, 91, 219, 61, 100, 10, 210, 109, 250, 127, 22, 138, 29, 108, 244, 67,
	207, 9, 178, 204, 74, 98, 126, 249, 167, 116, 34, 77, 193, 200, 121, 5,
	20, 113, 71, 35, 128, 13, 182, 94, 25, 226, 227, 199, 75, 27, 41, 245,
	230, 224, 43, 225, 177, 26, 155, 150, 212, 142, 218, 115, 241, 73, 88, 105,
	39, 114, 62, 255, 192, 201, 145, 214, 168, 158, 221, 148, 154, 122, 12, 84,
	82, 163, 44, 139, 228, 236, 205, 242, 217, 11, 187, 146, 159, 64, 86, 239,
	195, 42, 106, 198, 118, 112, 184, 172, 87, 2, 173, 117, 176, 229, 247, 253,
	137, 185, 99, 164, 102, 147, 45, 66, 231, 52, 141, 211, 194, 206, 246, 238,
	56, 110, 78, 248, 63, 240, 189, 93, 92, 51, 53, 183, 19, 171, 72, 50,
	33, 104, 101, 69, 8, 252, 83, 120, 76, 135, 85, 54, 202, 125, 188, 213,
	96, 235, 136, 208, 162, 129, 190, 132, 156, 38, 47, 1, 7, 254, 24, 4,
	216, 131, 89, 21, 28, 133, 37, 153, 149, 80, 170, 68, 6, 169, 234, 151,
}

// loadbHash is the RFC 3074 §6 hash of key (the client's chaddr): a
// Pearson hash seeded with the key's length, over the key from its last
// byte to its first.
func loadbHash(key []byte) byte {
	h := byte(len(key))
	for i := len(key); i > 0; i-- {
		h = loadbMixTable[h^key[i-1]]
	}
	return h
}

// Owner returns which of n members (0..n-1, in the order Membership.Members
// gives) answers the client with hardware address chaddr at first: its RFC
// 3074 hash bucket modulo n. n ≤ 0 gives 0.
func Owner(chaddr net.HardwareAddr, n int) int {
	if n <= 0 {
		return 0
	}
	return int(loadbHash(chaddr)) % n
}

// balanced reports whether a message of type mt takes part in the load
// balancing: DISCOVER, INFORM, and a REQUEST that no server is named in
// (option 54 absent) and that is not a client renewing by unicast
// (ciaddr set, no relay): INIT-REBOOT and REBINDING. A SELECTING REQUEST
// names its server (stepServerID) and a renewal goes to the server that
// granted the lease; DECLINE and RELEASE name theirs too and commit
// idempotently.
func balanced(x *exchange) bool {
	switch x.mt {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeInform:
		return true
	case dhcpv4.MessageTypeRequest:
		if x.req.Options.Has(dhcpv4.OptionServerIdentifier) {
			return false
		}
		renewing := ip4(x.req.ClientIPAddr).IsValid() && !ip4(x.req.GatewayIPAddr).IsValid() && x.dst.Addr() == x.serverID
		return !renewing
	}
	return false
}

// stepBalance stays silent for a client another member owns until the
// client has waited BalanceWait (secs), and fixes this server's share of
// the pools for offers.
func (s *Server) stepBalance(x *exchange) bool {
	self, members := s.b.Members()
	k := -1
	for i, m := range members {
		if m == self {
			k = i
		}
	}
	if k >= 0 {
		x.sh = share{k: k, n: len(members)}
	}
	if len(members) <= 1 || !balanced(x) {
		return false
	}
	owner := members[Owner(x.req.ClientHWAddr, len(members))]
	if owner == self || time.Duration(x.req.NumSeconds)*time.Second >= s.cfg.BalanceWait {
		return false
	}
	return x.silence("not_owner", nil)
}
