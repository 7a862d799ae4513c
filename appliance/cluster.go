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

// siteCredentials returns this node's site certificate (package pki) and
// the site keyring that seals BMC credentials (primary first), making or fetching them on the
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
func siteCredentials(cfg Config, log *slog.Logger) (*pki.Identity, [][]byte, error) {
	id, err := pki.Load(cfg.Raft.TLSDir)
	switch {
	case err == nil:
		if id.NodeID() != cfg.NodeID {
			return nil, nil, fmt.Errorf("site certificate in %s names node %q but node_id is %q: "+
				"restore the node_id, or move %s aside and join the node again with a join token",
				cfg.Raft.TLSDir, id.NodeID(), cfg.NodeID, cfg.Raft.TLSDir)
		}
		keys, err := loadKeyring(cfg.BMC.KeyFile)
		if err != nil {
			return nil, nil, err
		}
		return id, keys, nil
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
		keys, err := bmc.SplitKeyring(secrets[secretKeyring])
		if err != nil {
			return nil, nil, fmt.Errorf("join: the member sent no usable site key: %w", err)
		}
		if err := writeSiteKey(cfg.BMC.KeyFile, bmc.JoinKeyring(keys)); err != nil {
			return nil, nil, err
		}
		if err := id.Save(cfg.Raft.TLSDir); err != nil {
			return nil, nil, err
		}
		log.Info("enrolled: site certificate and site key received", "serial", pki.Serial(id.Cert),
			"ca", "sha256:"+id.CAHash())
		return id, keys, nil
	case len(cfg.Raft.Join) > 0:
		return nil, nil, fmt.Errorf("config: raft.join_token is required for this node's first start in an existing cluster "+
			"(no site certificate in %s): run `kiln cluster token create` against a member and set raft.join_token", cfg.Raft.TLSDir)
	case cfg.Raft.Bootstrap:
		id, err := pki.NewSite(cfg.NodeID, time.Now())
		if err != nil {
			return nil, nil, err
		}
		keys, err := loadKeyring(cfg.BMC.KeyFile)
		if err != nil {
			return nil, nil, err
		}
		if err := id.Save(cfg.Raft.TLSDir); err != nil {
			return nil, nil, err
		}
		log.Info("made the site CA and this node's certificate", "dir", cfg.Raft.TLSDir, "ca", "sha256:"+id.CAHash())
		return id, keys, nil
	default:
		return nil, nil, fmt.Errorf("config: no site certificate in %s: set raft.bootstrap: true for a new site, "+
			"or raft.join and raft.join_token to join one", cfg.Raft.TLSDir)
	}
}

// loadKeyring reads the site keyring at path, or makes a one-key keyring
// there when the file does not exist (bmc.LoadOrCreateKey).
func loadKeyring(path string) ([][]byte, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		key, err := bmc.LoadOrCreateKey(path)
		if err != nil {
			return nil, fmt.Errorf("site key %s: %w", path, err)
		}
		return [][]byte{key}, nil
	}
	keys, err := bmc.LoadKeyring(path)
	if err != nil {
		return nil, fmt.Errorf("site key %s: %w", path, err)
	}
	return keys, nil
}

// writeSiteKey stores the site keyring received at enrollment (0600). A key
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
