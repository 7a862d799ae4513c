package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// Firmware and BIOS baselines (issue 17): `kiln baseline set|list` and
// `kiln firmware read|show|apply MACHINE`.

func baselineCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "baseline", Short: "Firmware and BIOS baselines per hardware model"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the baselines (vendor, model, firmware versions, BIOS attributes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.Baseline, error) {
				return cl.ListBaselines(ctx)
			}, baselinesTable)
		},
	}
	var vendor, model string
	var fws, bios []string
	set := &cobra.Command{
		Use:   "set --vendor V --model M [--firmware NAME=VERSION@IMAGE_URL]... [--bios ATTR=VALUE]...",
		Short: "Set the baseline of a hardware model (replaces it; drift is recomputed for the model's machines)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := api.Baseline{Vendor: vendor, Model: model}
			for _, f := range fws {
				name, rest, ok := strings.Cut(f, "=")
				if !ok || name == "" || rest == "" {
					return fmt.Errorf("--firmware %q: want NAME=VERSION[@IMAGE_URL]", f)
				}
				ver, uri, _ := strings.Cut(rest, "@")
				b.Firmware = append(b.Firmware, api.BaselineFirmware{Component: name, Version: ver, ImageURI: uri})
			}
			attrs, err := parseLabels("bios", bios)
			if err != nil {
				return err
			}
			b.BIOS = attrs
			return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.Baseline, error) {
				out, err := cl.PutBaseline(ctx, b)
				return []api.Baseline{out}, err
			}, baselinesTable)
		},
	}
	set.Flags().StringVar(&vendor, "vendor", "", "hardware vendor, as inspection or the BMC reports it (required)")
	set.Flags().StringVar(&model, "model", "", "hardware model (required)")
	set.Flags().StringArrayVar(&fws, "firmware", nil, "component NAME=VERSION@IMAGE_URL (Redfish SoftwareInventory Name; the image served by Kiln, e.g. http://KILN:8080/images/bios.fw; repeatable)")
	set.Flags().StringArrayVar(&bios, "bios", nil, "BIOS attribute ATTR=VALUE (repeatable)")
	c.AddCommand(list, set)
	return c
}

func baselinesTable(bs []api.Baseline) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "ID", "VENDOR", "MODEL", "FIRMWARE", "BIOS")
		for _, b := range bs {
			var fw, at []string
			for _, f := range b.Firmware {
				fw = append(fw, f.Component+"="+f.Version)
			}
			for k, v := range b.BIOS {
				at = append(at, k+"="+v)
			}
			sort.Strings(at)
			row(tw, b.ID, b.Vendor, b.Model, dash(strings.Join(fw, ",")), dash(strings.Join(at, ",")))
		}
	}
}

func firmwareCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "firmware", Short: "A machine's firmware and BIOS: read from its BMC, drift from the baseline, apply the baseline"}
	read := &cobra.Command{
		Use:   "read MACHINE",
		Short: "Read the machine's firmware inventory and BIOS attributes from its BMC now",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.ReadFirmware(ctx, args[0])
			}, firmwareTable)
		},
	}
	showc := &cobra.Command{
		Use:   "show MACHINE",
		Short: "Show the machine's last firmware read, its drift from the baseline and the last apply",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.GetMachine(ctx, args[0])
			}, firmwareTable)
		},
	}
	var reason, message string
	var wait time.Duration
	apply := &cobra.Command{
		Use:   "apply MACHINE",
		Short: "Bring the machine to its model's baseline: firmware, then BIOS (the machine is reset); --wait follows it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd)
			m, err := cl.ApplyFirmware(ctx, args[0], api.ActionRequest{Reason: reason, Message: message})
			cancel()
			if err != nil {
				return err
			}
			for end := time.Now().Add(wait); wait > 0 && time.Now().Before(end); {
				if a := applyOf(m); a != nil && a.State != "running" {
					break
				}
				time.Sleep(2 * time.Second)
				ctx, cancel := timeout(cmd)
				m, err = cl.GetMachine(ctx, args[0])
				cancel()
				if err != nil {
					return err
				}
			}
			if err := render(cmd.OutOrStdout(), o.output, m, firmwareTable(m)); err != nil {
				return err
			}
			if a := applyOf(m); wait > 0 && a != nil && a.State != "succeeded" {
				return fmt.Errorf("firmware apply of %s: %s", args[0], a.State)
			}
			return nil
		},
	}
	apply.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
	apply.Flags().StringVar(&message, "message", "", "free-text note")
	apply.Flags().DurationVar(&wait, "wait", 0, "follow the run until it ends, at most this long (e.g. 30m); exit 1 unless it succeeded")
	c.AddCommand(read, showc, apply)
	return c
}

func applyOf(m api.Machine) *api.FirmwareApply {
	if m.Firmware == nil {
		return nil
	}
	return m.Firmware.Apply
}

func firmwareTable(m api.Machine) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		f := m.Firmware
		if f == nil {
			row(tw, "FIRMWARE:", "never read (kiln firmware read "+m.ID+")")
			return
		}
		row(tw, "READ AT:", f.ReadAt.Format(time.RFC3339))
		if f.Error != "" {
			row(tw, "READ ERROR:", f.Error+": "+f.Message)
		}
		row(tw, "BASELINE:", dash(f.Baseline))
		row(tw, "")
		row(tw, "COMPONENT", "VERSION")
		for _, c := range f.Components {
			row(tw, c.Name, c.Version)
		}
		row(tw, "")
		row(tw, "BIOS ATTRIBUTE", "VALUE", "PENDING")
		keys := make([]string, 0, len(f.BIOS))
		for k := range f.BIOS {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			row(tw, k, f.BIOS[k], dash(f.PendingBIOS[k]))
		}
		row(tw, "")
		row(tw, "DRIFT", "BASELINE", "MACHINE")
		for _, d := range f.Drift {
			row(tw, d.Field, d.Intended, dash(d.Discovered))
		}
		if a := f.Apply; a != nil {
			row(tw, "")
			row(tw, "APPLY:", a.State+" (baseline "+a.Baseline+", started "+a.Started.Format(time.RFC3339)+")")
			row(tw, "STEP", "TARGET", "FROM", "TO", "STATE", "PERCENT", "REASON", "MESSAGE")
			for _, s := range a.Steps {
				row(tw, s.Kind, s.Target, dash(s.From), dash(s.To), s.State, strconv.Itoa(s.Percent), dash(s.Reason), dash(s.Message))
			}
		}
	}
}
