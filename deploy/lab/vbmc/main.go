// Command vbmc is Kiln's virtual Redfish BMC for the lab: it serves Redfish over HTTPS and
// drives one qemu VM through QMP. See package kiln/deploy/lab/vbmc/vbmc.
//
//	vbmc --listen 10.74.1.10:8443 --user admin --password-file pw --qemu-args-file vm.args \
//	     --state-dir /run/vbmc-1 [--quirk reject-mode] [--quirk slow=3s]
//
// vm.args holds one qemu argument per line (first line: the qemu binary), without
// -qmp, -serial and -boot.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"kiln/deploy/lab/vbmc/vbmc"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vbmc:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg vbmc.Config
	var quirks, macs, firmware multi
	var pwFile, argsFile string
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:8443", "HTTPS listen address")
	flag.StringVar(&cfg.Username, "user", "admin", "Redfish user name")
	flag.StringVar(&pwFile, "password-file", "", "file holding the Redfish password (required)")
	flag.StringVar(&argsFile, "qemu-args-file", "", "qemu command line, one argument per line (required)")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "directory for the QMP socket and serial logs (required)")
	flag.StringVar(&cfg.CertFile, "cert", "", "PEM certificate (default: self-signed)")
	flag.StringVar(&cfg.KeyFile, "key", "", "PEM key for --cert")
	flag.StringVar(&cfg.Serial, "serial", "VBMC0001", "system serial number")
	flag.StringVar(&cfg.Model, "model", "Standard PC (i440FX + PIIX, 1996)", "system model")
	flag.StringVar(&cfg.Manufacturer, "manufacturer", "QEMU", "system manufacturer")
	flag.StringVar(&cfg.UUID, "uuid", "", "system UUID")
	flag.StringVar(&cfg.InitialMode, "mode", "Legacy", "initial BootSourceOverrideMode (Legacy|UEFI)")
	flag.Var(&macs, "mac", "NIC MAC address (repeatable)")
	flag.Var(&quirks, "quirk", "ignore-override|reject-mode|half-apply-400|error-off-when-off|bios-config-job|slow=DURATION (repeatable)")
	flag.Var(&firmware, "firmware", "initial firmware version COMPONENT=VERSION, component BIOS|BMC|NIC1|Disk1 (repeatable)")
	flag.DurationVar(&cfg.FirmwareUpdateDuration, "firmware-update-duration", 2*time.Second, "how long a firmware update task runs")
	flag.Parse()
	for _, f := range firmware {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("--firmware %q: want COMPONENT=VERSION", f)
		}
		if cfg.Firmware == nil {
			cfg.Firmware = map[string]string{}
		}
		cfg.Firmware[k] = v
	}
	for _, q := range quirks {
		if err := vbmc.ParseQuirk(q, &cfg.Quirks); err != nil {
			return err
		}
	}
	cfg.MACs = macs
	if pwFile == "" || argsFile == "" {
		return fmt.Errorf("--password-file and --qemu-args-file are required")
	}
	pw, err := os.ReadFile(pwFile)
	if err != nil {
		return err
	}
	cfg.Password = strings.TrimRight(string(pw), "\r\n")
	raw, err := os.ReadFile(argsFile)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			cfg.QEMUArgs = append(cfg.QEMUArgs, l)
		}
	}
	srv, err := vbmc.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return srv.Run(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)))
}
