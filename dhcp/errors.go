package dhcp

import "errors"

// Sentinel errors of the dhcp package. Callers match them with errors.Is; the
// package wraps them with %w and context.
var (
	// ErrInvalidConfig: Config.Validate found a field out of range or missing.
	ErrInvalidConfig = errors.New("dhcp: invalid config")
	// ErrPortInUse: another socket already holds the DHCP (or proxyDHCP) port on
	// the interface; the server refuses to share it (no SO_REUSEPORT).
	ErrPortInUse = errors.New("dhcp: port already in use")
	// ErrFieldTooLong: a value does not fit its fixed BOOTP field (file 127
	// bytes + NUL, sname 63 bytes + NUL, RFC 2131 §2); it is rejected, never
	// truncated.
	ErrFieldTooLong = errors.New("dhcp: value too long for BOOTP field")
	// ErrMalformed: the request is not a usable BOOTREQUEST (wrong op, no
	// message type, hardware address not Ethernet-sized, or a group or
	// all-zero client hardware address).
	ErrMalformed = errors.New("dhcp: malformed request")
	// ErrNoSubnet: no configured subnet matches the request's giaddr or ingress
	// address.
	ErrNoSubnet = errors.New("dhcp: no subnet for request")
	// ErrPoolExhausted: the subnet's pool has no free address.
	ErrPoolExhausted = errors.New("dhcp: pool exhausted")
	// ErrPersist: the Backend could not commit a lease batch; the ACKs of
	// that batch are not sent.
	ErrPersist = errors.New("dhcp: persisting leases failed")
	// ErrAddressTaken: the lease record refused a change because another
	// client holds the address (or it is declined). A LeaseCommitter wraps
	// it; the server answers the REQUEST with a NAK.
	ErrAddressTaken = errors.New("dhcp: address held by another client")
)
