package main

import (
	"context"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// leasesCmd is `kiln leases`: GET /v1/leases of the node the CLI talks to.
func leasesCmd(o *cliOpts) *cobra.Command {
	var consistent bool
	c := &cobra.Command{
		Use:   "leases",
		Short: "List the DHCPv4 leases of this node's replica, one per address",
		Long: `List the DHCPv4 leases as this node's replica of the store holds them: one
row per address, its last committed state (bound, declined or released). A
lease is live while it is bound or declined and its expiry is ahead. With
--consistent the node first catches up with everything the leader has
committed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.LeaseList, error) {
				return cl.Leases(ctx, consistent)
			}, func(out api.LeaseList) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "IP", "MAC", "STATE", "EXPIRES", "HOSTNAME")
					for _, l := range out.Items {
						row(tw, l.IP, l.MAC, l.State, l.Expiry.Format(time.RFC3339), dash(l.Hostname))
					}
				}
			})
		},
	}
	c.Flags().BoolVar(&consistent, "consistent", false, "read after the node has caught up with the leader")
	return c
}
