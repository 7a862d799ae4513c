package dhcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// exchange carries one request through the handler chain.
type exchange struct {
	req       *dhcpv4.DHCPv4
	resp      *dhcpv4.DHCPv4
	src, dst  netip.AddrPort // sender; local address+port it was sent to (IP_PKTINFO)
	proxyPort bool           // arrived on Config.ProxyPort
	now       time.Time
	mt        dhcpv4.MessageType
	c         client
	serverID  netip.Addr
	sn        *Subnet
	lease     *Lease         // must be committed before resp is sent
	sh        share          // this server's share of the pools (stepBalance)
	leaseTime time.Duration  // > 0: the lease time to grant (a renewal on the minority side)
	replyTo   netip.AddrPort // where resp goes
	drop      string         // why there is no reply (metric label); "" with resp == nil = nothing to answer
	err       error
}

// step is one link of the handler chain; it returns stop=true to end the
// chain (the exchange's resp, possibly nil, is then final).
type step struct {
	name string
	run  func(x *exchange) (stop bool)
}

// buildChain assembles the ordered handler chain for the mode — the one place
// the order is written down.
//
// Who answers: a request gets a reply if and only if every step ran without
// stopping the chain and the exchange holds a response at the end. Steps stop
// the chain to stay silent (malformed input; a REQUEST naming another server
// in option 54, RFC 2131 §4.3.2; no subnet; proxy mode and not a PXE/HTTP
// client or not to be netbooted) or because nothing is to be sent (DECLINE,
// RELEASE), or because another server answers: a client another member owns
// by the RFC 3074 hash until the client has waited Config.BalanceWait
// (stepBalance), and, while this server cannot commit (Membership.CanCommit
// false), everything but the renewal of a committed binding. A NAK is a
// response. A reply whose lease changed is sent only after the lease is
// committed (group commit, see committer); a binding the committer refuses
// (another client holds the address) is answered with a NAK instead.
func (s *Server) buildChain(m Mode) []step {
	if m == ModeProxy {
		return []step{
			{"validate", s.stepValidate},
			{"classify", s.stepClassify},
			{"server_id", s.stepServerID},
			{"balance", s.stepBalance},
			{"proxy", s.stepProxy},
			{"boot", s.stepBoot},
			{"reply", s.stepReply},
		}
	}
	return []step{
		{"validate", s.stepValidate},
		{"classify", s.stepClassify},
		{"server_id", s.stepServerID},
		{"balance", s.stepBalance},
		{"subnet", s.stepSubnet},
		{"lease", s.stepLease},
		{"network", s.stepNetwork},
		{"boot", s.stepBoot},
		{"reply", s.stepReply},
	}
}

// Handle runs the handler chain for one decoded request without sockets: src
// is the sender, dst the local address and port the packet was sent to (the
// limited broadcast 255.255.255.255 for broadcasts; its port tells the proxy
// port from the DHCP port). It returns the reply and where to send it, or a
// nil reply for silence. A lease the reply depends on is committed through
// Backend.CommitLeases (a batch of one) before Handle returns; a binding the
// committer refuses gets a NAK. Errors wrap ErrMalformed, ErrNoSubnet,
// ErrPoolExhausted, ErrFieldTooLong or ErrPersist.
func (s *Server) Handle(req *dhcpv4.DHCPv4, src, dst netip.AddrPort) (*dhcpv4.DHCPv4, netip.AddrPort, error) {
	x := s.process(req, src, dst, time.Now())
	if x.err != nil {
		return nil, netip.AddrPort{}, x.err
	}
	if x.lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.SaveTimeout)
		errs, err := s.b.CommitLeases(ctx, []Lease{*x.lease})
		cancel()
		if err == nil && len(errs) != 1 {
			err = fmt.Errorf("%d results for 1 lease", len(errs))
		}
		if err != nil {
			s.m.drops.WithLabelValues("persist_error").Inc()
			return nil, netip.AddrPort{}, fmt.Errorf("%w: %w", ErrPersist, err)
		}
		if errs[0] != nil {
			s.refused(x, errs[0])
		}
	}
	if x.resp == nil {
		return nil, netip.AddrPort{}, nil
	}
	if _, err := encode(x.resp, s.cfg.MaxFileLen, s.cfg.MaxSnameLen); err != nil {
		return nil, netip.AddrPort{}, err
	}
	s.m.replies.WithLabelValues(msgLabel(x.resp.MessageType()), archLabel(x.c.arch)).Inc()
	return x.resp, x.replyTo, nil
}

// refused turns x's reply after the committer refused its lease (err): a
// REQUEST whose address another client holds gets a NAK; any other refusal
// (or a DECLINE/RELEASE) leaves x silent.
func (s *Server) refused(x *exchange, err error) {
	if x.mt != dhcpv4.MessageTypeRequest || !errors.Is(err, ErrAddressTaken) {
		s.m.drops.WithLabelValues("lease_refused").Inc()
		x.resp = nil
		return
	}
	s.m.drops.WithLabelValues("address_taken").Inc() // the ACK; a NAK goes instead
	x.resp = s.nak(x, "requested address not available")
	s.stepReply(x)
}

// nak is a DHCPNAK for x's REQUEST (RFC 2131 §4.3.2), broadcast by a relay.
func (s *Server) nak(x *exchange, why string) *dhcpv4.DHCPv4 {
	r := s.newReply(x, dhcpv4.MessageTypeNak)
	r.UpdateOption(dhcpv4.OptMessage(why))
	if ip4(x.req.GatewayIPAddr).IsValid() {
		r.SetBroadcast() // RFC 2131 §4.3.2
	}
	return r
}

// process runs the chain and counts the request and any drop.
func (s *Server) process(req *dhcpv4.DHCPv4, src, dst netip.AddrPort, now time.Time) *exchange {
	x := &exchange{req: req, src: src, dst: dst, now: now, proxyPort: s.cfg.Mode == ModeProxy && dst.Port() == uint16(s.cfg.ProxyPort)}
	for _, st := range s.chain {
		if st.run(x) {
			break
		}
	}
	s.m.requests.WithLabelValues(msgLabel(x.mt), archLabel(x.c.arch)).Inc()
	if x.err != nil || x.drop != "" {
		reason := x.drop
		if reason == "" {
			reason = "error"
		}
		s.m.drops.WithLabelValues(reason).Inc()
		x.resp, x.lease = nil, nil
	}
	return x
}

func (x *exchange) silence(reason string, err error) bool {
	x.drop, x.err, x.resp = reason, err, nil
	return true
}

// stepValidate: BOOTREQUEST, Ethernet (htype 1, hlen 6), option 53 present.
func (s *Server) stepValidate(x *exchange) bool {
	r := x.req
	if r.OpCode != dhcpv4.OpcodeBootRequest || r.HWType != iana.HWTypeEthernet || len(r.ClientHWAddr) != 6 {
		return x.silence("malformed", fmt.Errorf("%w: op %d htype %d hlen %d", ErrMalformed, r.OpCode, r.HWType, len(r.ClientHWAddr)))
	}
	if !unicastMAC(r.ClientHWAddr) {
		// A group (multicast/broadcast) or all-zero chaddr is no NIC's
		// address: answering it would lease to, and record as discovered,
		// a machine that cannot exist.
		return x.silence("malformed", fmt.Errorf("%w: chaddr %s is not a unicast MAC", ErrMalformed, r.ClientHWAddr))
	}
	mt := r.Options.Get(dhcpv4.OptionDHCPMessageType)
	if len(mt) != 1 || mt[0] < 1 || mt[0] > 8 {
		return x.silence("malformed", fmt.Errorf("%w: message type %v", ErrMalformed, mt))
	}
	x.mt = dhcpv4.MessageType(mt[0])
	return false
}

// unicastMAC reports whether mac is an individual (not group) address that is
// not all zeros (IEEE 802: the low bit of the first octet marks a group).
func unicastMAC(mac net.HardwareAddr) bool {
	if len(mac) == 0 || mac[0]&1 != 0 {
		return false
	}
	for _, b := range mac {
		if b != 0 {
			return true
		}
	}
	return false
}

// stepClassify reads the PXE options and looks the MAC up; an unknown MAC is
// reported through Backend.Discovered (rate-limited per MAC).
func (s *Server) stepClassify(x *exchange) bool {
	x.c = classify(x.req)
	x.c.machine, x.c.known = s.b.Machine(x.c.mac)
	if !x.c.known && s.disc.allow(x.c.mac, x.now) {
		s.b.Discovered(x.c.mac, x.c.arch, x.c.vendor)
	}
	return false
}

// stepServerID fixes option 54: the unicast address the request was sent to,
// else Config.ServerIP. A REQUEST, DECLINE or RELEASE naming another server is
// not for us (RFC 2131 §4.3.2, §3.1 step 3): silence.
func (s *Server) stepServerID(x *exchange) bool {
	x.serverID = s.cfg.ServerIP
	if a := x.dst.Addr().Unmap(); a.Is4() && !a.IsUnspecified() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && !a.IsMulticast() && !s.isSubnetBroadcast(a) {
		x.serverID = a
	}
	switch x.mt {
	case dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeDecline, dhcpv4.MessageTypeRelease:
		if sid := x.req.Options.Get(dhcpv4.OptionServerIdentifier); len(sid) == 4 && netip.AddrFrom4([4]byte(sid)) != x.serverID {
			return x.silence("other_server", nil)
		}
	}
	return false
}

func (s *Server) isSubnetBroadcast(a netip.Addr) bool {
	for i := range s.cfg.Subnets {
		p := s.cfg.Subnets[i].CIDR.Masked()
		if p.Contains(a) && a == lastAddr(p) {
			return true
		}
	}
	return false
}

// stepSubnet chooses the subnet by giaddr (relayed, RFC 2131 §4.3.1) or by
// the server address the request came in on.
func (s *Server) stepSubnet(x *exchange) bool {
	key := x.serverID
	if gi, ok := netip.AddrFromSlice(x.req.GatewayIPAddr.To4()); ok && !gi.IsUnspecified() {
		key = gi
	}
	for i := range s.cfg.Subnets {
		if s.cfg.Subnets[i].CIDR.Contains(key) {
			x.sn = &s.cfg.Subnets[i]
			return false
		}
	}
	return x.silence("no_subnet", fmt.Errorf("%w: %v", ErrNoSubnet, key))
}

func (s *Server) newReply(x *exchange, t dhcpv4.MessageType) *dhcpv4.DHCPv4 {
	r := x.req
	resp := &dhcpv4.DHCPv4{
		OpCode:        dhcpv4.OpcodeBootReply,
		HWType:        r.HWType,
		TransactionID: r.TransactionID,
		Flags:         r.Flags,
		ClientHWAddr:  r.ClientHWAddr,
		ClientIPAddr:  net.IPv4zero,
		YourIPAddr:    net.IPv4zero,
		ServerIPAddr:  net.IPv4zero,
		GatewayIPAddr: r.GatewayIPAddr,
		Options:       dhcpv4.Options{},
	}
	if resp.GatewayIPAddr == nil {
		resp.GatewayIPAddr = net.IPv4zero
	}
	resp.UpdateOption(dhcpv4.OptMessageType(t))
	return resp
}

func (s *Server) leaseTime(sn *Subnet) time.Duration {
	if sn.LeaseTime > 0 {
		return sn.LeaseTime
	}
	return DefaultLeaseTime
}

// reservation returns the machine's reserved address when it lies in sn.
func (x *exchange) reservation() (netip.Addr, bool) {
	if x.c.known && x.c.machine.IP.Is4() && x.sn.CIDR.Contains(x.c.machine.IP) {
		return x.c.machine.IP, true
	}
	return netip.Addr{}, false
}

func optIP(o dhcpv4.Options, code dhcpv4.OptionCode) netip.Addr {
	if v := o.Get(code); len(v) == 4 {
		return netip.AddrFrom4([4]byte(v))
	}
	return netip.Addr{}
}

func ip4(ip net.IP) netip.Addr {
	if a, ok := netip.AddrFromSlice(ip.To4()); ok && !a.IsUnspecified() {
		return a
	}
	return netip.Addr{}
}

// stepLease is the RFC 2131 §4.3 state machine of the authoritative server.
// While the server cannot commit (Membership.CanCommit false) it offers
// nothing and answers only a renewal (RENEWING or REBINDING, see renewal)
// of the client's committed, unexpired binding, with the time left on it
// (never beyond it: the idea of the failover protocol's Maximum Client Lead
// Time) and nothing to commit.
func (s *Server) stepLease(x *exchange) bool {
	mac := x.c.mac
	canCommit := x.mt == dhcpv4.MessageTypeInform || s.b.CanCommit()
	switch x.mt {
	case dhcpv4.MessageTypeDiscover:
		if !canCommit {
			return x.silence("no_quorum", nil)
		}
		ip, ok := x.reservation()
		if !ok {
			ip, ok = s.leases.offer(x.sn, mac, optIP(x.req.Options, dhcpv4.OptionRequestedIPAddress), x.now, s.cfg.OfferHold, x.sh)
			if !ok {
				return x.silence("pool_exhausted", fmt.Errorf("%w: %v", ErrPoolExhausted, x.sn.CIDR))
			}
		}
		x.resp = s.newReply(x, dhcpv4.MessageTypeOffer)
		x.resp.YourIPAddr = ip.AsSlice()
	case dhcpv4.MessageTypeRequest:
		want := optIP(x.req.Options, dhcpv4.OptionRequestedIPAddress)
		if !want.IsValid() {
			want = ip4(x.req.ClientIPAddr) // RENEWING / REBINDING
		}
		if !canCommit {
			if !renewal(x.req) {
				// SELECTING and INIT-REBOOT are no claim of a binding the
				// client still holds: it may have released it a moment
				// ago, and this node's view may not show the release yet
				// (nor the next client's binding). Only a log that commits
				// may answer them.
				return x.silence("no_quorum", nil)
			}
			until, ok := s.leases.committedBinding(mac, want, x.now)
			left := until.Sub(x.now).Truncate(time.Second)
			if !ok || left < time.Second || !s.acceptable(x, want) {
				return x.silence("no_quorum", nil)
			}
			x.leaseTime = left
		} else if !s.acceptable(x, want) {
			x.resp = s.nak(x, "requested address not available")
			return false
		} else {
			l := s.leases.bind(mac, want, x.c.machine.Hostname, x.now.Add(s.leaseTime(x.sn)))
			x.lease = &l
		}
		x.resp = s.newReply(x, dhcpv4.MessageTypeAck)
		x.resp.YourIPAddr = want.AsSlice()
		x.resp.ClientIPAddr = x.req.ClientIPAddr
	case dhcpv4.MessageTypeDecline:
		if !canCommit {
			return x.silence("no_quorum", nil)
		}
		if ip := optIP(x.req.Options, dhcpv4.OptionRequestedIPAddress); ip.IsValid() && x.sn.CIDR.Contains(ip) {
			l := s.leases.decline(mac, ip, x.now, s.cfg.DeclineHold)
			x.lease = &l
		}
		return true
	case dhcpv4.MessageTypeRelease:
		if !canCommit {
			return x.silence("no_quorum", nil)
		}
		if l, ok := s.leases.release(mac, ip4(x.req.ClientIPAddr)); ok {
			x.lease = &l
		}
		return true
	case dhcpv4.MessageTypeInform:
		x.resp = s.newReply(x, dhcpv4.MessageTypeAck)
		x.resp.ClientIPAddr = x.req.ClientIPAddr
	default:
		return x.silence("unsupported_type", nil)
	}
	return false
}

// renewal reports whether r is a RENEWING or REBINDING REQUEST (RFC 2131
// §4.3.2, table 5): ciaddr set, neither option 50 nor option 54. That
// client holds the binding it asks to extend (it has not released it), so
// the binding's committed expiry, which only a release or decline of the
// same client could shorten, bounds what it may be told.
func renewal(r *dhcpv4.DHCPv4) bool {
	return ip4(r.ClientIPAddr).IsValid() && r.Options.Get(dhcpv4.OptionRequestedIPAddress) == nil &&
		r.Options.Get(dhcpv4.OptionServerIdentifier) == nil
}

// acceptable: the address is in the subnet and is the machine's reservation,
// or (no reservation) a pool address free for or held by this MAC.
func (s *Server) acceptable(x *exchange, ip netip.Addr) bool {
	if !ip.Is4() || !x.sn.CIDR.Contains(ip) {
		return false
	}
	if r, ok := x.reservation(); ok {
		return ip == r
	}
	return inPool(x.sn, ip) && s.leases.FreeFor(ip, x.c.mac, x.now)
}

// stepNetwork adds the subnet's options to OFFER/ACK (RFC 2132 §3, §9).
func (s *Server) stepNetwork(x *exchange) bool {
	if x.resp == nil || x.resp.MessageType() == dhcpv4.MessageTypeNak {
		return false
	}
	sn := x.sn
	x.resp.UpdateOption(dhcpv4.OptSubnetMask(net.CIDRMask(sn.CIDR.Bits(), 32)))
	if sn.Router.Is4() {
		x.resp.UpdateOption(dhcpv4.OptRouter(sn.Router.AsSlice()))
	}
	if len(sn.DNS) > 0 {
		ips := make([]net.IP, 0, len(sn.DNS))
		for _, d := range sn.DNS {
			ips = append(ips, d.AsSlice())
		}
		x.resp.UpdateOption(dhcpv4.OptDNS(ips...))
	}
	if x.mt != dhcpv4.MessageTypeInform {
		lt := s.leaseTime(sn)
		if x.leaseTime > 0 {
			lt = x.leaseTime
		}
		x.resp.UpdateOption(dhcpv4.OptIPAddressLeaseTime(lt))
		x.resp.UpdateOption(dhcpv4.OptRenewTimeValue(lt / 2))
		x.resp.UpdateOption(dhcpv4.OptRebindingTimeValue(lt * 7 / 8))
	}
	if h := x.c.machine.Hostname; x.c.known && h != "" {
		x.resp.UpdateOption(dhcpv4.OptHostName(h))
	}
	return false
}

// stepProxy is proxyDHCP (PXE 2.1 §2.2.2): only PXE/HTTP boot clients that are
// to be netbooted; a DISCOVER on the DHCP port gets an OFFER without address,
// a REQUEST (or INFORM) on the proxy port an ACK.
func (s *Server) stepProxy(x *exchange) bool {
	if !x.c.pxe && !x.c.http {
		return x.silence("not_pxe", nil)
	}
	if _, ok := s.bootFor(&x.c); !ok {
		return x.silence("no_boot", nil)
	}
	switch {
	case !x.proxyPort && x.mt == dhcpv4.MessageTypeDiscover:
		x.resp = s.newReply(x, dhcpv4.MessageTypeOffer)
	case x.proxyPort && (x.mt == dhcpv4.MessageTypeRequest || x.mt == dhcpv4.MessageTypeInform):
		x.resp = s.newReply(x, dhcpv4.MessageTypeAck)
		x.resp.ClientIPAddr = x.req.ClientIPAddr
	default:
		return x.silence("proxy_ignored", nil)
	}
	return false
}

// pxeVendorOpts is option 43 with PXE_DISCOVERY_CONTROL (6) = 8: boot from
// the file name at once, no boot server discovery (PXE 2.1 table 2-1).
var pxeVendorOpts = []byte{6, 1, 8, 255}

// stepBoot adds the boot answer: file (NUL-padded) and option 67; siaddr,
// sname and option 66 all naming the TFTP server; option 60 PXEClient plus
// option 43, or HTTPClient; option 97 echoed when the client sent it.
func (s *Server) stepBoot(x *exchange) bool {
	if x.resp == nil || x.resp.MessageType() == dhcpv4.MessageTypeNak {
		return false
	}
	b, ok := s.bootFor(&x.c)
	if !ok {
		return false
	}
	if len(b.file) > s.cfg.MaxFileLen {
		return x.silence("field_too_long", fmt.Errorf("%w: boot file %d bytes for %v", ErrFieldTooLong, len(b.file), x.c.mac))
	}
	ts := s.cfg.tftpServer()
	x.resp.ServerIPAddr = ts.AsSlice()
	x.resp.ServerHostName = ts.String()
	x.resp.BootFileName = b.file
	x.resp.UpdateOption(dhcpv4.OptTFTPServerName(ts.String()))
	x.resp.UpdateOption(dhcpv4.OptBootFileName(b.file))
	switch {
	case b.http:
		x.resp.UpdateOption(dhcpv4.OptClassIdentifier("HTTPClient"))
	case b.pxe:
		x.resp.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient"))
		x.resp.UpdateOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(optVendorSpecific), pxeVendorOpts))
	}
	if v := x.req.Options.Get(dhcpv4.GenericOptionCode(optClientMachine)); v != nil {
		x.resp.UpdateOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(optClientMachine), v))
	}
	return false
}

// stepReply sets option 54, echoes option 82 unchanged (written last by
// encode, RFC 3046 §2.2) and picks the destination (RFC 2131 §4.1):
// giaddr:67 when relayed; the sender for the proxy port; broadcast for a NAK;
// ciaddr:68 when set; else the limited broadcast out of the ingress interface.
func (s *Server) stepReply(x *exchange) bool {
	if x.resp == nil {
		return true
	}
	x.resp.UpdateOption(dhcpv4.OptServerIdentifier(x.serverID.AsSlice()))
	if v := x.req.Options.Get(dhcpv4.GenericOptionCode(optRelayAgentInfo)); v != nil {
		x.resp.Options[optRelayAgentInfo] = append([]byte(nil), v...)
	}
	bcast := netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), uint16(s.cfg.ClientPort))
	switch gi, ci := ip4(x.req.GatewayIPAddr), ip4(x.req.ClientIPAddr); {
	case gi.IsValid():
		x.replyTo = netip.AddrPortFrom(gi, uint16(s.cfg.ListenPort))
	case x.proxyPort && x.src.Addr().Unmap().Is4() && !x.src.Addr().IsUnspecified():
		x.replyTo = netip.AddrPortFrom(x.src.Addr().Unmap(), x.src.Port())
	case x.resp.MessageType() == dhcpv4.MessageTypeNak:
		x.replyTo = bcast
	case ci.IsValid():
		x.replyTo = netip.AddrPortFrom(ci, uint16(s.cfg.ClientPort))
	default:
		x.replyTo = bcast
	}
	return false
}

func msgLabel(t dhcpv4.MessageType) string {
	switch t {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeOffer, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeDecline,
		dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak, dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform:
		return t.String()
	}
	return "none"
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	var o [4]byte
	binary.BigEndian.PutUint32(o[:], v)
	return netip.AddrFrom4(o)
}
