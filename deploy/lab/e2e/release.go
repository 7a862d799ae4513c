package e2e

// Issue 15 in the lab: the VM is provisioned with the lab OS release
// (deploy/lab/labos) instead of the plain lab image. Kiln chooses layers by
// role and hardware, the agent writes and verifies every chosen layer and
// the per-node layer, the VM boots the written OS from its disk, and the
// OS's first-boot report makes the machine provisioned. The host then
// checks every layer's digest and the per-node layer's hash on the disk.
// With Options.VerifyFault the first build is served a layer whose bytes on
// the appliance no longer match its pin: the build must fail in verify,
// leave a disk no firmware boots, and netboot the agent again.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/cmd/kiln-agent/agent"
	"kiln/deploy/lab/labos"
)

var (
	relOnce sync.Once
	relDir  string
	relOut  *labos.Release
	relErr  error
)

// labRelease builds the lab OS release once per process (the runs of one
// `go test` share it) in a directory of its own; CleanupRelease removes it.
func labRelease(o Options, say func(string, ...any)) (*labos.Release, error) {
	relOnce.Do(func() {
		start := time.Now()
		if relDir, relErr = os.MkdirTemp("", "kiln-e2e-labos-"); relErr != nil {
			return
		}
		relOut, relErr = labos.Build(labos.Options{Dir: relDir, RepoRoot: o.Root})
		if relErr == nil {
			say("release: %s built from Debian packages in %.1f s", relOut.Manifest.Release, time.Since(start).Seconds())
		}
	})
	return relOut, relErr
}

// CleanupRelease removes the release labRelease built, if any (a test
// binary's TestMain, the demo after its run).
func CleanupRelease() {
	if relDir != "" {
		_ = os.RemoveAll(relDir)
	}
}

// uploadRelease uploads every layer file of rel as a catalog image and
// registers the base image's release manifest (PUT /v1/images/ID/manifest),
// as `kiln images upload` and `kiln images manifest` do. It returns the
// release image and the catalog image of each layer by name.
func uploadRelease(ctx context.Context, c *client.Client, rel *labos.Release) (api.Image, map[string]api.Image, error) {
	imgs := map[string]api.Image{}
	var req api.ManifestRequest
	req.KubeadmVersion = rel.Manifest.KubeadmVersion
	for _, l := range rel.Manifest.Layers {
		path := rel.Paths[l.Name]
		f, err := os.Open(path)
		if err != nil {
			return api.Image{}, nil, err
		}
		name := rel.Manifest.Name
		if l.Name != "base" {
			name += "-" + l.Name
		}
		im, err := c.UploadImage(ctx, client.ImageMeta{Name: name, Version: rel.Manifest.Release, SHA256: l.SHA256,
			Source: filepath.Base(path)}, f, l.Size)
		f.Close()
		if err != nil {
			return api.Image{}, nil, fmt.Errorf("upload layer %s: %w", l.Name, err)
		}
		imgs[l.Name] = im
		ml := api.Layer{Name: l.Name, When: l.When, VerityRootHash: l.VerityRootHash, VerityHashOffset: uint64(l.VerityHashOffset)}
		if l.Name != "base" {
			ml.Image = im.ID
		}
		req.Layers = append(req.Layers, ml)
	}
	req.Reason = "e2e release " + rel.Manifest.Release
	base, err := c.SetManifest(ctx, imgs["base"].ID, req)
	if err != nil {
		return api.Image{}, nil, fmt.Errorf("release manifest: %w", err)
	}
	return base, imgs, nil
}

// clusterToken is a fresh 128-bit cluster token (32 hex characters).
func clusterToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// catalogFile is the file in Kiln's image directory holding the bytes of
// digest sha (the catalog names files itself; the digest finds it).
func catalogFile(dir, sha string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if got, err := fileSHA256(p, 0, -1); err == nil && got == sha {
			return p, nil
		}
	}
	return "", fmt.Errorf("no file in %s holds sha256 %s", dir, sha)
}

// flipByte inverts the byte at off of path and keeps the file's
// modification time, as bit rot on the appliance's disk would: the
// catalog's cached digest (keyed by size and mtime) still claims the pin.
// Calling it twice restores the file.
func flipByte(path string, off int64) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		f.Close()
		return err
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chtimes(path, st.ModTime(), st.ModTime())
}

// fileSHA256 is the hex SHA-256 of n bytes of path from off (n < 0: to the end).
func fileSHA256(path string, off, n int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return "", err
	}
	if n >= 0 {
		r = io.LimitReader(f, n)
	}
	h := sha256.New()
	got, err := io.Copy(h, r)
	if err != nil {
		return "", err
	}
	if n >= 0 && got != n {
		return "", fmt.Errorf("%s: %d bytes at %d, want %d", path, got, off, n)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// wantLayers is the layer choice the rules give for a machine with
// this inspection and claim, computed here independently of Kiln: base
// always; control-plane for a cluster role init or control-plane (or claim
// role control-plane); gpu for a PCI device of vendor 0x10de with base
// class 0x03; secure-runtime when the CPU flags hold vmx or svm.
func wantLayers(m api.Machine) []string {
	want := []string{"base"}
	role := ""
	if m.Claim != nil {
		role = m.Claim.Role
		if cl := m.Claim.Cluster; cl != nil {
			role = cl.Role
		}
	}
	if role == "init" || role == "control-plane" {
		want = append(want, "control-plane")
	}
	if d := m.Discovered; d != nil {
		for _, p := range d.PCI {
			if p.VendorID == 0x10de && p.Class>>16 == 0x03 {
				want = append(want, "gpu")
				break
			}
		}
		for _, f := range d.CPUFlags {
			if f == "vmx" || f == "svm" {
				want = append(want, "secure-runtime")
				break
			}
		}
	}
	sort.Strings(want)
	return want
}

// checkLayerChoice compares the build record's chosen and skipped layers
// with wantLayers: every chosen one has its reason, every other layer of
// the manifest is skipped with a reason. It returns "chosen a,b; skipped c
// (reason)" for the run's output.
func checkLayerChoice(m api.Machine, rel *labos.Release) (string, error) {
	b := m.Build
	if b == nil {
		return "", fmt.Errorf("machine %s has no build record", m.ID)
	}
	var got, desc []string
	for _, l := range b.Layers {
		if l.Reason == "" {
			return "", fmt.Errorf("layer %s chosen without a reason", l.Name)
		}
		got = append(got, l.Name)
		desc = append(desc, l.Name+" ("+l.Reason+")")
	}
	sort.Strings(got)
	want := wantLayers(m)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		return "", fmt.Errorf("layers chosen %v; the inspection (%d PCI devices, %d CPU flags) and the claim give %v", got, len(m.Discovered.PCI), len(m.Discovered.CPUFlags), want)
	}
	var skipped []string
	for _, l := range b.Skipped {
		if l.Reason == "" {
			return "", fmt.Errorf("layer %s skipped without a reason", l.Name)
		}
		skipped = append(skipped, l.Name+" ("+l.Reason+")")
	}
	if len(b.Layers)+len(b.Skipped) != len(rel.Manifest.Layers) {
		return "", fmt.Errorf("%d layers chosen and %d skipped of a manifest of %d", len(b.Layers), len(b.Skipped), len(rel.Manifest.Layers))
	}
	return "chosen " + strings.Join(desc, ", ") + "; skipped " + strings.Join(skipped, ", "), nil
}

// checkReleaseDisk checks, from the host, the disk a release build wrote:
// the GPT (sgdisk -v clean) holds the base image's partitions and one
// partition per further chosen layer and kiln-node, where the build record
// says; every chosen layer's bytes hash to its pin (the base: every byte of
// the image except the three sectors the table update rewrites, which are
// taken from the image, so the digest covers what the image wrote, and
// sgdisk checks the rewritten table); kiln-node's whole partition hashes to
// the node layer SHA-256 Kiln recorded (and the OS reported); kiln-root
// and every layer pass veritysetup verify with the manifest's root hash.
// It returns a description of the first problem ("" when none).
func checkReleaseDisk(disk string, rel *labos.Release, m api.Machine) (string, error) {
	b := m.Build
	if b == nil {
		return "no build record", nil
	}
	if out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput(); err != nil || !bytes.Contains(out, []byte("No problems found")) {
		return fmt.Sprintf("sgdisk -v: %v: %s", err, bytes.TrimSpace(out)), nil
	}
	f, err := os.Open(disk)
	if err != nil {
		return "", err
	}
	defer f.Close()
	parts, err := agent.ReadGPTPartitions(f, 512)
	if err != nil {
		return "partition table: " + err.Error(), nil
	}
	byName := map[string]agent.GPTPart{}
	for _, p := range parts {
		byName[p.Name] = p
	}
	for _, l := range b.Layers {
		ml := rel.Layer(l.Name)
		if ml == nil {
			return "layer " + l.Name + " is not in the release", nil
		}
		if l.SHA256 != ml.SHA256 || l.Written == nil || l.Written.SHA256 != ml.SHA256 {
			return fmt.Sprintf("layer %s: recorded pin %s, written %+v; the release pins %s", l.Name, l.SHA256, l.Written, ml.SHA256), nil
		}
		if l.Name == "base" {
			got, err := baseDigest(disk, rel.Paths["base"], ml.Size)
			if err != nil {
				return "", err
			}
			if got != ml.SHA256 {
				return fmt.Sprintf("base layer on the disk hashes to %s, pinned %s", got, ml.SHA256), nil
			}
			root, ok := byName["kiln-root"]
			if !ok {
				return "no kiln-root partition", nil
			}
			if p := verityVerify(disk, root, ml); p != "" {
				return p, nil
			}
			continue
		}
		p, ok := byName[ml.PartName]
		if !ok {
			return fmt.Sprintf("no partition %s for layer %s", ml.PartName, l.Name), nil
		}
		if uint64(p.Start) != l.Written.Start {
			return fmt.Sprintf("layer %s starts at %d, the build record says %d", l.Name, p.Start, l.Written.Start), nil
		}
		got, err := fileSHA256(disk, p.Start, ml.Size)
		if err != nil {
			return "", err
		}
		if got != ml.SHA256 {
			return fmt.Sprintf("layer %s on the disk hashes to %s, pinned %s", l.Name, got, ml.SHA256), nil
		}
		if pr := verityVerify(disk, p, ml); pr != "" {
			return pr, nil
		}
	}
	for _, l := range b.Skipped {
		if ml := rel.Layer(l.Name); ml != nil && ml.PartName != "" {
			if _, ok := byName[ml.PartName]; ok {
				return "skipped layer " + l.Name + " has a partition", nil
			}
		}
	}
	nd, ok := byName["kiln-node"]
	if !ok {
		return "no kiln-node partition", nil
	}
	got, err := fileSHA256(disk, nd.Start, nd.Size)
	if err != nil {
		return "", err
	}
	if got != b.NodeLayerSHA256 {
		return fmt.Sprintf("kiln-node hashes to %s, Kiln recorded %s", got, b.NodeLayerSHA256), nil
	}
	if fb := b.FirstBoot; fb == nil || fb.NodeLayerSHA256 != got {
		return fmt.Sprintf("the first-boot report's node layer hash %+v is not the disk's %s", fb, got), nil
	}
	return "", nil
}

// baseDigest hashes the disk's first size bytes with sectors 0-33 (the
// protective MBR, the primary GPT header and its 128-entry array: what the
// table update may rewrite) taken from the base image. The base image's
// own entries (the first two) must be unchanged on the disk.
func baseDigest(disk, base string, size int64) (string, error) {
	const keep = 34 * 512
	img, err := os.Open(base)
	if err != nil {
		return "", err
	}
	defer img.Close()
	d, err := os.Open(disk)
	if err != nil {
		return "", err
	}
	defer d.Close()
	ie, de := make([]byte, 256), make([]byte, 256)
	if _, err := img.ReadAt(ie, 1024); err != nil {
		return "", err
	}
	if _, err := d.ReadAt(de, 1024); err != nil {
		return "", err
	}
	if !bytes.Equal(ie, de) {
		return "base partition entries changed on the disk", nil
	}
	h := sha256.New()
	if _, err := io.CopyN(h, img, keep); err != nil {
		return "", err
	}
	if _, err := d.Seek(keep, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := io.CopyN(h, d, size-keep); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// verityVerify runs veritysetup verify on partition p of disk (copied out:
// veritysetup reads files, and the copy is the partition's bytes).
func verityVerify(disk string, p agent.GPTPart, l *labos.Layer) string {
	tmp, err := os.CreateTemp("", "kiln-e2e-part-")
	if err != nil {
		return err.Error()
	}
	defer os.Remove(tmp.Name())
	d, err := os.Open(disk)
	if err != nil {
		tmp.Close()
		return err.Error()
	}
	_, err = io.Copy(tmp, io.NewSectionReader(d, p.Start, p.Size))
	d.Close()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err.Error()
	}
	out, err := exec.Command("veritysetup", "verify", tmp.Name(), tmp.Name(), l.VerityRootHash,
		fmt.Sprintf("--hash-offset=%d", l.VerityHashOffset)).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("veritysetup verify of %s (layer %s): %v: %s", p.Name, l.Name, err, bytes.TrimSpace(out))
	}
	return ""
}

// clearedTable reports whether the first and the last MiB of disk are all
// zeros (ClearPartitionTable's promise: no MBR signature, no GPT).
func clearedTable(disk string) (bool, error) {
	f, err := os.Open(disk)
	if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	buf := make([]byte, 1<<20)
	for _, off := range []int64{0, st.Size() - 1<<20} {
		if _, err := f.ReadAt(buf, off); err != nil {
			return false, err
		}
		for _, c := range buf {
			if c != 0 {
				return false, nil
			}
		}
	}
	return true, nil
}

// verifyFault is the rest of a VerifyFault run after the first build
// settled: it must have failed in verify (digest_mismatch: the bytes
// served are not the pinned ones) with the disk's partition table cleared;
// the layer's byte is restored; the machine, still failed, is power-cycled
// through its BMC and must netboot the agent again (never its disk); then
// the operator reprovisions it (Reprovision: reinspect, then the claim's
// build again).
func verifyFault(ctx context.Context, k *kiln, w *watcher, r *Result, disk, faulty string, off int64, stateDir string, say func(string, ...any)) error {
	m := w.last
	r.FaultReason = m.Reason
	inVerify := false
	for _, e := range w.seen {
		if e.Subject == "machine/"+m.ID && e.Kind == "step" && e.To == "failed" && strings.HasPrefix(e.Message, "verify") {
			inVerify = true
		}
	}
	if m.State != client.StateFailed || m.Reason != "digest_mismatch" || !inVerify {
		return fmt.Errorf("the build served a corrupted layer ended %s (%s, a failed verify step seen: %v) %q; want failed in verify (digest_mismatch)",
			m.State, m.Reason, inVerify, m.Message)
	}
	var err error
	if r.FaultCleared, err = clearedTable(disk); err != nil {
		return err
	}
	say("fault: build failed in verify (%s) %q; partition table cleared: %v", m.Reason, m.Message, r.FaultCleared)
	if err := flipByte(faulty, off); err != nil {
		return err
	}
	before, _ := filepath.Glob(filepath.Join(stateDir, "serial*.log"))
	old := map[string]bool{}
	for _, l := range before {
		old[l] = true
	}
	start := time.Now()
	if _, err := k.api.Power(ctx, m.ID, api.PowerRequest{Action: "cycle", Reason: "e2e", Message: "after the failed verify"}); err != nil {
		return fmt.Errorf("power cycle of the failed machine: %w", err)
	}
	back := false
	for deadline := time.Now().Add(150 * time.Second); time.Now().Before(deadline) && !back && ctx.Err() == nil; {
		logs, _ := filepath.Glob(filepath.Join(stateDir, "serial*.log"))
		for _, l := range logs {
			if b, err := os.ReadFile(l); err == nil && !old[l] && bytes.Contains(b, []byte("kiln-agent: registered with")) {
				back = true
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !back {
		return fmt.Errorf("after the failed verify and a power cycle, the VM did not netboot the agent within 150 s (serial logs in %s)", stateDir)
	}
	r.NetbootSeconds = time.Since(start).Seconds()
	cur, err := k.api.GetMachine(ctx, m.ID)
	if err != nil {
		return err
	}
	if cur.State != client.StateFailed {
		return fmt.Errorf("the failed machine's netboot moved it to %s (%s)", cur.State, cur.Reason)
	}
	say("fault: power cycle → the VM netbooted the agent again in %.1f s; the machine stays failed until the operator acts", r.NetbootSeconds)
	if _, err := k.api.Reprovision(ctx, m.ID, api.ActionRequest{Reason: "e2e", Message: "layer restored"}); err != nil {
		return fmt.Errorf("reprovision: %w", err)
	}
	say("claim: reprovisioning %s (the layer's bytes restored)", m.ID)
	return nil
}

// checkRelease checks a provisioned release build: provisioned from the
// first-boot report, the OS up on the console with the claim's hostname,
// the layer choice, every byte on the disk (checkReleaseDisk), the cluster
// token staged on the disk and nowhere else (kiln.log, the serial logs,
// the events, the CLI's answer).
func checkRelease(ctx context.Context, k *kiln, w *watcher, r *Result, o Options, rel *labos.Release, disk, stateDir, secret string, say func(string, ...any)) error {
	m, err := k.api.GetMachine(ctx, r.MachineID)
	if err != nil {
		return err
	}
	r.Machine = m
	var started, done time.Time
	for _, e := range w.seen {
		if e.Kind == "transition" && e.Subject == "machine/"+m.ID {
			switch e.To {
			case string(client.StateProvisioning):
				started = e.Time
			case string(client.StateProvisioned):
				done = e.Time
			}
		}
	}
	if !started.IsZero() && done.After(started) {
		r.BuildSeconds = done.Sub(started).Seconds()
	}
	if fb := m.Build; fb != nil && fb.FirstBoot != nil {
		say("first boot: %s %s hostname=%s fp=%s node_sha256=%s match=%v", fb.FirstBoot.Phase, fb.FirstBoot.Outcome,
			fb.FirstBoot.Hostname, fb.FirstBoot.SSHHostKeyFingerprint, short16(fb.FirstBoot.NodeLayerSHA256), fb.FirstBoot.Match)
	}
	host := "lab-node-1"
	r.OSUp = waitSerialFor(ctx, stateDir, 60*time.Second, func(b []byte) bool {
		return bytes.Contains(b, []byte("kiln-labos: up ")) && bytes.Contains(b, []byte("hostname "+host))
	})
	say("os: the written OS is up with hostname %s: %v", host, r.OSUp)
	if r.LayerChoice, err = checkLayerChoice(m, rel); err != nil {
		return err
	}
	say("layers: %s", r.LayerChoice)
	stopVM(ctx, k, r.MachineID, w.k.lab)
	if r.ReleaseProblem, err = checkReleaseDisk(disk, rel, m); err != nil {
		return err
	}
	b, err := os.ReadFile(disk)
	if err != nil {
		return err
	}
	r.JoinDataStaged = bytes.Contains(b, []byte(secret))
	problem := ""
	if r.ReleaseProblem != "" {
		problem = " (" + r.ReleaseProblem + ")"
	}
	say("disk: every layer's digest, the table, verity and the node layer's hash (%s) as recorded: %v%s; cluster token staged: %v",
		short16(m.Build.NodeLayerSHA256), r.ReleaseProblem == "", problem, r.JoinDataStaged)
	out, err := k.cli(ctx, "machines", "get", r.MachineID, "-o", "json")
	if err != nil {
		return err
	}
	places := map[string][]byte{"kiln machines get": out}
	if b, err := os.ReadFile(k.logPath); err == nil {
		places["kiln.log"] = b
	}
	logs, _ := filepath.Glob(filepath.Join(stateDir, "serial*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			places[filepath.Base(l)] = b
		}
	}
	var evs bytes.Buffer
	for _, e := range w.seen {
		evs.WriteString(e.Message + "\n" + e.Reason + "\n")
	}
	places["events"] = evs.Bytes()
	var leaks []string
	for name, b := range places {
		if bytes.Contains(b, []byte(secret)) {
			leaks = append(leaks, name)
		}
	}
	sort.Strings(leaks)
	r.SecretLeak = strings.Join(leaks, ", ")
	return nil
}

func short16(s string) string {
	if len(s) > 16 {
		return s[:16]
	}
	return s
}
