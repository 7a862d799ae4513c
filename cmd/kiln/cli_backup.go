package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/appliance"
)

// backupCmd is `kiln backup FILE` (GET /v1/backup through the API client).
// restoreCmd (`kiln restore`) and recoverCmd (`kiln cluster recover`) are
// offline: they work on a data directory with no node running on it.
// store/DESIGN.md "Backup, restore, recovery" is the runbook.
func backupCmd(o *cliOpts) *cobra.Command {
	var images bool
	c := &cobra.Command{
		Use:   "backup FILE",
		Short: "Write a backup archive of the site: the store's state and a manifest of images and environment files",
		Long: `Write a backup archive (tar) to FILE ("-" for stdout): a consistent snapshot of
the store (machines, leases, events, images, BMC records with their sealed
credentials, jobs, cluster records), and a manifest listing every image and
in-RAM environment file with its SHA-256. Image files are included only with
--images; otherwise they are referenced by digest. The site key is not in the
archive: keep the key file (bmc.key_file) apart, and give it to kiln restore.
Restore with: kiln restore FILE --data-dir DIR --node-id ID.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			out := os.Stdout
			tmp := ""
			if args[0] != "-" {
				if out, err = os.CreateTemp(filepath.Dir(args[0]), ".kiln-backup-*"); err != nil {
					return err
				}
				tmp = out.Name()
				defer os.Remove(tmp) // after the rename, a no-op
			}
			n, err := cl.Backup(cmd.Context(), out, api.BackupOptions{Images: images})
			if tmp == "" {
				return err
			}
			if err == nil {
				err = out.Sync()
			}
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("backup: %w (nothing written to %s)", err, args[0])
			}
			if err := os.Rename(tmp, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "backup: %d bytes written to %s\n", n, termSafe(args[0]))
			return nil
		},
	}
	c.Flags().BoolVar(&images, "images", false, "include the image files (default: listed by digest only)")
	return c
}

// offlineFlags are restore's and recover's: the node's identity and data
// directory, from --config (a kiln.yaml) and/or flags (flags win).
type offlineFlags struct {
	config, dataDir, nodeID, raftAddr string
}

func (f *offlineFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.config, "config", "", "the node's kiln.yaml (node_id, data_dir, raft.addr, boot.image_dir)")
	c.Flags().StringVar(&f.dataDir, "data-dir", "", "the node's data_dir")
	c.Flags().StringVar(&f.nodeID, "node-id", "", "the node's node_id")
	c.Flags().StringVar(&f.raftAddr, "raft-addr", "", "the node's raft.addr (default "+appliance.DefaultRaftAddr+")")
}

// resolve returns the config (defaults, then --config, then the flags).
func (f *offlineFlags) resolve() (appliance.Config, error) {
	cfg := appliance.DefaultConfig()
	if f.config != "" {
		var err error
		if cfg, err = appliance.LoadConfig(f.config); err != nil {
			return cfg, err
		}
	} else {
		cfg.DataDir, cfg.NodeID = "", ""
	}
	if f.dataDir != "" {
		cfg.DataDir = f.dataDir
		if f.config == "" {
			cfg.Boot.ImageDir = filepath.Join(f.dataDir, "images")
		}
	}
	if f.nodeID != "" {
		cfg.NodeID = f.nodeID
	}
	if f.raftAddr != "" {
		cfg.Raft.Addr = f.raftAddr
	}
	switch {
	case cfg.DataDir == "":
		return cfg, errors.New("--data-dir (or --config) is required")
	case cfg.NodeID == "":
		return cfg, errors.New("--node-id (or --config with node_id) is required")
	}
	if cfg.Boot.ImageDir == "" {
		cfg.Boot.ImageDir = filepath.Join(cfg.DataDir, "images")
	}
	return cfg, nil
}

func restoreCmd() *cobra.Command {
	var of offlineFlags
	var siteKey string
	c := &cobra.Command{
		Use:   "restore FILE",
		Short: "Build a new one-node site from a backup archive (offline)",
		Long: `Build, in a fresh data directory, a node that kiln serve opens as a one-node
cluster holding the backed-up state. Run it with no node on that directory;
it refuses a data directory that is not empty. Then start kiln serve with the
same node_id, raft.addr and data_dir, and raft.bootstrap: true (the node makes
a new site certificate). Give --site-key the old site's key file (bmc.key_file)
so that the BMC credentials in the backup can be opened. Images the archive
does not hold (backed up without --images) are listed: copy them into the
image directory (their SHA-256 is in the list). Grow the cluster again with
kiln cluster token create and new nodes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := of.resolve()
			if err != nil {
				return err
			}
			in := os.Stdin
			if args[0] != "-" {
				if in, err = os.Open(args[0]); err != nil {
					return err
				}
				defer in.Close()
			}
			rep, err := appliance.RestoreBackup(in, appliance.RestoreOptions{DataDir: cfg.DataDir, NodeID: cfg.NodeID,
				RaftAddr: cfg.Raft.Addr, ImageDir: cfg.Boot.ImageDir, SiteKeyFile: siteKey})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "restored the state of node %s (taken %s, raft index %d) into %s as node %s (raft %s)\n",
				termSafe(rep.Manifest.NodeID), rep.Manifest.Created.Format("2006-01-02T15:04:05Z"), rep.Index,
				termSafe(cfg.DataDir), termSafe(cfg.NodeID), termSafe(cfg.Raft.Addr))
			fmt.Fprintf(w, "images restored: %d; images to copy into %s: %d\n", len(rep.Images), termSafe(cfg.Boot.ImageDir), len(rep.Missing))
			for _, m := range rep.Missing {
				fmt.Fprintf(w, "  missing %s\n", termSafe(m))
			}
			for _, e := range rep.Manifest.Env {
				fmt.Fprintf(w, "  environment %s sha256:%s (compare with your build)\n", termSafe(e.Path), e.SHA256)
			}
			if !rep.SiteKey {
				fmt.Fprintln(w, "no --site-key: the node will make a new site key; BMC credentials in the backup stay sealed "+
					"until the old key file is put at bmc.key_file")
			}
			return nil
		},
	}
	of.add(c)
	c.Flags().StringVar(&siteKey, "site-key", "", "the old site's key file (bmc.key_file) to copy into the new data directory")
	return c
}

// recoverCmd is `kiln cluster recover` (added by clusterCmd).
func recoverCmd() *cobra.Command {
	var of offlineFlags
	var servers []string
	c := &cobra.Command{
		Use:   "recover",
		Short: "Make a stopped survivor of a cluster that lost its quorum for good the start of a new one (offline)",
		Long: `For a cluster that has lost a majority of its nodes for good (raft's peers.json
recovery). With every surviving node stopped, run this on each survivor with
the same --server list (all survivors, this one included; without --server,
this node alone). It replays the node's log into its state, entries that never
committed included, and rewrites the cluster's configuration to those servers.
Then start the survivors: they elect a leader among themselves and take writes.
Nodes left out must never be started again with their old data directory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := of.resolve()
			if err != nil {
				return err
			}
			sv := []appliance.RecoverServer{}
			for _, s := range servers {
				id, addr, ok := strings.Cut(s, "=")
				if !ok || id == "" || addr == "" {
					return fmt.Errorf("--server %q: want ID=RAFT_ADDR", s)
				}
				sv = append(sv, appliance.RecoverServer{ID: id, RaftAddr: addr})
			}
			if len(sv) == 0 {
				sv = append(sv, appliance.RecoverServer{ID: cfg.NodeID, RaftAddr: cfg.Raft.Addr})
			}
			idx, err := appliance.RecoverCluster(cfg.DataDir, cfg.NodeID, sv)
			if err != nil {
				return err
			}
			ids := make([]string, len(sv))
			for i, s := range sv {
				ids[i] = termSafe(s.ID) + "=" + termSafe(s.RaftAddr)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "recovered %s at raft index %d; the cluster is now %s: start the node(s)\n",
				termSafe(cfg.NodeID), idx, strings.Join(ids, ", "))
			return nil
		},
	}
	of.add(c)
	c.Flags().StringArrayVar(&servers, "server", nil, "a surviving server, ID=RAFT_ADDR (repeat; default: this node alone)")
	return c
}
