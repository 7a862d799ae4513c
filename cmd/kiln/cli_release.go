package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// Issue 15: `kiln images manifest ID FILE` (a release manifest) and the
// cluster-block flags of `kiln machines provision` and `kiln machines
// claim`. The cluster token is read from a file (--cluster-token-file),
// never taken as a flag value, so it stays out of shell history and ps.

func manifestCmd(o *cliOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "manifest ID FILE",
		Short: "Make an image a release: layers pinned by SHA-256 and the kubeadm version (FILE: JSON, - for stdin)",
		Long: `Register image ID's release manifest from FILE, a JSON document:

  {"kubeadm_version": "v1.31.2",
   "layers": [{"name": "base", "when": "always", "verity_root_hash": "…"},
              {"name": "gpu", "image": "img-…", "when": "pci:10de/03"}]}

The first layer is the image itself; every other names a raw image uploaded
first (kiln images upload). when: always | role:control-plane | pci:10de/03 |
cpu:vmx|svm. A manifest is immutable: the same one again changes nothing.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = cmd.InOrStdin()
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			var req api.ManifestRequest
			dec := json.NewDecoder(io.LimitReader(r, 1<<20))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				return fmt.Errorf("%s: %w", args[1], err)
			}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Image, error) {
				return cl.SetManifest(ctx, args[0], req)
			}, func(im api.Image) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "LAYER", "WHEN", "IMAGE", "PARTITION", "SIZE", "SHA256")
					for _, l := range im.Layers {
						row(tw, l.Name, l.When, l.Image, dash(l.PartName), l.Size, short(l.SHA256))
					}
				}
			})
		},
	}
}

// clusterFlags are the cluster block's flags.
type clusterFlags struct {
	role, host, version, tokenFile string
}

func (c *clusterFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.role, "cluster-role", "", "cluster role: init | control-plane | worker (a cluster block needs a release image)")
	f.StringVar(&c.host, "control-plane-host", "", "the API server's host[:port] (a bare host gets :6443)")
	f.StringVar(&c.version, "kubernetes-version", "", "pinned Kubernetes version, e.g. v1.31.2 (must equal the release's kubeadm version)")
	f.StringVar(&c.tokenFile, "cluster-token-file", "", "file holding the cluster token (at least 16 characters; never a flag value)")
}

// block is the cluster block of the flags, nil when none is set.
func (c *clusterFlags) block() (*api.ClusterBlock, error) {
	if c.role == "" && c.host == "" && c.version == "" && c.tokenFile == "" {
		return nil, nil
	}
	if c.role == "" || c.version == "" || c.tokenFile == "" {
		return nil, errors.New("a cluster block needs --cluster-role, --kubernetes-version and --cluster-token-file")
	}
	b, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("--cluster-token-file: %w", err)
	}
	return &api.ClusterBlock{Role: c.role, ControlPlaneHost: c.host, KubernetesVersion: c.version,
		ClusterToken: strings.TrimSpace(string(b))}, nil
}
