// Package dhcp is Kiln's PXE-aware DHCPv4 server (RFC 2131/2132, PXE 2.1,
// RFC 4578, RFC 3004, RFC 3046, UEFI HTTP boot).
//
// It owns: the handler chain that answers DHCP requests in authoritative or
// proxyDHCP mode; the in-memory lease view that follows the Backend's
// committed lease record (LeaseCommitter.WatchLeases), the tentative offers
// and the group commit of bindings (ACK only once committed, NAK when
// refused); RFC 3074 load balancing among the Membership's servers; the Linux socket loop (SO_BINDTODEVICE, IP_PKTINFO, a bounded
// worker pool, a per-MAC token bucket); and the boot-file rules that send
// firmware to the right first stage and iPXE to its per-machine script.
//
// It uses github.com/insomniacslk/dhcp/dhcpv4 only for message types and
// parsing: replies are serialised by encode (which rejects, instead of
// truncating, over-long file/sname values and never puts End right after
// option 67), and the socket loop is our own (server4 shares the port
// silently via SO_REUSEPORT and spawns a goroutine per packet).
//
// Boot files (Config.TFTPBootFiles / HTTPBootFiles, defaults):
//
//	option 93 = 0              undionly.kpxe   (TFTP)
//	option 93 = 7 or 9         ipxe.efi        (TFTP)
//	option 93 = 11             snp.efi         (TFTP)
//	16, or option 60 HTTPClient  {HTTPBootURL}/ipxe.efi, option 60 HTTPClient
//	19                         {HTTPBootURL}/snp.efi,  option 60 HTTPClient
//	iPXE (77 "iPXE" / 175)     MachineInfo.ScriptURL, else {HTTPBootURL}/ipxe/{mac}
//	                           (mac as aa:bb:cc:dd:ee:ff, the route httpboot serves)
//	MachineInfo.BootOverride   replaces the first-stage name (TFTP and HTTP)
//	Netboot=false              no boot file (authoritative: plain lease; proxy: silence)
//
// Who answers: see (*Server).buildChain. Reservations (MachineInfo.IP) should
// lie outside the subnet pools; the server cannot enumerate them.
//
// Metrics (prefix kiln_dhcp_): requests_total{type,arch}, replies_total{type,arch},
// drops_total{reason}, reply_seconds, lease_commit_seconds,
// lease_commit_leases_total.
package dhcp
