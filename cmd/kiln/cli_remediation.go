package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// Day-2 commands (issue 14): `kiln remediation status|resume`, and the
// machine actions `kiln machines power|maintenance|retire|rma|reprovision|
// health|drain-ack`.

func remediationCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "remediation", Short: "Automatic repair: the brake, spares, machines being repaired"}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the remediation brake, the spare pool per class and the machines being repaired, in maintenance or rma",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.RemediationStatus, error) {
				return cl.RemediationStatus(ctx)
			}, remediationTable)
		},
	}
	var reason, message string
	resume := &cobra.Command{
		Use:   "resume",
		Short: "Release the remediation brake: automatic repair goes on (machines failed before now are not counted again)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Brake, error) {
				return cl.ResumeRemediation(ctx, api.ActionRequest{Reason: reason, Message: message})
			}, func(b api.Brake) func(*tabwriter.Writer) { return brakeTable(b) })
		},
	}
	resume.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
	resume.Flags().StringVar(&message, "message", "", "free-text note")
	c.AddCommand(status, resume)
	return c
}

func brakeTable(b api.Brake) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		if !b.Engaged {
			row(tw, "BRAKE:", "released")
			if !b.ResumedAt.IsZero() {
				row(tw, "RESUMED:", b.ResumedAt.Format(time.RFC3339)+" by "+b.ResumedBy)
			}
		} else {
			row(tw, "BRAKE:", "ENGAGED ("+b.Scope+" "+dash(b.Key)+") since "+b.EngagedAt.Format(time.RFC3339))
			row(tw, "WHY:", b.Message)
		}
		row(tw, "FAILURES IN WINDOW:", strconv.Itoa(len(b.Failures)))
	}
}

func remediationTable(st api.RemediationStatus) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "MODE:", st.Mode)
		brakeTable(st.Brake)(tw)
		row(tw, "")
		row(tw, "CLASS", "SPARES", "LOW AT", "LOW")
		for _, p := range st.Spares {
			row(tw, p.Class, strconv.Itoa(p.Available), strconv.Itoa(p.LowThreshold), fmt.Sprint(p.Low))
		}
		row(tw, "")
		row(tw, "ID", "NAME", "RACK", "STATE", "STEP", "ATTEMPT", "MAINT", "SPARE", "WHY")
		for _, m := range st.Machines {
			maint := "-"
			if m.Maintenance != nil {
				maint = "yes: " + m.Maintenance.Reason
			}
			row(tw, m.ID, dash(m.Name), dash(m.Rack), m.State, dash(m.Step), strconv.Itoa(m.Attempt), maint, dash(m.Spare), dash(m.Why))
		}
	}
}

// remediationMachineCmds are the day-2 actions under `kiln machines`.
func remediationMachineCmds(o *cliOpts) []*cobra.Command {
	one := func(m api.Machine) func(*tabwriter.Writer) { return machineTable([]api.Machine{m}) }
	var reason, message string
	why := func(c *cobra.Command) {
		c.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
		c.Flags().StringVar(&message, "message", "", "free-text note")
	}
	power := &cobra.Command{
		Use:   "power ID on|off|cycle",
		Short: "Power a machine on, off or cycle it through its BMC (one job: see `kiln events`)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.Power(ctx, args[0], api.PowerRequest{Action: args[1], Reason: reason, Message: message})
			}, one)
		},
	}
	why(power)
	maint := &cobra.Command{
		Use:   "maintenance ID on|off",
		Short: "Set or clear the maintenance flag (nothing automatic touches the machine while set)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var on bool
			switch args[1] {
			case "on":
				on = true
			case "off":
			default:
				return fmt.Errorf("maintenance %q: want on or off", args[1])
			}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.SetMaintenance(ctx, args[0], api.MaintenanceRequest{Maintenance: &on, Reason: reason, Message: message})
			}, one)
		},
	}
	why(maint)
	var skipErase bool
	rma := &cobra.Command{
		Use:   "rma ID",
		Short: "Declare a machine failed: erase its disks (unless --skip-erase), mark it rma, hand its claim to a spare",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.RMA(ctx, args[0], api.RMARequest{SkipErase: skipErase, Reason: reason, Message: message})
			}, one)
		},
	}
	why(rma)
	rma.Flags().BoolVar(&skipErase, "skip-erase", false, "do not erase the disks first (the RMA report says so)")
	var condType, status, condReason, condMsg string
	health := &cobra.Command{
		Use:   "health ID --type T --status OK|Warning|Critical",
		Short: "Report a health condition of a claimed machine as its owner (Critical starts automatic repair)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.ReportHealth(ctx, args[0], api.HealthReport{Type: condType, Status: status, Reason: condReason, Message: condMsg})
			}, one)
		},
	}
	health.Flags().StringVar(&condType, "type", "Ready", "condition type")
	health.Flags().StringVar(&status, "status", "", "OK, Warning or Critical (required)")
	health.Flags().StringVar(&condReason, "reason", "", "condition reason, e.g. NodeNotReady")
	health.Flags().StringVar(&condMsg, "message", "", "free-text note")
	return []*cobra.Command{power, maint, rma, health,
		actionCmd(o, "retire", "Retire a machine for good (its disks are erased first; admin)", (*client.Client).Retire),
		actionCmd(o, "reprovision", "Inspect a claimed machine again and build its claim again", (*client.Client).Reprovision),
		actionCmd(o, "drain-ack", "Acknowledge a machine's drain request before a disruptive repair step", (*client.Client).DrainAck),
	}
}
