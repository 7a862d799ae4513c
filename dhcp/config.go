package dhcp

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// Mode selects how the server answers.
type Mode string

const (
	// ModeAuthoritative: full DHCP (RFC 2131) for the provisioning networks —
	// reservations for known machines, a pool for unknown ones, NAKs for wrong
	// addresses.
	ModeAuthoritative Mode = "authoritative"
	// ModeProxy: proxyDHCP beside an existing DHCP server (PXE spec 2.1 §2.2.2):
	// only PXE/HTTP boot clients get an answer, without an address, on port 67
	// (OFFER) and on ProxyPort (ACK to a unicast REQUEST).
	ModeProxy Mode = "proxy"
)

// Named defaults.
const (
	DefaultListenPort       = 67
	DefaultProxyPort        = 4011
	DefaultWorkers          = 4
	DefaultQueueLen         = 1024 // ~0.2 s of work at 5k packets/s: bounded queueing, no bufferbloat
	DefaultPerMACRate       = 20   // packets per second per MAC (burst = 2x)
	DefaultLeaseTime        = time.Hour
	DefaultOfferHold        = 30 * time.Second
	DefaultDeclineHold      = 10 * time.Minute
	DefaultDiscoverInterval = time.Minute
	DefaultBatchMax         = 512
	DefaultReadBuffer       = 1 << 20 // bytes of socket receive buffer (~0.1-0.2 s of requests at 5k/s)
	DefaultBatchDelay       = 0       // natural group commit: no linger
	DefaultSaveTimeout      = 5 * time.Second
	// DefaultBalanceWait: a client another member owns (RFC 3074) is
	// answered once its secs field shows it waited this long.
	DefaultBalanceWait = 3 * time.Second
	// MaxFileLen is the longest boot file name the BOOTP file field holds
	// (128 bytes with a terminating NUL, RFC 951).
	MaxFileLen = 127
	// MaxSnameLen is the longest server name the BOOTP sname field holds.
	MaxSnameLen = 63
)

// Client architecture types (option 93, RFC 4578 §2.1 and the IANA registry).
const (
	ArchBIOS      uint16 = 0
	ArchEFIIA32   uint16 = 6
	ArchEFIx64    uint16 = 7
	ArchEFIBC     uint16 = 9
	ArchEFIARM64  uint16 = 11
	ArchHTTPx64   uint16 = 16
	ArchHTTPARM64 uint16 = 19
	ArchNone      uint16 = 0xFFFF // option 93 absent
)

// DefaultTFTPBootFiles maps option 93 to the first-stage binary fetched by TFTP.
func DefaultTFTPBootFiles() map[uint16]string {
	return map[uint16]string{ArchBIOS: "undionly.kpxe", ArchEFIx64: "ipxe.efi", ArchEFIBC: "ipxe.efi", ArchEFIARM64: "snp.efi"}
}

// DefaultHTTPBootFiles maps option 93 of a UEFI HTTP boot client to the file
// appended to HTTPBootURL. A client with vendor class HTTPClient but another
// arch gets the ArchHTTPx64 entry.
func DefaultHTTPBootFiles() map[uint16]string {
	return map[uint16]string{ArchHTTPx64: "ipxe.efi", ArchHTTPARM64: "snp.efi"}
}

// Subnet is one served IPv4 network. A request is matched to a subnet by its
// giaddr (relayed) or by the address it arrived on (direct).
type Subnet struct {
	// CIDR, e.g. 10.99.0.0/24.
	CIDR netip.Prefix `yaml:"cidr"`
	// Router is option 3; invalid = omitted.
	Router netip.Addr `yaml:"router"`
	// DNS is option 6.
	DNS []netip.Addr `yaml:"dns"`
	// PoolStart..PoolEnd (inclusive) is the dynamic range for machines
	// without a reservation. Reservations should lie outside it.
	PoolStart netip.Addr `yaml:"pool_start"`
	PoolEnd   netip.Addr `yaml:"pool_end"`
	// LeaseTime is option 51; 0 = DefaultLeaseTime.
	LeaseTime time.Duration `yaml:"lease_time"`
}

// Config of the DHCP service. Decode it rejecting unknown keys, then call Validate.
type Config struct {
	// Interface is the one link the server listens on (SO_BINDTODEVICE);
	// broadcast replies leave only through it.
	Interface string `yaml:"interface"`
	// ServerIP is the server's address on Interface: option 54 for broadcast
	// requests (a unicast request's destination is used otherwise), siaddr
	// default.
	ServerIP netip.Addr `yaml:"server_ip"`
	// Mode is ModeAuthoritative or ModeProxy.
	Mode Mode `yaml:"mode"`
	// ListenPort (67) and ProxyPort (4011, proxy mode only).
	ListenPort int `yaml:"listen_port"`
	ProxyPort  int `yaml:"proxy_port"`
	// ClientPort is where direct replies go (68). Tests may change it.
	ClientPort int `yaml:"client_port"`
	// Subnets served (authoritative mode needs at least one).
	Subnets []Subnet `yaml:"subnets"`
	// TFTPServer is the next server for TFTP boot (siaddr, option 66, sname);
	// invalid = ServerIP.
	TFTPServer netip.Addr `yaml:"tftp_server"`
	// HTTPBootURL is the base of HTTP boot and iPXE script URLs, e.g.
	// http://10.99.0.1:8080 (no trailing slash).
	HTTPBootURL string `yaml:"http_boot_url"`
	// TFTPBootFiles / HTTPBootFiles: option 93 → first stage; nil = defaults.
	TFTPBootFiles map[uint16]string `yaml:"tftp_boot_files"`
	HTTPBootFiles map[uint16]string `yaml:"http_boot_files"`
	// BootUnknown: offer boot files to MACs no record knows (their iPXE
	// script decides about discovery). Default true.
	BootUnknown bool `yaml:"boot_unknown"`
	// Workers handling packets, QueueLen packets waiting for them (excess is
	// dropped and counted).
	Workers  int `yaml:"workers"`
	QueueLen int `yaml:"queue_len"`
	// ReadBuffer is the socket receive buffer in bytes (SO_RCVBUFFORCE when
	// permitted, else SO_RCVBUF capped by net.core.rmem_max): it absorbs
	// bursts while the reader is not scheduled. 0 = kernel default.
	ReadBuffer int `yaml:"read_buffer"`
	// PerMACRate is packets per second accepted per MAC (burst 2x); 0 = no limit.
	PerMACRate float64 `yaml:"per_mac_rate"`
	// MaxFileLen / MaxSnameLen cap the BOOTP file and sname fields; a longer
	// value is rejected (reply dropped, counted), never truncated. 0 = the
	// protocol limits 127 / 63.
	MaxFileLen  int `yaml:"max_file_len"`
	MaxSnameLen int `yaml:"max_sname_len"`
	// OfferHold keeps an offered address for the client; DeclineHold keeps a
	// declined address out of the pool.
	OfferHold   time.Duration `yaml:"offer_hold"`
	DeclineHold time.Duration `yaml:"decline_hold"`
	// DiscoverInterval rate-limits Backend.Discovered per MAC.
	DiscoverInterval time.Duration `yaml:"discover_interval"`
	// Group commit: a batch is every lease change queued when the previous
	// save ended, at most BatchMax; BatchDelay > 0 additionally lingers that
	// long for more (0 = no linger). SaveTimeout bounds one CommitLeases call.
	BatchMax    int           `yaml:"batch_max"`
	BatchDelay  time.Duration `yaml:"batch_delay"`
	SaveTimeout time.Duration `yaml:"save_timeout"`
	// BalanceWait: with several members (Membership), a client whose RFC
	// 3074 hash bucket another member owns is answered only once its secs
	// field (whole seconds) reaches this; 0 = answer every client at once.
	BalanceWait time.Duration `yaml:"balance_wait"`
}

// DefaultConfig returns a Config with every tunable at its named default; the
// caller fills Interface, ServerIP, Subnets and HTTPBootURL.
func DefaultConfig() Config {
	return Config{
		Mode:             ModeAuthoritative,
		ListenPort:       DefaultListenPort,
		ProxyPort:        DefaultProxyPort,
		ClientPort:       68,
		TFTPBootFiles:    DefaultTFTPBootFiles(),
		HTTPBootFiles:    DefaultHTTPBootFiles(),
		BootUnknown:      true,
		Workers:          DefaultWorkers,
		QueueLen:         DefaultQueueLen,
		ReadBuffer:       DefaultReadBuffer,
		PerMACRate:       DefaultPerMACRate,
		MaxFileLen:       MaxFileLen,
		MaxSnameLen:      MaxSnameLen,
		OfferHold:        DefaultOfferHold,
		DeclineHold:      DefaultDeclineHold,
		DiscoverInterval: DefaultDiscoverInterval,
		BatchMax:         DefaultBatchMax,
		BatchDelay:       DefaultBatchDelay,
		SaveTimeout:      DefaultSaveTimeout,
		BalanceWait:      DefaultBalanceWait,
	}
}

// Validate checks the config; errors wrap ErrInvalidConfig (or
// ErrFieldTooLong for names that cannot fit the BOOTP fields).
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(f, a...))
	}
	if c.Mode != ModeAuthoritative && c.Mode != ModeProxy {
		return bad("mode %q: want authoritative or proxy", c.Mode)
	}
	if !c.ServerIP.Is4() {
		return bad("server_ip %v: want an IPv4 address", c.ServerIP)
	}
	for _, p := range []struct {
		n string
		v int
	}{{"listen_port", c.ListenPort}, {"proxy_port", c.ProxyPort}, {"client_port", c.ClientPort}} {
		if p.v <= 0 || p.v > 65535 {
			return bad("%s %d out of range", p.n, p.v)
		}
	}
	if c.Workers <= 0 || c.QueueLen <= 0 || c.BatchMax <= 0 {
		return bad("workers, queue_len and batch_max must be > 0")
	}
	if c.ReadBuffer < 0 {
		return bad("read_buffer < 0")
	}
	if c.PerMACRate < 0 {
		return bad("per_mac_rate < 0")
	}
	if c.MaxFileLen <= 0 || c.MaxFileLen > MaxFileLen || c.MaxSnameLen <= 0 || c.MaxSnameLen > MaxSnameLen {
		return bad("max_file_len 1..%d, max_sname_len 1..%d", MaxFileLen, MaxSnameLen)
	}
	if c.OfferHold <= 0 || c.DeclineHold <= 0 || c.DiscoverInterval <= 0 || c.BatchDelay < 0 || c.SaveTimeout <= 0 {
		return bad("offer_hold, decline_hold, discover_interval, save_timeout must be > 0, batch_delay >= 0")
	}
	if c.BalanceWait < 0 {
		return bad("balance_wait < 0")
	}
	if c.Mode == ModeAuthoritative && len(c.Subnets) == 0 {
		return bad("authoritative mode needs at least one subnet")
	}
	for i, s := range c.Subnets {
		if !s.CIDR.IsValid() || !s.CIDR.Addr().Is4() {
			return bad("subnets[%d].cidr %v: want IPv4 prefix", i, s.CIDR)
		}
		if !s.CIDR.Contains(s.PoolStart) || !s.CIDR.Contains(s.PoolEnd) || s.PoolEnd.Less(s.PoolStart) {
			return bad("subnets[%d]: pool %v-%v not an ordered range inside %v", i, s.PoolStart, s.PoolEnd, s.CIDR)
		}
		if s.LeaseTime < 0 {
			return bad("subnets[%d].lease_time < 0", i)
		}
	}
	if c.HTTPBootURL != "" {
		u, err := url.Parse(c.HTTPBootURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.HasSuffix(c.HTTPBootURL, "/") {
			return bad("http_boot_url %q: want http(s)://host[:port][/path] without trailing slash", c.HTTPBootURL)
		}
		// The longest URL the server builds itself: the default iPXE script URL.
		if n := len(c.HTTPBootURL) + len("/ipxe/aa:bb:cc:dd:ee:ff"); n > c.MaxFileLen {
			return fmt.Errorf("%w: http_boot_url gives %d-byte URLs, file holds %d", ErrFieldTooLong, n, c.MaxFileLen)
		}
	}
	for _, m := range []map[uint16]string{c.TFTPBootFiles, c.HTTPBootFiles} {
		for a, f := range m {
			if f == "" || len(c.HTTPBootURL)+1+len(f) > c.MaxFileLen {
				return fmt.Errorf("%w: boot file for arch %d: %q", ErrFieldTooLong, a, f)
			}
		}
	}
	if c.TFTPServer.IsValid() && !c.TFTPServer.Is4() {
		return bad("tftp_server %v: want IPv4", c.TFTPServer)
	}
	if len(c.tftpServer().String()) > c.MaxSnameLen {
		return fmt.Errorf("%w: sname", ErrFieldTooLong)
	}
	return nil
}

func (c *Config) tftpServer() netip.Addr {
	if c.TFTPServer.IsValid() {
		return c.TFTPServer
	}
	return c.ServerIP
}
