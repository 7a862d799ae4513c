package appliance

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"kiln/appliance/lifecycle"
	"kiln/store/pki"
)

// Defaults of the embedded configuration (`kiln serve` with no --config).
const (
	DefaultNodeID       = "kiln-1"
	DefaultDataDir      = "/var/lib/kiln"
	DefaultAPIAddr      = "127.0.0.1:7480"
	DefaultRaftAddr     = "127.0.0.1:7481"
	DefaultForwardAddr  = "127.0.0.1:7482"
	DefaultBootHTTPPort = 8080
	DefaultLeaseTime    = time.Hour
	DefaultLogLevel     = "info"
	DefaultLogFormat    = "text"
	DefaultUnknown      = "discover"
	// DefaultJoinTimeout bounds a joining node's enrollment (raft.join_timeout):
	// how long New keeps trying the members listed in raft.join.
	DefaultJoinTimeout = 2 * time.Minute
	// DefaultEventsMaxAge and DefaultEventsMaxCount are the event log's
	// retention (store.events.max_age, store.events.max_count): older
	// events, and all but the newest max_count, are trimmed.
	DefaultEventsMaxAge   = 30 * 24 * time.Hour
	DefaultEventsMaxCount = 1_000_000
	// DefaultEventsTrimEvery is how often the leader applies the retention
	// (store.events.trim_every).
	DefaultEventsTrimEvery = 10 * time.Minute
)

// Config is the appliance's whole configuration. Decoded from YAML with
// unknown keys rejected (LoadConfig); Validate checks values separately.
type Config struct {
	NodeID    string          `yaml:"node_id"`
	DataDir   string          `yaml:"data_dir"`
	Log       LogConfig       `yaml:"log"`
	API       APIConfig       `yaml:"api"`
	Raft      RaftConfig      `yaml:"raft"`
	Boot      BootConfig      `yaml:"boot"`
	BMC       BMCConfig       `yaml:"bmc"`
	Lifecycle LifecycleConfig `yaml:"lifecycle"`
	Store     StoreConfig     `yaml:"store"`
	// Remediation is day 2: health, the repair ladder, drain, spares and
	// the brake (remediation_config.go).
	Remediation RemediationConfig `yaml:"remediation"`
	// Attest is the TPM attestation policy per hardware model (issue 16,
	// attest_config.go).
	Attest AttestConfig `yaml:"attest"`
	// BurnIn is the burn-in policy per hardware model (issue 17,
	// burnin_config.go).
	BurnIn BurnInConfig `yaml:"burn_in"`
}

// StoreConfig tunes the replicated store.
type StoreConfig struct {
	Events EventsConfig `yaml:"events"`
}

// EventsConfig is the event log's retention, applied by the leader every
// TrimEvery through one trim_events raft command (store.TrimEvents), so
// every replica keeps the same events. MaxAge (default
// DefaultEventsMaxAge) drops events older than it; MaxCount (default
// DefaultEventsMaxCount) keeps at most that many (plus the rest of one
// command's events). A negative value disables that bound. A feed cursor
// older than what is kept is answered 410 cursor_expired.
type EventsConfig struct {
	MaxAge    time.Duration `yaml:"max_age"`
	MaxCount  int           `yaml:"max_count"`
	TrimEvery time.Duration `yaml:"trim_every"`
}

// LogConfig selects slog's level (debug|info|warn|error) and format (text|json).
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// APIConfig is the admin REST API listener. TLS is used when both TLSCert and
// TLSKey are set. AdminTokenFile (default DATA_DIR/admin.token) holds the
// bootstrap admin token, created 0600 on first start. BodyIdleTimeout (the
// longest a request-body read waits for more bytes) and JSONBodyTimeout
// (the longest a JSON body may take to arrive whole) bound slow senders on
// the API and on the boot listener's agent routes; 0 takes
// api.DefaultBodyIdleTimeout and api.DefaultJSONBodyTimeout.
type APIConfig struct {
	Addr            string        `yaml:"addr"`
	TLSCert         string        `yaml:"tls_cert"`
	TLSKey          string        `yaml:"tls_key"`
	AdminTokenFile  string        `yaml:"admin_token_file"`
	Tokens          []TokenSpec   `yaml:"tokens"`
	BodyIdleTimeout time.Duration `yaml:"body_idle_timeout"`
	JSONBodyTimeout time.Duration `yaml:"json_body_timeout"`
	// UI is the web UI served on this listener under /ui/ (api/ui).
	UI UIConfig `yaml:"ui"`
}

// UIConfig is the web UI (api/ui, served under /ui/ on the API listener).
// Disabled turns it off. SessionTTL is how long a sign-in lasts (0:
// ui.DefaultSessionTTL, 8h); the session cookie is sealed with a key
// derived from the site key, so every node accepts it.
type UIConfig struct {
	Disabled   bool          `yaml:"disabled"`
	SessionTTL time.Duration `yaml:"session_ttl"`
}

// TokenSpec is an API token held as its SHA-256 (hex) with a role
// (admin|operator|viewer).
type TokenSpec struct {
	Name   string `yaml:"name"`
	Role   string `yaml:"role"`
	SHA256 string `yaml:"sha256"`
}

// RaftConfig places this node in the site's raft group. With Bootstrap (the
// default) a node with empty state forms a one-node cluster and makes the
// site CA and site key. A new node of an existing cluster sets bootstrap:
// false, lists members' forward addresses in Join and, for its first
// start, sets JoinToken to a token from `kiln cluster token create`: it
// then receives its certificate and the site key from a member (within
// JoinTimeout, default DefaultJoinTimeout) and asks to be added as a voter.
// Addr and ForwardAddr must be addresses the other members can reach. Raft
// and the forward RPC run over mutual TLS with the credentials in TLSDir
// (default DATA_DIR/tls: ca.crt, ca.key, node.crt, node.key, trust.crt).
// A node renews its certificate once CertRenewFraction of its lifetime has
// passed (default 2/3, store.DefaultRenewFraction); CertLifetime is the
// lifetime of the certificates this node issues to others and to itself
// (default 10 years, pki.NodeValidity; a site that wants short-lived
// certificates sets e.g. 720h on every node).
type RaftConfig struct {
	Addr        string        `yaml:"addr"`
	ForwardAddr string        `yaml:"forward_addr"`
	Bootstrap   bool          `yaml:"bootstrap"`
	Join        []string      `yaml:"join"`
	JoinToken   string        `yaml:"join_token"`
	JoinTimeout time.Duration `yaml:"join_timeout"`
	TLSDir      string        `yaml:"tls_dir"`
	// CertLifetime and CertRenewFraction: see above (0 = the defaults).
	CertLifetime      time.Duration `yaml:"cert_lifetime"`
	CertRenewFraction float64       `yaml:"cert_renew_fraction"`
}

// BootConfig is the provisioning network: DHCP, TFTP and HTTP boot. With no
// Interface, DHCP and TFTP stay off and HTTP boot listens on HTTPAddr only.
type BootConfig struct {
	Interface string `yaml:"interface"`
	// ServerIP is this node's address on the provisioning network; replies and
	// boot URLs carry it.
	ServerIP string `yaml:"server_ip"`
	// HTTPAddr is the boot HTTP listener (iPXE scripts, in-RAM environment,
	// images, agent API). Default SERVER_IP:8080.
	HTTPAddr string `yaml:"http_addr"`
	// PeerHTTPAddrs are the boot HTTP listeners (host:port, their http_addr) of the
	// site cluster's other nodes. Every agent task lists them (agentapi.Task.Endpoints),
	// so an agent whose node stops answering mid-build moves on to another node.
	PeerHTTPAddrs []string `yaml:"peer_http_addrs"`
	// TFTPAddr defaults to SERVER_IP:69 when Interface is set.
	TFTPAddr string     `yaml:"tftp_addr"`
	DHCP     DHCPConfig `yaml:"dhcp"`
	// EnvDir holds the in-RAM environment (vmlinuz, initramfs). Default DATA_DIR/env.
	EnvDir string `yaml:"env_dir"`
	// ImageDir holds the image catalog. Default DATA_DIR/images.
	ImageDir string `yaml:"image_dir"`
	// UnknownMachines is the policy for MACs no record knows: discover | exit.
	UnknownMachines string `yaml:"unknown_machines"`
	// KernelArgs are added to the in-RAM environment's kernel command line
	// (e.g. console=ttyS0,115200).
	KernelArgs []string `yaml:"kernel_args"`
}

// DHCPConfig selects the DHCP mode and the subnets served.
type DHCPConfig struct {
	Enabled bool           `yaml:"enabled"`
	Mode    string         `yaml:"mode"` // authoritative | proxy
	Port    int            `yaml:"port"` // 67 unless testing
	Subnets []SubnetConfig `yaml:"subnets"`
	// BalanceWait: in a cluster, a client that another node answers first
	// (RFC 3074 load balancing) is answered by this node once its secs
	// field shows it waited this long; unset = dhcp.DefaultBalanceWait (3s),
	// 0s = every node answers every client at once (nodes each alone on
	// their own segment).
	BalanceWait *time.Duration `yaml:"balance_wait"`
}

// SubnetConfig is one IPv4 subnet (RFC 2131: chosen by giaddr for relayed
// requests, by the ingress interface otherwise).
type SubnetConfig struct {
	CIDR      string        `yaml:"cidr"`
	Router    string        `yaml:"router"`
	DNS       []string      `yaml:"dns"`
	PoolStart string        `yaml:"pool_start"`
	PoolEnd   string        `yaml:"pool_end"`
	LeaseTime time.Duration `yaml:"lease_time"`
}

// BMCConfig sets BMC call limits and the site key that seals credentials.
type BMCConfig struct {
	KeyFile     string        `yaml:"key_file"` // default DATA_DIR/site.key
	Timeout     time.Duration `yaml:"timeout"`
	Retries     int           `yaml:"retries"`
	Concurrency int           `yaml:"concurrency"`
	// IPMICipherSuite is ipmitool's -C (e.g. "3" for OpenIPMI's ipmi_sim); "" = ipmitool's default.
	IPMICipherSuite string `yaml:"ipmi_cipher_suite"`
	// IPMIIgnoreValidBit accepts a boot-flags read-back without the "valid" bit
	// (BMCs such as ipmi_sim that keep only the device selector).
	IPMIIgnoreValidBit bool `yaml:"ipmi_ignore_valid_bit"`
}

// LifecycleConfig holds the controller's policies.
type LifecycleConfig struct {
	// StepTimeout bounds each gated-build step; past it the machine fails with reason timeout.
	StepTimeout time.Duration `yaml:"step_timeout"`
	// BootTimeout bounds the wait from a power action to the agent's first report.
	BootTimeout time.Duration `yaml:"boot_timeout"`
	// MinReadMBps is the check step's sequential-read floor (MB/s); 0 = none.
	MinReadMBps float64 `yaml:"min_read_mbps"`
	// AgentPollAfter is how often an idle in-RAM agent asks for its next task
	// (fast-track: a claim starts within this time). 0 = the lifecycle default.
	AgentPollAfter time.Duration `yaml:"agent_poll_after"`
	// RebootTimeout: a built machine not seen netbooting within this time
	// (it boots its disk first) is recorded provisioned with reason
	// reboot_unobserved. 0 = the lifecycle default (3 minutes).
	RebootTimeout time.Duration `yaml:"reboot_timeout"`
	// FirstBootTimeout (issue 15): a release build whose installed OS has
	// not sent its first-boot report within this time of the build's
	// completion is failed (reason first_boot_unreported). 0 = the
	// lifecycle default (15 minutes).
	FirstBootTimeout time.Duration `yaml:"first_boot_timeout"`
}

// DefaultConfig is the embedded default: a single self-bootstrapping node.
func DefaultConfig() Config {
	return Config{
		NodeID:  DefaultNodeID,
		DataDir: DefaultDataDir,
		Log:     LogConfig{Level: DefaultLogLevel, Format: DefaultLogFormat},
		API:     APIConfig{Addr: DefaultAPIAddr},
		Raft:    RaftConfig{Addr: DefaultRaftAddr, ForwardAddr: DefaultForwardAddr, Bootstrap: true},
		Boot: BootConfig{
			UnknownMachines: DefaultUnknown,
			DHCP:            DHCPConfig{Mode: "authoritative", Port: 67},
		},
		BMC:       BMCConfig{Timeout: 20 * time.Second, Retries: 3, Concurrency: 32},
		Lifecycle: LifecycleConfig{StepTimeout: 30 * time.Minute},
	}
}

var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type (\S+)`)

// LoadConfig reads a YAML file over DefaultConfig. An unknown key is an error
// naming the key and its line.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
			return cfg, fmt.Errorf("config %s: line %s: unknown key %q (in %s); check its spelling against deploy/examples/kiln.yaml", path, m[1], m[2], strings.TrimPrefix(m[3], "appliance."))
		}
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Validate checks values and fills derived defaults (paths under DataDir,
// boot listener addresses). It returns the first problem, naming the key.
func (c *Config) Validate() error {
	if c.NodeID == "" {
		return errors.New("config: node_id must not be empty")
	}
	if c.DataDir == "" {
		return errors.New("config: data_dir must not be empty")
	}
	if c.API.Addr == "" {
		return errors.New("config: api.addr must not be empty")
	}
	if len(c.Raft.Join) > 0 && c.Raft.Bootstrap {
		return errors.New("config: raft.join and raft.bootstrap exclude each other: a joining node sets bootstrap: false")
	}
	if c.API.AdminTokenFile == "" {
		c.API.AdminTokenFile = c.DataDir + "/admin.token"
	}
	if c.BMC.KeyFile == "" {
		c.BMC.KeyFile = c.DataDir + "/site.key"
	}
	if c.Raft.TLSDir == "" {
		c.Raft.TLSDir = c.DataDir + "/tls"
	}
	if c.Raft.JoinTimeout == 0 {
		c.Raft.JoinTimeout = DefaultJoinTimeout
	}
	if c.Store.Events.MaxAge == 0 {
		c.Store.Events.MaxAge = DefaultEventsMaxAge
	}
	if c.Store.Events.MaxCount == 0 {
		c.Store.Events.MaxCount = DefaultEventsMaxCount
	}
	if c.Store.Events.TrimEvery == 0 {
		c.Store.Events.TrimEvery = DefaultEventsTrimEvery
	}
	if c.Store.Events.TrimEvery < 0 {
		return fmt.Errorf("config: store.events.trim_every %s: must be positive (e.g. 10m)", c.Store.Events.TrimEvery)
	}
	if c.Raft.JoinToken != "" {
		if len(c.Raft.Join) == 0 {
			return errors.New("config: raft.join_token needs raft.join (the members' forward addresses)")
		}
		if _, err := pki.ParseToken(c.Raft.JoinToken); err != nil {
			return fmt.Errorf("config: raft.join_token: %w", err)
		}
	}
	if c.Boot.EnvDir == "" {
		c.Boot.EnvDir = c.DataDir + "/env"
	}
	if c.Boot.ImageDir == "" {
		c.Boot.ImageDir = c.DataDir + "/images"
	}
	switch c.Boot.UnknownMachines {
	case "discover", "exit":
	default:
		return fmt.Errorf("config: boot.unknown_machines %q: want discover or exit", c.Boot.UnknownMachines)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config: log.level %q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return fmt.Errorf("config: log.format %q: want text or json", c.Log.Format)
	}
	if c.Boot.ServerIP != "" {
		if _, err := netip.ParseAddr(c.Boot.ServerIP); err != nil {
			return fmt.Errorf("config: boot.server_ip: %w", err)
		}
	}
	host := c.Boot.ServerIP
	if host == "" {
		host = "127.0.0.1"
	}
	if c.Boot.HTTPAddr == "" {
		c.Boot.HTTPAddr = fmt.Sprintf("%s:%d", host, DefaultBootHTTPPort)
	}
	if c.Boot.Interface != "" {
		if c.Boot.ServerIP == "" {
			return errors.New("config: boot.server_ip is required when boot.interface is set")
		}
		if c.Boot.TFTPAddr == "" {
			c.Boot.TFTPAddr = c.Boot.ServerIP + ":69"
		}
	}
	if err := c.validateValues(); err != nil {
		return err
	}
	if c.Boot.DHCP.Enabled {
		if c.Boot.Interface == "" {
			return errors.New("config: boot.dhcp.enabled needs boot.interface")
		}
		if c.Boot.DHCP.Mode != "authoritative" && c.Boot.DHCP.Mode != "proxy" {
			return fmt.Errorf("config: boot.dhcp.mode %q: want authoritative or proxy", c.Boot.DHCP.Mode)
		}
		if w := c.Boot.DHCP.BalanceWait; w != nil && *w < 0 {
			return fmt.Errorf("config: boot.dhcp.balance_wait %v: want 0 or more", *w)
		}
		if c.Boot.DHCP.Mode == "authoritative" && len(c.Boot.DHCP.Subnets) == 0 {
			return errors.New("config: boot.dhcp.subnets: authoritative mode needs at least one subnet")
		}
		for i, s := range c.Boot.DHCP.Subnets {
			if _, err := netip.ParsePrefix(s.CIDR); err != nil {
				return fmt.Errorf("config: boot.dhcp.subnets[%d].cidr: %w", i, err)
			}
			if s.LeaseTime == 0 {
				c.Boot.DHCP.Subnets[i].LeaseTime = DefaultLeaseTime
			}
		}
	}
	return nil
}

// validateValues checks, before anything is created on disk, the values that
// the services would otherwise reject only after the store is open (and then
// without the config key's name): listen addresses, API tokens, TLS files,
// negative durations and counts, and each DHCP subnet's addresses.
func (c *Config) validateValues() error {
	addrs := []struct{ key, v string }{
		{"api.addr", c.API.Addr}, {"raft.addr", c.Raft.Addr}, {"raft.forward_addr", c.Raft.ForwardAddr},
		{"boot.http_addr", c.Boot.HTTPAddr}, {"boot.tftp_addr", c.Boot.TFTPAddr},
	}
	for _, p := range c.Boot.PeerHTTPAddrs {
		addrs = append(addrs, struct{ key, v string }{"boot.peer_http_addrs", p})
	}
	for _, a := range addrs {
		if a.v == "" && a.key != "api.addr" && a.key != "boot.peer_http_addrs" {
			continue
		}
		_, port, err := net.SplitHostPort(a.v)
		if err != nil {
			return fmt.Errorf("config: %s %q: want host:port: %v", a.key, a.v, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("config: %s %q: port must be a number 0..65535", a.key, a.v)
		}
	}
	if (c.API.TLSCert == "") != (c.API.TLSKey == "") {
		return errors.New("config: api.tls_cert and api.tls_key must be set together")
	}
	for _, f := range []struct{ key, path string }{{"api.tls_cert", c.API.TLSCert}, {"api.tls_key", c.API.TLSKey}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("config: %s: %w", f.key, err)
		}
	}
	for i, t := range c.API.Tokens {
		if t.Name == "" {
			return fmt.Errorf("config: api.tokens[%d].name must not be empty", i)
		}
		switch t.Role {
		case "admin", "operator", "viewer":
		default:
			return fmt.Errorf("config: api.tokens[%d].role %q: want admin, operator or viewer", i, t.Role)
		}
		if b, err := hex.DecodeString(t.SHA256); err != nil || len(b) != 32 {
			return fmt.Errorf("config: api.tokens[%d].sha256: want the 64 hex digits of the token's SHA-256", i)
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"bmc.timeout", c.BMC.Timeout}, {"lifecycle.step_timeout", c.Lifecycle.StepTimeout},
		{"api.body_idle_timeout", c.API.BodyIdleTimeout}, {"api.json_body_timeout", c.API.JSONBodyTimeout},
		{"api.ui.session_ttl", c.API.UI.SessionTTL},
		{"lifecycle.boot_timeout", c.Lifecycle.BootTimeout}, {"lifecycle.agent_poll_after", c.Lifecycle.AgentPollAfter},
		{"lifecycle.reboot_timeout", c.Lifecycle.RebootTimeout}, {"raft.join_timeout", c.Raft.JoinTimeout},
		{"lifecycle.first_boot_timeout", c.Lifecycle.FirstBootTimeout},
		{"raft.cert_lifetime", c.Raft.CertLifetime},
	} {
		if d.v < 0 {
			return fmt.Errorf("config: %s %s: must not be negative", d.key, d.v)
		}
	}
	if f := c.Raft.CertRenewFraction; f < 0 || f >= 1 {
		return fmt.Errorf("config: raft.cert_renew_fraction %v: want a fraction of the certificate's lifetime, 0 < f < 1 (0 = 2/3)", f)
	}
	if l := c.Raft.CertLifetime; l != 0 && l < time.Minute {
		return fmt.Errorf("config: raft.cert_lifetime %s: want at least 1m (0 = 10 years)", l)
	}
	if c.BMC.Retries < 0 || c.BMC.Concurrency < 0 {
		return errors.New("config: bmc.retries and bmc.concurrency must not be negative")
	}
	if c.Lifecycle.MinReadMBps < 0 {
		return errors.New("config: lifecycle.min_read_mbps must not be negative")
	}
	if err := lifecycle.CheckRemediation(c.Remediation.lifecycle()); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := c.Attest.validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if c.BurnIn.Deadline < 0 {
		return fmt.Errorf("config: burn_in.deadline %s: must not be negative", c.BurnIn.Deadline)
	}
	if err := lifecycle.CheckBurnIn(c.BurnIn.lifecycle(), c.BurnIn.Deadline); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for i, s := range c.Boot.DHCP.Subnets {
		key := fmt.Sprintf("boot.dhcp.subnets[%d]", i)
		pfx, err := netip.ParsePrefix(s.CIDR)
		if err != nil {
			return fmt.Errorf("config: %s.cidr: %w", key, err)
		}
		if s.LeaseTime < 0 {
			return fmt.Errorf("config: %s.lease_time %s: must not be negative", key, s.LeaseTime)
		}
		addr := func(field, v string) (netip.Addr, error) {
			if v == "" {
				return netip.Addr{}, nil
			}
			a, err := netip.ParseAddr(v)
			if err != nil {
				return a, fmt.Errorf("config: %s.%s: %w", key, field, err)
			}
			return a, nil
		}
		if _, err := addr("router", s.Router); err != nil {
			return err
		}
		for j, d := range s.DNS {
			if _, err := addr(fmt.Sprintf("dns[%d]", j), d); err != nil {
				return err
			}
		}
		start, err := addr("pool_start", s.PoolStart)
		if err != nil {
			return err
		}
		end, err := addr("pool_end", s.PoolEnd)
		if err != nil {
			return err
		}
		if start.IsValid() != end.IsValid() {
			return fmt.Errorf("config: %s: pool_start and pool_end must be set together", key)
		}
		if start.IsValid() {
			if !pfx.Contains(start) || !pfx.Contains(end) {
				return fmt.Errorf("config: %s: pool %s-%s must lie inside %s", key, start, end, pfx)
			}
			if end.Less(start) {
				return fmt.Errorf("config: %s: pool_start %s is after pool_end %s", key, start, end)
			}
		}
	}
	return nil
}
