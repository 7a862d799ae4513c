package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kiln/api/agentapi"
)

// Paths inside the node layer.
const (
	hostnamePath = "etc/hostname"
	hostKeyPub   = "etc/ssh/ssh_host_ed25519_key.pub"
)

// Reporter is one first-boot run. Sys, Dev and Mount locate the partition (see
// main's flags); Dir, when set, is a node layer already on a directory (no
// partition, NodeLayerSHA256 left empty).
type Reporter struct {
	Sys, Dev, Mount, Dir string
	Wait                 time.Duration
	BootIDPath           string
	Console              io.Writer
	MaxBackoff           time.Duration
	Client               *http.Client // nil: a client with a 10 s timeout
	SetHostname          bool         // sethostname(2) from the node layer's /etc/hostname
}

// Run reads the node layer, builds the report and posts it until it is
// acknowledged. It returns an error only when nothing can be reported
// (no partition, no firstboot.json) or a 4xx refused the report.
func (r *Reporter) Run(ctx context.Context) error {
	start := time.Now()
	dir, sum := r.Dir, ""
	if dir == "" {
		dev, err := r.waitPartition(agentapi.PartNode)
		if err != nil {
			return err
		}
		if sum, err = hashFile(dev); err != nil {
			return fmt.Errorf("hash %s: %w", dev, err)
		}
		if err := os.MkdirAll(r.Mount, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(dev, r.Mount, "ext4", syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "noload"); err != nil {
			return fmt.Errorf("mount %s on %s (ext4 ro,noload): %w", dev, r.Mount, err)
		}
		defer syscall.Unmount(r.Mount, 0)
		dir = r.Mount
	}
	cfg, err := readConfig(filepath.Join(dir, strings.TrimPrefix(agentapi.PathFirstBoot, "/")))
	if err != nil {
		return err
	}
	rep := r.report(dir, cfg.MachineID, sum)
	if r.SetHostname && rep.Hostname != "" && rep.Outcome == agentapi.OutcomeSucceeded {
		if err := syscall.Sethostname([]byte(rep.Hostname)); err != nil {
			fmt.Fprintf(r.Console, "kiln-firstboot: sethostname %s: %v\n", rep.Hostname, err)
		}
	}
	status, err := r.post(ctx, cfg, rep)
	if err != nil {
		return err
	}
	if rep.Outcome == agentapi.OutcomeSucceeded {
		fmt.Fprintf(r.Console, "kiln-firstboot: reported hostname=%s fp=%s node_sha256=%s status=%d after %.1f s\n",
			rep.Hostname, rep.SSHHostKeyFingerprint, rep.NodeLayerSHA256, status, time.Since(start).Seconds())
	} else {
		fmt.Fprintf(r.Console, "kiln-firstboot: reported failure reason=%s message=%q status=%d after %.1f s\n",
			rep.Reason, rep.Message, status, time.Since(start).Seconds())
	}
	return nil
}

// report reads hostname and host key from the node layer at dir; a missing or
// malformed file makes a failed node_layer report naming it.
func (r *Reporter) report(dir, machineID, sum string) agentapi.FirstBootReport {
	rep := agentapi.FirstBootReport{MachineID: machineID, Phase: agentapi.PhaseNodeLayer,
		Outcome: agentapi.OutcomeSucceeded, NodeLayerSHA256: sum, BootID: readTrim(r.BootIDPath)}
	fail := func(err error) agentapi.FirstBootReport {
		rep.Outcome, rep.Reason = agentapi.OutcomeFailed, agentapi.ReasonFirstBootNodeLayer
		rep.Message = agentapi.SanitizeMessage(err.Error(), agentapi.MaxFirstBootMessageLen)
		return rep
	}
	h, err := os.ReadFile(filepath.Join(dir, hostnamePath))
	if err != nil {
		return fail(fmt.Errorf("/%s: %w", hostnamePath, errors.Unwrap(err)))
	}
	rep.Hostname = strings.TrimSpace(string(h))
	if !validHostname(rep.Hostname) {
		return fail(fmt.Errorf("/%s: not a hostname", hostnamePath))
	}
	pub, err := os.ReadFile(filepath.Join(dir, hostKeyPub))
	if err != nil {
		return fail(fmt.Errorf("/%s: %w", hostKeyPub, errors.Unwrap(err)))
	}
	if rep.SSHHostKeyFingerprint, err = Fingerprint(pub); err != nil {
		return fail(fmt.Errorf("/%s: %w", hostKeyPub, err))
	}
	return rep
}

// post sends rep to each URL in turn until one answers 2xx (nil) or 4xx (an
// error: the report was refused and a retry would be refused too).
func (r *Reporter) post(ctx context.Context, cfg agentapi.FirstBootFile, rep agentapi.FirstBootReport) (int, error) {
	body, err := json.Marshal(rep)
	if err != nil {
		return 0, err
	}
	c := r.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	backoff := 500 * time.Millisecond
	for attempt := 0; ; attempt++ {
		u := strings.TrimRight(cfg.URLs[attempt%len(cfg.URLs)], "/") + agentapi.EndpointFirstBoot
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cfg.Token)
		req.Header.Set(agentapi.HeaderMachine, cfg.MachineID)
		resp, err := c.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			switch {
			case resp.StatusCode/100 == 2:
				return resp.StatusCode, nil
			case resp.StatusCode/100 == 4:
				return resp.StatusCode, fmt.Errorf("%s refused the report: %s %s", u, resp.Status,
					agentapi.SanitizeMessage(strings.TrimSpace(string(msg)), 200))
			}
			err = errors.New(resp.Status)
		}
		if attempt%len(cfg.URLs) == len(cfg.URLs)-1 {
			fmt.Fprintf(r.Console, "kiln-firstboot: %s: %v; retrying in %s\n", u, err, backoff)
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(backoff):
			}
			if backoff *= 2; backoff > r.MaxBackoff {
				backoff = r.MaxBackoff
			}
		}
	}
}

// waitPartition returns /dev/NAME of the partition whose uevent says
// PARTNAME=name, polling every 200 ms for up to r.Wait (the disk driver may
// still be probing).
func (r *Reporter) waitPartition(name string) (string, error) {
	deadline := time.Now().Add(r.Wait)
	for {
		dev, err := FindPartition(r.Sys, r.Dev, name)
		if err == nil || time.Now().After(deadline) {
			return dev, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// FindPartition scans sys/class/block/*/uevent for PARTNAME=name and returns
// dev/DEVNAME. More than one match is an error (which one holds this node's
// layer would be a guess).
func FindPartition(sys, dev, name string) (string, error) {
	ue, _ := filepath.Glob(filepath.Join(sys, "class/block/*/uevent"))
	var found []string
	for _, p := range ue {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var devname, partname string
		s := bufio.NewScanner(f)
		for s.Scan() {
			k, v, _ := strings.Cut(s.Text(), "=")
			switch k {
			case "DEVNAME":
				devname = v
			case "PARTNAME":
				partname = v
			}
		}
		f.Close()
		if partname == name && devname != "" {
			found = append(found, filepath.Join(dev, devname))
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no partition named %s", name)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%d partitions named %s: %s", len(found), name, strings.Join(found, " "))
}

// Fingerprint returns the SHA-256 fingerprint of an OpenSSH public key line
// ("ssh-ed25519 AAAA… comment") as `ssh-keygen -l` prints it: "SHA256:" and
// the unpadded base64 of the SHA-256 of the key blob.
func Fingerprint(pub []byte) (string, error) {
	f := strings.Fields(string(pub))
	if len(f) < 2 {
		return "", errors.New("not an OpenSSH public key line")
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil {
		return "", fmt.Errorf("key blob: %w", err)
	}
	// The blob starts with the key type as an SSH string; it must match the line's.
	if len(blob) < 4 {
		return "", errors.New("key blob too short")
	}
	n := int(blob[0])<<24 | int(blob[1])<<16 | int(blob[2])<<8 | int(blob[3])
	if n > len(blob)-4 || string(blob[4:4+n]) != f[0] {
		return "", fmt.Errorf("key blob is not of type %s", agentapi.SanitizeMessage(f[0], 32))
	}
	sum := sha256.Sum256(blob)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:]), nil
}

func readConfig(path string) (agentapi.FirstBootFile, error) {
	var c agentapi.FirstBootFile
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("node layer: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("node layer %s: %w", agentapi.PathFirstBoot, err)
	}
	if len(c.URLs) == 0 || c.MachineID == "" || c.Token == "" {
		return c, fmt.Errorf("node layer %s: urls, machine_id and token are required", agentapi.PathFirstBoot)
	}
	return c, nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return agentapi.SanitizeMessage(strings.TrimSpace(string(b)), 64)
}

// validHostname: 1-253 bytes of letters, digits, '-' and '.'.
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
