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
	"time"

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

// releaseDetail adds issue 15's part of `kiln machines get`: what
// inspection found for layer choice (PCI devices, CPU virtualization, TPM),
// the claim's cluster block (never its token) and the build record
// (layers chosen and skipped with their reasons, digests, first boot).
func releaseDetail(tw *tabwriter.Writer, m api.Machine) {
	if d := m.Discovered; d != nil {
		for _, p := range d.PCI {
			row(tw, "PCI:", p.Address, fmt.Sprintf("%04x:%04x", p.VendorID, p.DeviceID), fmt.Sprintf("class 0x%06x", p.Class))
		}
		if len(d.CPUFlags) > 0 {
			virt := "none"
			for _, f := range d.CPUFlags {
				if f == "vmx" || f == "svm" {
					virt = f
				}
			}
			row(tw, "CPU flags:", len(d.CPUFlags), "virtualization="+virt)
		}
		if d.TPM != nil {
			row(tw, "TPM:", d.TPM.Version, dash(d.TPM.Manufacturer))
		}
	}
	if m.Claim != nil && m.Claim.Cluster != nil {
		cc := m.Claim.Cluster
		tok := "token=set"
		if cc.TokenWeak {
			tok = "token=set (weak: below ~128 bits)"
		}
		row(tw, "Cluster:", "role="+cc.Role, "control_plane="+dash(cc.ControlPlaneHost), "kubernetes="+cc.KubernetesVersion, tok)
	}
	b := m.Build
	if b == nil {
		return
	}
	row(tw, "Release:", b.Release, "kubeadm="+dash(b.KubeadmVersion), fmt.Sprintf("attempt %d", b.Attempt))
	for _, l := range b.Layers {
		w := "not written yet"
		if l.Written != nil {
			w = "written " + short(l.Written.SHA256)
		}
		row(tw, "Layer:", l.Name, short(l.SHA256), w, l.Reason)
	}
	for _, l := range b.Skipped {
		row(tw, "Skipped:", l.Name, l.Reason)
	}
	if b.NodeLayerSHA256 != "" {
		row(tw, "Node layer:", short(b.NodeLayerSHA256), b.SSHHostKeyFingerprint)
	}
	if fb := b.FirstBoot; fb != nil {
		row(tw, "First boot:", fb.Phase, fb.Outcome, dash(fb.Reason), map[bool]string{true: "matches the build", false: "DOES NOT MATCH"}[fb.Match], fb.Message)
	} else if !b.FirstBootDeadline.IsZero() {
		row(tw, "First boot:", "awaited by "+b.FirstBootDeadline.Format(time.RFC3339))
	}
}
