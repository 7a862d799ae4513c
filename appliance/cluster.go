package appliance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"kiln/bmc"
	"kiln/store"
	"kiln/store/pki"
)

// siteKeySecret is the name of the site key among the secrets a member
// hands a node it admits (store.Config.JoinSecrets).
const siteKeySecret = "site_key"

// siteCredentials returns this node's site certificate (package pki) and
// the site key that seals BMC credentials, making or fetching them on the
// node's first start (store/DESIGN.md "Cluster trust"):
//
//   - credentials in raft.tls_dir: they are used (the node ID must match);
//   - none, raft.join and raft.join_token set: the node enrolls with a
//     member (store.Enroll, within raft.join_timeout), writes the site key it
//     receives to bmc.key_file, then its credentials to raft.tls_dir;
//   - none and raft.bootstrap: a new site CA and node certificate are made
//     (so a single node needs no operator step) and the site key is made or
//     kept (bmc.LoadOrCreateKey);
//   - otherwise an error saying what to set.
func siteCredentials(cfg Config, log *slog.Logger) (*pki.Identity, []byte, error) {
	id, err := pki.Load(cfg.Raft.TLSDir)
	switch {
	case err == nil:
		if id.NodeID() != cfg.NodeID {
			return nil, nil, fmt.Errorf("site certificate in %s names node %q but node_id is %q: "+
				"restore the node_id, or move %s aside and join the node again with a join token",
				cfg.Raft.TLSDir, id.NodeID(), cfg.NodeID, cfg.Raft.TLSDir)
		}
		key, err := bmc.LoadOrCreateKey(cfg.BMC.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("site key %s: %w", cfg.BMC.KeyFile, err)
		}
		return id, key, nil
	case !errors.Is(err, pki.ErrNoIdentity):
		return nil, nil, fmt.Errorf("site certificate: %w", err)
	}
	switch {
	case len(cfg.Raft.Join) > 0 && cfg.Raft.JoinToken != "":
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Raft.JoinTimeout)
		defer cancel()
		log.Info("enrolling with the cluster", "via", cfg.Raft.Join)
		id, secrets, err := store.Enroll(ctx, cfg.Raft.Join, cfg.Raft.JoinToken, cfg.NodeID)
		if err != nil {
			return nil, nil, fmt.Errorf("join (raft.join_token): %w", err)
		}
		key := secrets[siteKeySecret]
		if len(key) != bmc.KeySize {
			return nil, nil, fmt.Errorf("join: the member sent no site key (%d bytes)", len(key))
		}
		if err := writeSiteKey(cfg.BMC.KeyFile, key); err != nil {
			return nil, nil, err
		}
		if err := id.Save(cfg.Raft.TLSDir); err != nil {
			return nil, nil, err
		}
		log.Info("enrolled: site certificate and site key received", "serial", pki.Serial(id.Cert),
			"ca", "sha256:"+id.CAHash())
		return id, key, nil
	case len(cfg.Raft.Join) > 0:
		return nil, nil, fmt.Errorf("config: raft.join_token is required for this node's first start in an existing cluster "+
			"(no site certificate in %s): run `kiln cluster token create` against a member and set raft.join_token", cfg.Raft.TLSDir)
	case cfg.Raft.Bootstrap:
		id, err := pki.NewSite(cfg.NodeID, time.Now())
		if err != nil {
			return nil, nil, err
		}
		key, err := bmc.LoadOrCreateKey(cfg.BMC.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("site key %s: %w", cfg.BMC.KeyFile, err)
		}
		if err := id.Save(cfg.Raft.TLSDir); err != nil {
			return nil, nil, err
		}
		log.Info("made the site CA and this node's certificate", "dir", cfg.Raft.TLSDir, "ca", "sha256:"+id.CAHash())
		return id, key, nil
	default:
		return nil, nil, fmt.Errorf("config: no site certificate in %s: set raft.bootstrap: true for a new site, "+
			"or raft.join and raft.join_token to join one", cfg.Raft.TLSDir)
	}
}

// writeSiteKey stores the site key received at enrollment (0600). A key
// file already there with other bytes is refused: it may seal credentials
// of another site.
func writeSiteKey(path string, key []byte) error {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, key):
		return nil
	case err == nil:
		return fmt.Errorf("join: %s holds another site key; move it aside (it may seal another site's credentials) and start again with a new join token", path)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("site key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("site key dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("site key: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		return fmt.Errorf("site key write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("site key sync: %w", err)
	}
	return f.Close()
}
