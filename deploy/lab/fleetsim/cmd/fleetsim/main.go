// Command fleetsim runs the fleet simulator (package kiln/deploy/lab/fleetsim)
// against a real `kiln serve`: N simulated machines boot, are inspected and
// provisioned, and the run prints
//
//	fleet: N provisioned, F failed in S s; kiln cpu X ms/machine; rss Y MB; store Z MB
//
// with each phase's p50/p99, the store's parts and the events written. Root is
// required (network namespaces). From the repository root, after `make build env`:
//
//	go run ./deploy/lab/fleetsim/cmd/fleetsim -n 50      (or: make fleet N=50)
//
// With -day2 the run goes on after the storm (issue 14): all machines but
// -spares are claimed, then 2 % fail over a compressed hour (each must end
// rma with a spare provisioned in its place) and then 20 % at once (the
// brake must engage, with no BMC action and no repair behind it):
//
//	go run ./deploy/lab/fleetsim/cmd/fleetsim -n 2044 -day2 -spares 44 -hour 120s   (or: make fleet N=2044 DAY2=1)
//
// Against a three-node site cluster with the leader killed mid-storm:
//
//	go run ./deploy/lab/fleetsim/cmd/fleetsim -n 500 -nodes 3 -kill-leader-at 40s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"kiln/deploy/lab/fleetsim"
)

func main() {
	if fleetsim.IsChild() {
		fleetsim.ChildMain()
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
}

func run() error {
	var o fleetsim.Options
	var jsonOut string
	envDir := os.Getenv("KILN_ENV_DIR")
	if envDir == "" {
		envDir = "build/env"
	}
	flag.IntVar(&o.N, "n", 50, fmt.Sprintf("simulated machines (1..%d)", fleetsim.MaxMachines))
	flag.StringVar(&o.Work, "work", filepath.Join(os.TempDir(), "kiln-fleetsim"), "scratch directory (Kiln's data dir, image, logs)")
	flag.StringVar(&o.KilnBin, "kiln", "bin/kiln", "the built kiln binary (make build)")
	flag.StringVar(&o.EnvDir, "env", envDir, "the in-RAM environment (vmlinuz, initramfs; default $KILN_ENV_DIR or build/env)")
	flag.StringVar(&o.Prefix, "prefix", "kfs", "network namespace prefix (PREFIX-srv, PREFIX-lan)")
	flag.IntVar(&o.ImageMiB, "image-mib", 4, "raw image size in MiB")
	flag.Int64Var(&o.EnvBytes, "env-bytes", 1<<20, "bytes of the kernel and of the initramfs each machine fetches (Range)")
	flag.DurationVar(&o.WriteTime, "write-time", 0, "each machine's write step lasts this long, with heartbeats every Task.Heartbeat (a real disk write)")
	flag.DurationVar(&o.AgentPoll, "agent-poll", 0, "Kiln's lifecycle.agent_poll_after (0: Kiln's default)")
	flag.IntVar(&o.BMCConcurrency, "bmc-concurrency", 0, "Kiln's bmc.concurrency (0: Kiln's default)")
	flag.DurationVar(&o.Timeout, "timeout", 0, "bound of the run (default 5 min + 0.5 s per machine)")
	flag.IntVar(&o.Attest, "attest", 0, "machines (the first ones) with a TPM 2.0 (a swtpm each); the model then requires attestation, the others are allowed without a TPM")
	flag.IntVar(&o.Nodes, "nodes", 1, "kiln serve nodes: 1, or 3 as one site cluster (raft, mutual TLS, agents failing over)")
	flag.DurationVar(&o.KillLeaderAt, "kill-leader-at", 0, "with -nodes 3: SIGKILL the raft leader this long after the import starts, restart it -down later")
	flag.DurationVar(&o.Down, "down", 5*time.Second, "how long the killed leader stays down")
	flag.StringVar(&jsonOut, "json", "", "also write the result as JSON to this file")
	var day2 fleetsim.Day2Options
	day2On := flag.Bool("day2", false, "after the storm, the day-2 phase: claim all but -spares, then mode A (2 % fail over -hour) and mode B (20 % at once)")
	flag.IntVar(&day2.Spares, "spares", 0, "day 2: machines left unclaimed (default 2 % of the claimed + 2)")
	flag.IntVar(&day2.FailA, "fail-a", 0, "day 2: machines failing over the compressed hour (default 2 % of the claimed)")
	flag.IntVar(&day2.FailB, "fail-b", 0, "day 2: machines failing at once (default 20 % of the claimed)")
	flag.DurationVar(&day2.Hour, "hour", 0, "day 2: the compressed hour mode A's failures spread over (default 60s)")
	flag.DurationVar(&day2.HealthPoll, "health-poll", 0, "day 2: Kiln's remediation.health.interval (default 2s)")
	flag.DurationVar(&day2.BrakeWindow, "brake-window", 0, "day 2: Kiln's remediation.brake.window (default hour/4); keep it longer than a few health sweeps of the whole fleet")
	flag.DurationVar(&day2.Hold, "hold", 0, "day 2: Kiln's remediation.hold (default 2 × health-poll; negative: none)")
	flag.Parse()
	if *day2On {
		o.Day2 = &day2
	}
	abs := func(p *string) {
		if a, err := filepath.Abs(*p); err == nil {
			*p = a
		}
	}
	abs(&o.Work)
	abs(&o.KilnBin)
	abs(&o.EnvDir)
	o.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	res, err := fleetsim.Run(ctx, o)
	if res != nil && jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if werr := os.WriteFile(jsonOut, b, 0o644); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return err
	}
	fmt.Printf("fleetsim: done in %.1f s (logs and data in %s)\n", time.Since(t0).Seconds(), o.Work)
	if len(res.Problems) > 0 {
		return fmt.Errorf("%d cluster checks failed (see %s/n*/kiln.log)", len(res.Problems), o.Work)
	}
	want := res.N
	if res.Day2 != nil {
		want = res.Day2.Claimed // the spares stay available: only the claimed are built in the storm
	}
	if res.Provisioned != want {
		return fmt.Errorf("%d of %d machines provisioned (see %s/kiln.log)", res.Provisioned, want, o.Work)
	}
	return nil
}
