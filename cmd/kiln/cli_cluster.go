package main

import (
	"context"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// clusterCmd is `kiln cluster`: join tokens and members of the site
// cluster (api/cluster.go routes).
func clusterCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "The site cluster: join tokens and members"}
	token := &cobra.Command{Use: "token", Short: "One-time join tokens for new nodes"}
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a one-time join token (printed once; the cluster keeps only its hash)",
		Long: `Create a one-time join token. Give it to the new node as raft.join_token
(with raft.join listing members' forward addresses and raft.bootstrap: false).
The token also carries the SHA-256 of the site CA's public key, so the new node
checks it is talking to this cluster before it sends the token. It works once,
and only until it expires (--ttl, 1m to 168h).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := api.JoinTokenRequest{}
			if ttl != 0 {
				req.TTL = ttl.String()
			}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.JoinTokenCreated, error) {
				return cl.CreateJoinToken(ctx, req)
			}, func(out api.JoinTokenCreated) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "Token:", out.Token)
					row(tw, "ID:", out.ID)
					row(tw, "Expires:", out.ExpiresAt.Format(time.RFC3339))
					row(tw, "Site CA:", out.CAHash)
				}
			})
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", 0, "how long the token is valid (default 1h)")
	token.AddCommand(create)

	members := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's members",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.ClusterMemberList, error) {
				items, err := cl.ClusterMembers(ctx)
				return api.ClusterMemberList{Items: items}, err
			}, func(out api.ClusterMemberList) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "ID", "ROLE", "SUFFRAGE", "RAFT", "FORWARD", "VERSION", "COMMANDS", "CERT SERIAL", "CERT EXPIRES", "JOINED")
					for _, m := range out.Items {
						role := "follower"
						if m.Leader {
							role = "leader"
						}
						joined := "bootstrap"
						if !m.JoinedAt.IsZero() {
							joined = m.JoinedAt.Format(time.RFC3339)
						}
						cmds := "-"
						if m.MaxCommand != 0 {
							cmds = fmt.Sprintf("≤%d", m.MaxCommand)
						}
						expires := "-"
						if !m.CertNotAfter.IsZero() {
							expires = m.CertNotAfter.Format(time.RFC3339)
						}
						row(tw, m.ID, role, m.Suffrage, m.RaftAddr, dash(m.ForwardAddr), dash(m.Version), cmds, dash(m.CertSerial), expires, joined)
					}
				}
			})
		},
	}
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a member from the cluster; its certificate is refused from then on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeout(cmd)
			defer cancel()
			if err := cl.RemoveMember(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", termSafe(args[0]))
			return nil
		},
	}
	rotateCA := &cobra.Command{
		Use:   "rotate-ca",
		Short: "Replace the site CA and re-issue every member's certificate under it",
		Long: `Replace the site CA that raft and the forward RPC trust. In four steps, each
done on every member before the next: the new CA is added to every member's
trust; it becomes every member's signing CA; every member's certificate is
re-issued under it; the old CA is dropped. At no moment do two members refuse
each other. Every member must be reachable; if one is not, the rotation stops
and says at which step (the cluster stays consistent; run it again). Join
tokens made before the rotation carry the old CA and stop working.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.CARotation, error) {
				return cl.RotateCA(ctx)
			}, func(out api.CARotation) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "Old CA:", out.OldCA)
					row(tw, "New CA:", out.NewCA)
					ids := make([]string, 0, len(out.Members))
					for id := range out.Members {
						ids = append(ids, id)
					}
					sort.Strings(ids)
					for _, id := range ids {
						row(tw, "Re-issued:", id, out.Members[id])
					}
				}
			})
		},
	}
	c.AddCommand(token, members, remove, rotateCA, recoverCmd()) // recover: cli_backup.go
	return c
}

// siteCmd is `kiln site`: site-wide operations (POST /v1/site/rotate-key).
func siteCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "site", Short: "Site-wide operations"}
	c.AddCommand(&cobra.Command{
		Use:   "rotate-key",
		Short: "Replace the site key and re-seal every BMC credential under it, on every member",
		Long: `Replace the site key that seals BMC credentials. Every member first receives
the new key, then seals under it; every credential is re-sealed; only then are
the old keys dropped, so at no moment does a credential fail to open. Every
member must be reachable; if one is not, the rotation stops and says at which
step (run it again once the member is back).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.SiteKeyRotation, error) {
				return cl.RotateSiteKey(ctx)
			}, func(out api.SiteKeyRotation) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "Key ID:", out.KeyID)
					for _, id := range out.OldKeyIDs {
						row(tw, "Replaced:", id)
					}
					row(tw, "Re-sealed:", out.Resealed)
				}
			})
		},
	})
	return c
}
