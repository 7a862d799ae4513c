// Command kiln-agent is the main program of Kiln's in-RAM provisioning environment. It
// reads kiln.url, kiln.machine and kiln.token from /proc/cmdline (or -cmdline FILE), then
// runs the agentapi protocol (see package kiln/cmd/kiln-agent/agent). As PID 1 it never
// exits: a failed run is retried after a pause, and the run ends in reboot(2).
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

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/agent"
)

// parseCmdline returns key=value pairs of a kernel command line (quotes not supported:
// kiln values are URL-safe).
func parseCmdline(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}
	return out
}

// version is set at link time (-X main.version=...).
var version = "dev"

func main() {
	agent.Version = version
	cmdlinePath := flag.String("cmdline", "/proc/cmdline", "kernel command line to read")
	root := flag.String("root", "/", "file system root for the inventory")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	pid1 := os.Getpid() == 1
	for {
		err := run(*cmdlinePath, *root, log)
		if !pid1 {
			if err != nil {
				fmt.Fprintln(os.Stderr, "kiln-agent:", err)
				os.Exit(1)
			}
			return
		}
		fmt.Fprintf(os.Stdout, "kiln-agent: run ended: %v; restarting in 10s\n", err)
		time.Sleep(10 * time.Second)
	}
}

func run(cmdlinePath, root string, log *slog.Logger) error {
	b, err := os.ReadFile(cmdlinePath)
	if err != nil {
		return err
	}
	args := parseCmdline(string(b))
	a, err := agent.New(agent.Config{
		URL:       args[agentapi.ArgURL],
		MachineID: args[agentapi.ArgMachine],
		Token:     args[agentapi.ArgToken],
		Root:      root,
		Console:   os.Stdout,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return a.Run(ctx, log)
}
