package main

import (
	"context"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// `kiln attest list|learn|approve|revoke` (issue 16): the approved
// measured-boot states per hardware model (appliance/lifecycle/DESIGN.md
// "Attestation").

func attestCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "attest", Short: "Measured-boot states per hardware model: what a TPM attestation must match before a build gets credentials"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the states (proposed, approved, revoked) per hardware model",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.AttestState, error) {
				return cl.AttestStates(ctx)
			}, attestTable)
		},
	}
	var name string
	var approve bool
	learn := &cobra.Command{
		Use:   "learn MACHINE",
		Short: "Make a state of a reference machine's last attestation (proposed; --approve approves it at once, admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.AttestState, error) {
				s, err := cl.LearnAttestState(ctx, api.AttestLearnRequest{Machine: args[0], Name: name, Approve: approve})
				return []api.AttestState{s}, err
			}, attestTable)
		},
	}
	learn.Flags().StringVar(&name, "name", "", "a name for the state (e.g. the firmware release)")
	learn.Flags().BoolVar(&approve, "approve", false, "approve it in the same write (admin)")
	set := func(use, short string, call func(*client.Client, context.Context, []string) ([]api.AttestState, error)) *cobra.Command {
		return &cobra.Command{
			Use:   use + " STATE_ID...",
			Short: short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.AttestState, error) {
					return call(cl, ctx, args)
				}, attestTable)
			},
		}
	}
	c.AddCommand(list, learn,
		set("approve", "Approve states (several at once: a rolling firmware update); audited", (*client.Client).ApproveAttestStates),
		set("revoke", "Revoke states: a boot matching only these is refused from the next build on; audited", (*client.Client).RevokeAttestStates))
	return c
}

func attestTable(ss []api.AttestState) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "ID", "MODEL", "NAME", "STATUS", "PCRS", "EVENTS", "SOURCE", "APPROVED BY", "APPROVED")
		for _, s := range ss {
			at := "-"
			if !s.ApprovedAt.IsZero() {
				at = s.ApprovedAt.Format(time.RFC3339)
			}
			pcrs := ""
			for i, p := range s.PCRs {
				if i > 0 {
					pcrs += ","
				}
				pcrs += strconv.Itoa(p.Index)
			}
			row(tw, s.ID, s.Model, dash(s.Name), s.Status, pcrs, strconv.Itoa(s.Events), dash(s.Source), dash(s.ApprovedBy), at)
		}
	}
}
