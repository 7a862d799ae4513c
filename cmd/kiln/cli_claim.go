package main

import (
	"context"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// claimCmd is `kiln machines claim`: N available machines by role and labels,
// all or nothing (POST /v1/machines/claim).
func claimCmd(o *cliOpts) *cobra.Command {
	var role, image, userData, reason string
	var count int
	var labels, nodeLabels, sshKeys []string
	var cluster clusterFlags // issue 15 (cli_release.go)
	c := &cobra.Command{
		Use:   "claim",
		Short: "Claim N available machines (by role and labels) and provision them with an image; all or nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseLabels("--label", labels)
			if err != nil {
				return err
			}
			nl, err := parseLabels("--node-label", nodeLabels)
			if err != nil {
				return err
			}
			req := api.ClaimRequest{Role: role, Labels: sel, Count: count, Reason: reason,
				Claim: api.Claim{Image: image, Role: role, Labels: nl, SSHKeys: sshKeys}}
			if req.Claim.Cluster, err = cluster.block(); err != nil {
				return err
			}
			if userData != "" {
				b, err := os.ReadFile(userData)
				if err != nil {
					return err
				}
				req.Claim.UserData = string(b)
			}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.ClaimResponse, error) {
				items, err := cl.Claim(ctx, req)
				return api.ClaimResponse{Items: items}, err
			}, func(res api.ClaimResponse) func(*tabwriter.Writer) { return machineTable(res.Items) })
		},
	}
	f := c.Flags()
	f.IntVar(&count, "count", 1, "how many machines")
	f.StringVar(&role, "role", "", "role of the nodes, e.g. worker (required)")
	f.StringVar(&image, "image", "", "image ID (required)")
	f.StringArrayVar(&labels, "label", nil, "select machines with label key=value (repeat)")
	f.StringArrayVar(&nodeLabels, "node-label", nil, "label key=value staged on the nodes (repeat)")
	f.StringArrayVar(&sshKeys, "ssh-key", nil, "authorized SSH public key (repeat)")
	f.StringVar(&userData, "user-data", "", "cloud-init user-data file (bootstrap data)")
	f.StringVar(&reason, "reason", "", "why (recorded in the event log)")
	cluster.add(c)
	_ = c.MarkFlagRequired("role")
	_ = c.MarkFlagRequired("image")
	return c
}

// sitesCmd lists and creates sites (GET/POST /v1/sites).
func sitesCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "sites", Aliases: []string{"site"}, Short: "List and create sites"}
	c.AddCommand(&cobra.Command{
		Use: "list", Short: "List sites", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.SiteList, error) {
				items, err := cl.ListSites(ctx)
				return api.SiteList{Items: items}, err
			}, func(sl api.SiteList) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "ID", "NAME", "DESCRIPTION")
					for _, s := range sl.Items {
						row(tw, s.ID, s.Name, dash(s.Description))
					}
				}
			})
		},
	})
	var desc string
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a site", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Site, error) {
				return cl.CreateSite(ctx, api.SiteSpec{Name: args[0], Description: desc})
			}, func(s api.Site) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) { row(tw, "ID", "NAME"); row(tw, s.ID, s.Name) }
			})
		},
	}
	create.Flags().StringVar(&desc, "description", "", "free text")
	c.AddCommand(create)
	return c
}

// racksCmd lists and creates racks (GET/POST /v1/racks).
func racksCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "racks", Aliases: []string{"rack"}, Short: "List and create racks"}
	var site string
	list := &cobra.Command{
		Use: "list", Short: "List racks (--site filters)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.RackList, error) {
				items, err := cl.ListRacks(ctx, site)
				return api.RackList{Items: items}, err
			}, func(rl api.RackList) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "ID", "SITE", "NAME", "ROW", "UNITS")
					for _, r := range rl.Items {
						row(tw, r.ID, r.Site, r.Name, dash(r.Row), r.Units)
					}
				}
			})
		},
	}
	list.Flags().StringVar(&site, "site", "", "site ID")
	var rowName string
	var units int
	create := &cobra.Command{
		Use: "create NAME --site SITE", Short: "Create a rack", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := api.RackSpec{Site: site, Name: args[0], Row: rowName, Units: units}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Rack, error) {
				return cl.CreateRack(ctx, spec)
			}, func(r api.Rack) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) { row(tw, "ID", "SITE", "NAME"); row(tw, r.ID, r.Site, r.Name) }
			})
		},
	}
	create.Flags().StringVar(&site, "site", "", "site ID (required)")
	create.Flags().StringVar(&rowName, "row", "", "row name")
	create.Flags().IntVar(&units, "units", 0, "height in rack units (U)")
	_ = create.MarkFlagRequired("site")
	c.AddCommand(list, create)
	return c
}
