package httpboot

import (
	"fmt"
	"net"
	"net/url"
	"time"
)

// Unknown-machine policies (Config.UnknownPolicy).
const (
	// PolicyExit: an unknown MAC gets a script that exits to the local disk.
	PolicyExit = "exit"
	// PolicyDiscover: an unknown MAC boots the agent without a machine ID or
	// token, so it registers itself for discovery.
	PolicyDiscover = "discover"
)

// Defaults applied by Config.WithDefaults to zero fields.
const (
	DefaultAddr              = ":8080"
	DefaultUnknownPolicy     = PolicyExit
	DefaultFetchTimeout      = 30 * time.Second // iPXE --timeout per kernel/initrd fetch
	DefaultFetchRetries      = 5                // kernel+initrd+boot attempts before reboot
	DefaultRetryDelay        = 3 * time.Second  // iPXE sleep between attempts (whole seconds)
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultShutdownTimeout   = 10 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block (bytes). Boot
	// firmware sends a few short headers; net/http's default is 1 MiB.
	DefaultMaxHeaderBytes = 16 << 10
)

// Config configures the HTTP boot server. Zero fields take the named
// defaults (WithDefaults); Validate reports the rest.
type Config struct {
	// Addr is the TCP listen address, host:port. Default ":8080".
	Addr string `yaml:"addr"`
	// BaseURL is how booting machines reach this server, e.g.
	// "http://10.0.0.2:8080" (no trailing slash). Required. It is placed in
	// scripts, so it must pass the URL whitelist (see Script).
	BaseURL string `yaml:"base_url"`
	// AgentURL is the appliance API URL handed to the agent as kiln.url.
	// Required; same whitelist.
	AgentURL string `yaml:"agent_url"`
	// EnvDir holds the in-RAM environment: files "vmlinuz" and "initramfs".
	EnvDir string `yaml:"env_dir"`
	// ImageDir is the image catalog directory (created if missing).
	ImageDir string `yaml:"image_dir"`
	// UnknownPolicy is PolicyExit (default) or PolicyDiscover.
	UnknownPolicy string `yaml:"unknown_policy"`
	// KernelArgs are added to every agent kernel command line (e.g.
	// "console=ttyS0,115200"). Each must pass the argument whitelist.
	KernelArgs []string `yaml:"kernel_args"`
	// FetchTimeout is iPXE's --timeout for each kernel/initrd fetch.
	FetchTimeout time.Duration `yaml:"fetch_timeout"`
	// FetchRetries is the number of attempts before the script reboots.
	FetchRetries int `yaml:"fetch_retries"`
	// RetryDelay is the pause between attempts (rounded up to whole seconds).
	RetryDelay time.Duration `yaml:"retry_delay"`
	// AllowUpload enables PUT /images/{name}. Off by default: the REST API
	// normally calls Catalog.Upload itself, behind its own auth.
	AllowUpload bool `yaml:"allow_upload"`
	// ReadHeaderTimeout, IdleTimeout bound slow clients; there is no write
	// timeout because image downloads are long, and no read timeout because
	// no request has a body (ServeHTTP refuses one at once).
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's header block (bytes).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// ShutdownTimeout bounds the graceful drain when the context ends.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
}

// WithDefaults returns c with every zero field set to its named default.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.UnknownPolicy == "" {
		c.UnknownPolicy = DefaultUnknownPolicy
	}
	if c.FetchTimeout == 0 {
		c.FetchTimeout = DefaultFetchTimeout
	}
	if c.FetchRetries == 0 {
		c.FetchRetries = DefaultFetchRetries
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	return c
}

// Validate reports the first invalid field, wrapping ErrConfig. It expects
// defaults applied.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("%w: addr %q: %v", ErrConfig, c.Addr, err)
	}
	for _, u := range []struct{ name, v string }{{"base_url", c.BaseURL}, {"agent_url", c.AgentURL}} {
		pu, err := url.Parse(u.v)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("%w: %s %q must be an absolute http(s) URL", ErrConfig, u.name, u.v)
		}
		if !safeURL(u.v) || u.v[len(u.v)-1] == '/' {
			return fmt.Errorf("%w: %s %q has characters unsafe in an iPXE script or a trailing slash", ErrConfig, u.name, u.v)
		}
	}
	if c.UnknownPolicy != PolicyExit && c.UnknownPolicy != PolicyDiscover {
		return fmt.Errorf("%w: unknown_policy %q (want exit|discover)", ErrConfig, c.UnknownPolicy)
	}
	for _, a := range c.KernelArgs {
		if !safeArg(a) || reservedArg(a) {
			return fmt.Errorf("%w: kernel_args %q has unsafe characters", ErrConfig, a)
		}
	}
	if c.FetchTimeout < time.Second || c.FetchTimeout > 10*time.Minute {
		return fmt.Errorf("%w: fetch_timeout %s outside [1s, 10m]", ErrConfig, c.FetchTimeout)
	}
	if c.FetchRetries < 1 || c.FetchRetries > 100 {
		return fmt.Errorf("%w: fetch_retries %d outside [1, 100]", ErrConfig, c.FetchRetries)
	}
	if c.RetryDelay < 0 || c.RetryDelay > 10*time.Minute {
		return fmt.Errorf("%w: retry_delay %s outside [0, 10m]", ErrConfig, c.RetryDelay)
	}
	if c.ReadHeaderTimeout <= 0 || c.IdleTimeout <= 0 || c.ShutdownTimeout <= 0 {
		return fmt.Errorf("%w: timeouts must be positive", ErrConfig)
	}
	if c.MaxHeaderBytes < 1<<10 {
		return fmt.Errorf("%w: max_header_bytes %d below 1024", ErrConfig, c.MaxHeaderBytes)
	}
	return nil
}
