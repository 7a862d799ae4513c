package bmc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/go-logr/logr"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// Redfish values (DSP2046 ComputerSystem.v1 Boot).
const (
	rfTargetPxe  = "Pxe"
	rfEnabledOne = "Once"
	rfModeUEFI   = "UEFI"
	rfModeLegacy = "Legacy"
)

type redfishDriver struct {
	c        *Controller
	t        Target
	host     string
	port     int
	tlsConf  *tls.Config
	pool     *x509.CertPool // nil = system roots
	gf       *gofish.APIClient
	bl       *bmclib.Client
	blClosed bool
}

func tlsFor(t Target) (*tls.Config, *x509.CertPool, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.InsecureTLS {
		conf.InsecureSkipVerify = true //nolint:gosec // explicit per-BMC opt-out
		return conf, nil, nil
	}
	var pool *x509.CertPool
	if len(t.CACertPEM) > 0 {
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.CACertPEM) {
			return nil, nil, fmt.Errorf("%w: CACertPEM holds no certificate", ErrInvalidTarget)
		}
		conf.RootCAs = pool
	}
	return conf, pool, nil
}

func newRedfishDriver(c *Controller, t Target) (*redfishDriver, error) {
	host, port, err := t.endpoint(DefaultRedfishPort)
	if err != nil {
		return nil, err
	}
	conf, pool, err := tlsFor(t)
	if err != nil {
		return nil, err
	}
	return &redfishDriver{c: c, t: t, host: host, port: port, tlsConf: conf, pool: pool}, nil
}

func (d *redfishDriver) baseURL() string {
	return "https://" + net.JoinHostPort(d.host, strconv.Itoa(d.port))
}

func (d *redfishDriver) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:       d.tlsConf.Clone(),
		DisableKeepAlives:     true,
		TLSHandshakeTimeout:   d.c.cfg.CallTimeout,
		ResponseHeaderTimeout: d.c.cfg.CallTimeout,
		DialContext:           (&net.Dialer{Timeout: d.c.cfg.CallTimeout}).DialContext,
	}}
}

// bmclibClient opens bmclib restricted to its Redfish provider ("gofish"): without
// For(), Open would log in to every registered provider.
func (d *redfishDriver) bmclibClient(ctx context.Context) (*bmclib.Client, error) {
	if d.bl != nil {
		return d.bl, nil
	}
	opts := []bmclib.Option{
		bmclib.WithLogger(logr.Discard()),
		bmclib.WithRedfishPort(strconv.Itoa(d.port)),
		bmclib.WithRedfishUseBasicAuth(d.c.cfg.RedfishBasicAuth),
		bmclib.WithPerProviderTimeout(remaining(ctx, d.c.cfg.CallTimeout)),
	}
	if !d.t.InsecureTLS {
		opts = append(opts, bmclib.WithSecureTLS(d.pool))
	}
	cl := bmclib.NewClient(d.host, d.t.Username, d.t.Password, opts...)
	if err := cl.For("gofish").Open(ctx); err != nil {
		return nil, err
	}
	d.bl = cl
	return cl, nil
}

// gofishClient opens a gofish session for the pieces bmclib cannot do (DESIGN.md).
func (d *redfishDriver) gofishClient(ctx context.Context) (*gofish.APIClient, error) {
	if d.gf != nil {
		return d.gf, nil
	}
	gf, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:   d.baseURL(),
		Username:   d.t.Username,
		Password:   d.t.Password,
		HTTPClient: d.httpClient(),
		BasicAuth:  d.c.cfg.RedfishBasicAuth,
	})
	if err != nil {
		return nil, err
	}
	d.gf = gf
	return gf, nil
}

func remaining(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if r := time.Until(dl); r > 0 {
			return r
		}
		return time.Millisecond
	}
	return def
}

func (d *redfishDriver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if d.bl != nil && !d.blClosed {
		d.blClosed = true
		_ = d.bl.Close(ctx)
	}
	if d.gf != nil {
		d.gf.Logout()
	}
}

// parseRedfishPowerState maps a ComputerSystem.PowerState (DSP2046 PowerState enum) to a
// PowerState. Transitional and unknown values are ErrBadAnswer.
func parseRedfishPowerState(s string) (PowerState, error) {
	switch s {
	case "On":
		return PowerOn, nil
	case "Off":
		return PowerOff, nil
	case "PoweringOn", "PoweringOff", "Paused":
		return "", fmt.Errorf("%w: transitional power state %q", ErrBadAnswer, s)
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return "", fmt.Errorf("%w: power state %q", ErrBadAnswer, s)
}

func (d *redfishDriver) powerState(ctx context.Context) (PowerState, error) {
	cl, err := d.bmclibClient(ctx)
	if err != nil {
		return "", err
	}
	s, err := cl.For("gofish").GetPowerState(ctx)
	if err != nil {
		return "", err
	}
	return parseRedfishPowerState(s)
}

func (d *redfishDriver) power(ctx context.Context, a PowerAction) error {
	cl, err := d.bmclibClient(ctx)
	if err != nil {
		return err
	}
	var state string
	switch a {
	case ActionOn:
		state = "on"
	case ActionOff:
		state = "off"
	case ActionSoftOff:
		state = "soft"
	case ActionCycle:
		state = "cycle"
	case ActionReset:
		state = "reset"
	default:
		return fmt.Errorf("%w: action %q", ErrInvalidTarget, string(a))
	}
	ok, err := cl.For("gofish").SetPowerState(ctx, state)
	if err != nil {
		return err
	}
	if !ok && a != ActionSoftOff { // bmclib's graceful shutdown always reports false
		return fmt.Errorf("%w: power %s not acknowledged", ErrRejected, state)
	}
	return nil
}

// bootSettings is the part of ComputerSystem.Boot Kiln writes and verifies.
type bootSettings struct {
	Target, Enabled, Mode string
}

func (b bootSettings) String() string {
	return fmt.Sprintf("target=%q enabled=%q mode=%q", b.Target, b.Enabled, b.Mode)
}

// patch returns the JSON PATCH body fields of want that differ from cur (all when cur
// is nil), leaving out Mode when withMode is false.
func (want bootSettings) patch(cur *bootSettings, withMode bool) map[string]string {
	m := map[string]string{}
	if cur == nil || cur.Target != want.Target {
		m["BootSourceOverrideTarget"] = want.Target
	}
	if cur == nil || cur.Enabled != want.Enabled {
		m["BootSourceOverrideEnabled"] = want.Enabled
	}
	if withMode && (cur == nil || cur.Mode != want.Mode) {
		m["BootSourceOverrideMode"] = want.Mode
	}
	return m
}

func (d *redfishDriver) system(ctx context.Context) (*redfish.ComputerSystem, error) {
	gf, err := d.gofishClient(ctx)
	if err != nil {
		return nil, err
	}
	systems, err := gf.Service.Systems()
	if err != nil {
		return nil, err
	}
	if len(systems) == 0 || systems[0] == nil {
		return nil, fmt.Errorf("%w: no ComputerSystem in /redfish/v1/Systems", ErrUnsupported)
	}
	sort.Slice(systems, func(i, j int) bool { return systems[i].ODataID < systems[j].ODataID })
	return systems[0], nil
}

// readBoot GETs the system afresh and returns its boot override settings.
func (d *redfishDriver) readBoot(ctx context.Context, id string) (bootSettings, error) {
	resp, err := d.gf.Get(id)
	if err != nil {
		return bootSettings{}, err
	}
	defer resp.Body.Close()
	return parseBoot(io.LimitReader(resp.Body, 1<<20))
}

// parseBoot strictly decodes the Boot object of a ComputerSystem JSON document.
func parseBoot(r io.Reader) (bootSettings, error) {
	var doc struct {
		Boot *struct {
			BootSourceOverrideTarget  *string
			BootSourceOverrideEnabled *string
			BootSourceOverrideMode    *string
		}
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return bootSettings{}, fmt.Errorf("%w: ComputerSystem JSON: %v", ErrBadAnswer, err)
	}
	if doc.Boot == nil || doc.Boot.BootSourceOverrideTarget == nil || doc.Boot.BootSourceOverrideEnabled == nil {
		return bootSettings{}, fmt.Errorf("%w: ComputerSystem has no Boot override properties", ErrBadAnswer)
	}
	b := bootSettings{Target: *doc.Boot.BootSourceOverrideTarget, Enabled: *doc.Boot.BootSourceOverrideEnabled}
	if doc.Boot.BootSourceOverrideMode != nil {
		b.Mode = *doc.Boot.BootSourceOverrideMode
	}
	return b, nil
}

func (d *redfishDriver) patchBoot(id string, fields map[string]string) error {
	resp, err := d.gf.Patch(id, map[string]any{"Boot": fields})
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.Body.Close()
}

func isRejection(err error) bool {
	s := classify(context.Background(), err)
	return s == ErrRejected || s == ErrUnsupported
}

func (d *redfishDriver) setNextBootPXE(ctx context.Context, m BootMode) error {
	sys, err := d.system(ctx)
	if err != nil {
		return err
	}
	id := sys.ODataID
	want := bootSettings{Target: rfTargetPxe, Enabled: rfEnabledOne, Mode: rfModeLegacy}
	if m == BootUEFI {
		want.Mode = rfModeUEFI
	}
	log := d.c.log.With("address", d.t.Address, "system", id)
	verify := func() error {
		got, err := d.readBoot(ctx, id)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%w: read back %v, want %v", ErrBootNotApplied, got, want)
		}
		return nil
	}
	// 1. full PATCH
	err = d.patchBoot(id, want.patch(nil, true))
	if err == nil {
		return verify()
	}
	if !isRejection(err) {
		return err
	}
	log.InfoContext(ctx, "boot override PATCH rejected; re-reading state", "error", scrub(err.Error(), d.t.Password))
	// 2. the BMC may have applied part of it: re-read, send only what differs
	cur, rerr := d.readBoot(ctx, id)
	if rerr != nil {
		return rerr
	}
	if cur == want {
		log.InfoContext(ctx, "boot override applied despite the error answer")
		return nil
	}
	diff := want.patch(&cur, true)
	err = d.patchBoot(id, diff)
	if err == nil {
		return verify()
	}
	if _, hadMode := diff["BootSourceOverrideMode"]; !hadMode || !isRejection(err) {
		return err
	}
	// 3. minimal PATCH without Mode (BMCs that refuse BootSourceOverrideMode)
	log.InfoContext(ctx, "boot override rejected with Mode; trying minimal PATCH", "error", scrub(err.Error(), d.t.Password))
	if cur, rerr = d.readBoot(ctx, id); rerr != nil {
		return rerr
	}
	if cur == want {
		return nil
	}
	if err := d.patchBoot(id, bootSettings{Target: want.Target, Enabled: want.Enabled}.patch(nil, false)); err != nil {
		return err
	}
	return verify()
}

func (d *redfishDriver) inventory(ctx context.Context) (Inventory, error) {
	sys, err := d.system(ctx)
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{Serial: strings.TrimSpace(sys.SerialNumber), Manufacturer: strings.TrimSpace(sys.Manufacturer),
		Model: strings.TrimSpace(sys.Model), UUID: strings.TrimSpace(sys.UUID)}
	nics, err := sys.EthernetInterfaces()
	if err != nil {
		return Inventory{}, err
	}
	seen := map[string]bool{}
	for _, n := range nics {
		if n == nil {
			continue
		}
		for _, raw := range []string{n.MACAddress, n.PermanentMACAddress} {
			if raw == "" {
				continue
			}
			mac, err := net.ParseMAC(raw)
			if err != nil || len(mac) != 6 {
				return Inventory{}, fmt.Errorf("%w: EthernetInterface %s MACAddress %q", ErrBadAnswer, n.ID, raw)
			}
			if s := mac.String(); !seen[s] {
				seen[s] = true
				inv.NICMACs = append(inv.NICMACs, s)
			}
			break
		}
	}
	sort.Strings(inv.NICMACs)
	return inv, nil
}

// probe decides "redfish" or "ipmi" for Driver "auto": an HTTPS answer on the Redfish
// port whose /redfish/v1 is JSON means Redfish; no listener there means IPMI. A TLS
// verification failure is returned (it is an HTTPS service, and unsafe to talk to).
func (c *Controller) probe(ctx context.Context, t Target) (string, error) {
	d, err := newRedfishDriver(c, t)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.baseURL()+"/redfish/v1/", nil)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidTarget, err)
	}
	resp, err := d.httpClient().Do(req)
	if err != nil {
		switch classify(ctx, err) {
		case ErrTLS:
			return "", err
		case ErrCanceled:
			return "", err
		}
		return DriverIPMI, nil
	}
	defer resp.Body.Close()
	var root map[string]any
	if resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&root) == nil {
		if _, ok := root["RedfishVersion"]; ok {
			return DriverRedfish, nil
		}
	}
	return DriverIPMI, nil
}
