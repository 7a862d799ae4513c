// Command kiln is the Kiln appliance daemon (`kiln serve`) and its CLI
// (`kiln machines list`, `kiln events --follow`, ...).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/spf13/cobra"

	"kiln/appliance"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	root := newRoot()
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kiln:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kiln",
		Short:         "Kiln: site-local bare-metal provisioning",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newVersion())
	addClientCommands(root)
	return root
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "kiln %s\n", version)
		},
	}
}

func newServe() *cobra.Command {
	var cfgPath, dataDir, apiAddr, cpuProfile string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the appliance (store, DHCP, TFTP, HTTP boot, API, lifecycle)",
		Long: `Run the appliance. With no --config it runs the embedded default: a single
self-bootstrapping node, data in --data-dir, the API on 127.0.0.1:7480, and no
DHCP/TFTP until a provisioning interface is configured.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := appliance.DefaultConfig()
			if cfgPath != "" {
				var err error
				if cfg, err = appliance.LoadConfig(cfgPath); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("data-dir") || cfg.DataDir == "" {
				cfg.DataDir = dataDir
			}
			if cmd.Flags().Changed("api-addr") {
				cfg.API.Addr = apiAddr
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("--cpu-profile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpu-profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err := appliance.Run(ctx, cfg, version)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	c.Flags().StringVar(&cfgPath, "config", "", "YAML config file (unknown keys are rejected)")
	c.Flags().StringVar(&dataDir, "data-dir", appliance.DefaultDataDir, "data directory (raft log, state, images)")
	c.Flags().StringVar(&apiAddr, "api-addr", appliance.DefaultAPIAddr, "API listen address")
	c.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write a Go CPU profile (runtime/pprof, for `go tool pprof`) to this file until the process exits")
	return c
}
