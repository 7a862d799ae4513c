package tftp

import (
	"fmt"
	"net"
	"time"
)

// Defaults applied by Config.WithDefaults to zero fields.
const (
	// DefaultAddr is the standard TFTP port on every address (RFC 1350 §4).
	DefaultAddr = ":69"
	// DefaultMaxBlockSize is the largest blksize on a 1500-byte Ethernet link:
	// MTU 1500 − 32 (IPv4 20 + UDP 8 + TFTP DATA header 4).
	DefaultMaxBlockSize = 1468
	// DefaultMaxTransfers bounds concurrent transfers.
	DefaultMaxTransfers = 256
	// DefaultTimeout is the wait for one ACK before a DATA packet is resent.
	DefaultTimeout = 2 * time.Second
	// DefaultRetries is the number of resends of one unacknowledged packet
	// before the transfer is given up (so 1 + 5 sends, 2 s apart).
	DefaultRetries = 5

	// MinBlockSize is RFC 1350's fixed block size, the RFC 2348 floor that a
	// server may not go below.
	MinBlockSize = 512
	// MaxLargeBlockSize is RFC 2348's ceiling (65464 octets).
	MaxLargeBlockSize = 65464
)

// Config configures the TFTP server. Zero fields take the named defaults
// (WithDefaults); Validate reports out-of-range values.
type Config struct {
	// Addr is the UDP listen address, host:port. Default ":69".
	Addr string `yaml:"addr"`
	// Root is an optional directory of extra files served read-only
	// (e.g. site-specific iPXE builds). Empty: only the embedded iPXE binaries.
	Root string `yaml:"root"`
	// MaxBlockSize caps the negotiated blksize in octets (RFC 2348). It is
	// further clamped per request to the receiving link's MTU − 32 (IPv4 +
	// UDP + TFTP header; − 52 on IPv6). Without AllowLargeBlocks it may not
	// exceed 1468.
	MaxBlockSize int `yaml:"max_block_size"`
	// AllowLargeBlocks allows MaxBlockSize above 1468 (jumbo-frame links);
	// such blocks fragment on a 1500-byte link, which some firmware mishandles.
	AllowLargeBlocks bool `yaml:"allow_large_blocks"`
	// MaxTransfers bounds concurrent transfers; one more gets ERROR 0 "server busy".
	MaxTransfers int `yaml:"max_transfers"`
	// Timeout is the wait for one ACK before a resend.
	Timeout time.Duration `yaml:"timeout"`
	// Retries is the number of resends of one unacknowledged packet (after
	// the first send, each Timeout apart) before the transfer fails and the
	// client is sent ERROR 0 "timed out".
	Retries int `yaml:"retries"`
}

// WithDefaults returns c with every zero field set to its named default.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = DefaultMaxBlockSize
	}
	if c.MaxTransfers == 0 {
		c.MaxTransfers = DefaultMaxTransfers
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	return c
}

// Validate reports the first invalid field, wrapping ErrConfig. It expects
// defaults applied (zero values are invalid).
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("%w: addr %q: %v", ErrConfig, c.Addr, err)
	}
	if c.MaxBlockSize < MinBlockSize || c.MaxBlockSize > MaxLargeBlockSize {
		return fmt.Errorf("%w: max_block_size %d outside [%d, %d]", ErrConfig, c.MaxBlockSize, MinBlockSize, MaxLargeBlockSize)
	}
	if c.MaxBlockSize > DefaultMaxBlockSize && !c.AllowLargeBlocks {
		return fmt.Errorf("%w: max_block_size %d > %d needs allow_large_blocks", ErrConfig, c.MaxBlockSize, DefaultMaxBlockSize)
	}
	if c.MaxTransfers < 1 {
		return fmt.Errorf("%w: max_transfers %d < 1", ErrConfig, c.MaxTransfers)
	}
	if c.Timeout < 10*time.Millisecond || c.Timeout > time.Minute {
		return fmt.Errorf("%w: timeout %s outside [10ms, 1m]", ErrConfig, c.Timeout)
	}
	if c.Retries < 1 || c.Retries > 50 {
		return fmt.Errorf("%w: retries %d outside [1, 50]", ErrConfig, c.Retries)
	}
	return nil
}
