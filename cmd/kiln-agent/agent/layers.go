package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
)

// The layered build (issue 15, cmd/kiln-agent/DESIGN.md "Layered build (issue 15)"): Task.Layers
// set. The base layer (Layers[0]) is a whole GPT disk image written at offset 0; every
// other layer goes into its own appended GPT partition kiln-layer-<name>, then the
// per-node ext4 file system into kiln-node.

// DefaultNodeSize is the kiln-node partition size in bytes.
const DefaultNodeSize = 32 << 20

// Tools the layered build runs in the environment.
const (
	toolVeritysetup = "veritysetup"
	toolMkfsExt4    = "mkfs.ext4"
)

// layout is what the write step placed on the disk: every layer's range and the
// original contents of the image blocks the partition append changed.
type layout struct {
	layers  []LayerPlace
	node    PartInfo
	orig    map[int64][]byte
	baseEnd int64
}

// LayerPlace is one layer on the disk: the layer, its partition (Index 0 for the base,
// which starts at 0), the digest of the stream as served.
type LayerPlace struct {
	Layer  agentapi.Layer
	Part   PartInfo
	Stream uint32 // CRC-32C of the layer as streamed (writeImage)
}

func layerPartName(l agentapi.Layer) string {
	if l.PartName != "" {
		return l.PartName
	}
	return agentapi.LayerPartPrefix + l.Name
}

// checkLayers validates the layers of a task (before anything is written).
func checkLayers(task *agentapi.Task) error {
	seen := map[string]bool{}
	for i, l := range task.Layers {
		if l.Name == "" || l.URL == "" || len(l.SHA256) != 64 || l.Size == 0 {
			return fail(agentapi.StepCheck, agentapi.ReasonInternal, "%v: layer %d (%q) needs name, url, sha256 and size", ErrBadTask, i, l.Name)
		}
		if _, err := hex.DecodeString(l.SHA256); err != nil {
			return fail(agentapi.StepCheck, agentapi.ReasonInternal, "%v: layer %q sha256 is not hex", ErrBadTask, l.Name)
		}
		if i > 0 {
			pn := layerPartName(l)
			if !strings.HasPrefix(pn, agentapi.LayerPartPrefix) || len(pn) > 36 || seen[pn] {
				return fail(agentapi.StepCheck, agentapi.ReasonInternal, "%v: layer %q partition name %q (must be unique, %s…, ≤36 characters)", ErrBadTask, l.Name, pn, agentapi.LayerPartPrefix)
			}
			seen[pn] = true
		}
	}
	return nil
}

// CheckClusterVersion: the claim's pinned Kubernetes version must be the kubeadm version
// the image declares ("v1.31.2" and "1.31.2" are the same version).
func CheckClusterVersion(c *agentapi.ClusterCheck) error {
	if c == nil {
		return nil
	}
	norm := func(s string) string { return strings.TrimPrefix(strings.TrimSpace(s), "v") }
	if c.KubernetesVersion == "" || c.ImageKubeadmVersion == "" || norm(c.KubernetesVersion) != norm(c.ImageKubeadmVersion) {
		return fail(agentapi.StepCheck, agentapi.ReasonVersionMismatch, "cluster kubernetesVersion %q does not match the image's kubeadm %q",
			c.KubernetesVersion, c.ImageKubeadmVersion)
	}
	return nil
}

// layersNeed is the disk size a layered build needs: the base, each layer and kiln-node at
// 1 MiB boundaries, and 1 MiB for the backup GPT.
func layersNeed(layers []agentapi.Layer, nodeSize int64) int64 {
	need := alignUp(int64(layers[0].Size), stageAlign)
	for _, l := range layers[1:] {
		need += alignUp(int64(l.Size), stageAlign)
	}
	return need + alignUp(nodeSize, stageAlign) + stageAlign
}

func layerRef(l agentapi.Layer) *agentapi.ImageRef {
	return &agentapi.ImageRef{URL: l.URL, SHA256: strings.ToLower(l.SHA256), Size: l.Size, Format: l.Format}
}

// stepClearing is step for the steps after the write began: a failure first clears the
// partition table (ClearPartitionTable), so by the time the appliance hears of the
// failure the disk is one the firmware will not boot, and says so in the message.
func (a *Agent) stepClearing(ctx context.Context, name string, dev *Device, imageEnd int64, fn func() (string, error)) error {
	return a.step(ctx, name, func() (string, error) {
		msg, err := fn()
		if err == nil {
			return msg, nil
		}
		var se *StepError
		if !errors.As(err, &se) {
			se = &StepError{Step: name, Reason: agentapi.ReasonInternal, Err: err}
		}
		if cerr := ClearPartitionTable(dev, imageEnd); cerr != nil {
			se.Err = fmt.Errorf("%w; clearing the partition table failed: %v", se.Err, cerr)
		} else {
			se.Err = fmt.Errorf("%w; partition table cleared", se.Err)
		}
		return "", se
	})
}

// provisionLayers is Provision for a task with Layers.
func (a *Agent) provisionLayers(ctx context.Context, task *agentapi.Task) (map[string]string, error) {
	if err := checkLayers(task); err != nil {
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateFailed, Reason: err.(*StepError).Reason, Message: err.(*StepError).Err.Error()})
		return nil, err
	}
	base := task.Layers[0]
	var disk agentapi.Disk
	var dev *Device
	defer func() {
		if dev != nil {
			dev.Close()
		}
	}()
	nodeSize := alignUp(a.cfg.NodeSize, stageAlign)

	// check: nothing is written before every condition holds.
	err := a.step(ctx, agentapi.StepCheck, func() (string, error) {
		if err := CheckClusterVersion(task.Cluster); err != nil {
			return "", err
		}
		for _, tool := range []string{toolMkfsExt4, toolVeritysetup} {
			if tool == toolVeritysetup && base.VerityRootHash == "" {
				continue
			}
			if _, err := a.lookPath(tool); err != nil {
				return "", fail(agentapi.StepCheck, agentapi.ReasonToolMissing, "%s not found in the environment: %v", tool, err)
			}
		}
		disks, err := a.cfg.ListDisks()
		if err != nil {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "list disks: %v", err)
		}
		if disk, err = SelectDisk(disks, task.Disk); err != nil {
			return "", err
		}
		if dev, err = OpenDevice(disk.Path); err != nil {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "open %s: %v", disk.Path, err)
		}
		need := layersNeed(task.Layers, nodeSize)
		if dev.Size < need {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskTooSmall, "%s has %d bytes, %d layers and kiln-node need %d", disk.Path, dev.Size, len(task.Layers), need)
		}
		mbps, err := a.checkDisk(&disk, dev, task)
		if err != nil {
			return "", err
		}
		names := make([]string, len(task.Layers))
		for i, l := range task.Layers {
			names[i] = l.Name
		}
		return fmt.Sprintf("disk %s (%s) %d bytes health %s read %.0f MB/s; layers %s", disk.Path, disk.Name, dev.Size, disk.Health, mbps, strings.Join(names, ",")), nil
	})
	if err != nil {
		return nil, err
	}

	if task.Attest {
		// attest (issue 16): the measured boot is proved before anything is
		// written. A layered build's credentials come from
		// GET /v1/agent/credentials in stage, which Kiln answers only after a
		// pass (its CredentialGate), so the pass's own copy is not used here.
		if err := a.step(ctx, agentapi.StepAttest, func() (string, error) {
			msg, _, err := a.Attest(ctx)
			return msg, err
		}); err != nil {
			return nil, err
		}
	}

	baseEnd := int64(base.Size)
	var lay *layout
	var writeSecs float64
	var total int64
	writeOnce := func() error {
		return a.stepClearing(ctx, agentapi.StepWrite, dev, baseEnd, func() (string, error) {
			l, secs, err := a.writeLayers(ctx, task, dev, nodeSize)
			if err != nil {
				return "", err
			}
			lay, writeSecs = l, secs
			total = 0
			for _, p := range l.layers {
				total += int64(p.Layer.Size)
			}
			return fmt.Sprintf("%d layers, %d bytes in %.1fs (%.1f MB/s)", len(l.layers), total, secs, float64(total)/1e6/secs), nil
		})
	}
	var written []agentapi.LayerWritten
	verifyOnce := func(attempt int) error {
		return a.stepClearing(ctx, agentapi.StepVerify, dev, baseEnd, func() (string, error) {
			written = written[:0]
			for i, p := range lay.layers {
				want := strings.ToLower(p.Layer.SHA256)
				var orig map[int64][]byte
				if i == 0 {
					orig = lay.orig
				}
				got, crc, err := a.readBack(ctx, agentapi.StepVerify, task.Heartbeat, dev, p.Part.Start, int64(p.Layer.Size), orig)
				if err != nil {
					return "", fail(agentapi.StepVerify, agentapi.ReasonWriteFailed, "read back layer %s: %v", p.Layer.Name, err)
				}
				if err := judgeReadBack("layer "+p.Layer.Name, got, want, crc, p.Stream, attempt); err != nil {
					return "", err
				}
				written = append(written, agentapi.LayerWritten{Name: p.Layer.Name, SHA256: got, Start: uint64(p.Part.Start), Size: p.Layer.Size})
			}
			msg := fmt.Sprintf("%d layers read back", len(written))
			if base.VerityRootHash != "" {
				if err := a.verifyVerity(ctx, dev, base); err != nil {
					return "", err
				}
				msg += "; veritysetup verify of " + agentapi.PartRoot + " passed"
			}
			return msg, nil
		})
	}
	for attempt := 0; ; attempt++ {
		if err := writeOnce(); err != nil {
			return nil, err
		}
		err := verifyOnce(attempt)
		if err == nil {
			break
		}
		var se *StepError
		if attempt >= 1 || !errors.As(err, &se) || (se.Reason != agentapi.ReasonDigestMismatch && se.Reason != agentapi.ReasonVerifyMismatch) {
			return nil, err
		}
		a.say("verify mismatch; rewriting once")
	}

	var br agentapi.BuildReport
	err = a.stepClearing(ctx, agentapi.StepStage, dev, baseEnd, func() (string, error) {
		sum, fp, err := a.stageNode(ctx, task, dev, lay.node)
		if err != nil {
			return "", err
		}
		br = agentapi.BuildReport{Layers: written, NodeLayerSHA256: sum, SSHHostKeyFingerprint: fp}
		return fmt.Sprintf("%s partition %d at %d, sha256 %s, host key %s", agentapi.PartNode, lay.node.Index, lay.node.Start, sum, fp), nil
	})
	if err != nil {
		return nil, err
	}

	out := map[string]string{
		"disk":                     disk.Path,
		"disk_name":                disk.Name,
		"bytes":                    strconv.FormatInt(total, 10),
		"sha256":                   strings.ToLower(base.SHA256),
		"sector_size":              strconv.Itoa(dev.SectorSize),
		"write_seconds":            strconv.FormatFloat(writeSecs, 'f', 3, 64),
		"write_bytes_per_s":        strconv.FormatFloat(float64(total)/writeSecs, 'f', 0, 64),
		"node_partition":           strconv.Itoa(lay.node.Index),
		"node_offset_bytes":        strconv.FormatInt(lay.node.Start, 10),
		"node_size_bytes":          strconv.FormatInt(lay.node.Size, 10),
		"node_layer_sha256":        br.NodeLayerSHA256,
		"ssh_host_key_fingerprint": br.SSHHostKeyFingerprint,
		"stage_changed_sectors":    joinInts(lay.node.Changed),
	}
	// finalize: the succeeded report carries the build.
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateStarted})
	if err := dev.Sync(); err != nil {
		se := fail(agentapi.StepFinalize, agentapi.ReasonWriteFailed, "sync: %v", err)
		if cerr := ClearPartitionTable(dev, baseEnd); cerr == nil {
			se.Err = fmt.Errorf("%w; partition table cleared", se.Err)
		}
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error()})
		return nil, se
	}
	_ = dev.RereadPartitions()
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Progress: 1, Written: out, Build: &br}); err != nil {
		return nil, fail(agentapi.StepFinalize, agentapi.ReasonInternal, "report finalize: %v", err)
	}
	return out, nil
}

func (a *Agent) lookPath(tool string) (string, error) {
	if a.cfg.LookPath != nil {
		return a.cfg.LookPath(tool)
	}
	return exec.LookPath(tool)
}

// writeLayers writes the base at 0, appends one GPT partition per further layer and
// kiln-node, and writes each layer into its partition.
func (a *Agent) writeLayers(ctx context.Context, task *agentapi.Task, dev *Device, nodeSize int64) (*layout, float64, error) {
	start := time.Now()
	base := task.Layers[0]
	sum, _, _, err := a.writeImage(ctx, a.resolve(layerRef(base)), task.Heartbeat, dev, 0)
	if err != nil {
		return nil, 0, err
	}
	specs := make([]PartSpec, 0, len(task.Layers))
	for _, l := range task.Layers[1:] {
		specs = append(specs, PartSpec{Name: layerPartName(l), Size: alignUp(int64(l.Size), stageAlign)})
	}
	specs = append(specs, PartSpec{Name: agentapi.PartNode, Size: nodeSize})
	parts, orig, err := AppendGPTPartitions(dev, dev.Size, dev.SectorSize, int64(base.Size), specs)
	if err != nil {
		return nil, 0, fail(agentapi.StepWrite, agentapi.ReasonWriteFailed, "base layer %s: append partitions: %v", base.Name, err)
	}
	lay := &layout{orig: orig, baseEnd: int64(base.Size), node: parts[len(parts)-1],
		layers: []LayerPlace{{Layer: base, Part: PartInfo{Scheme: "gpt", Size: alignUp(int64(base.Size), 512)}, Stream: sum}}}
	for i, l := range task.Layers[1:] {
		// A layer's partition starts with the layer; the rest of its last MiB is zeroed so
		// the partition's content does not depend on what the disk held.
		sum, _, _, err := a.writeImage(ctx, a.resolve(layerRef(l)), task.Heartbeat, dev, parts[i].Start)
		if err != nil {
			return nil, 0, err
		}
		if tail := parts[i].Size - int64(l.Size); tail > 0 {
			if err := zeroRange(dev, parts[i].Start+int64(l.Size), tail); err != nil {
				return nil, 0, fail(agentapi.StepWrite, agentapi.ReasonWriteFailed, "layer %s: zero partition tail: %v", l.Name, err)
			}
		}
		lay.layers = append(lay.layers, LayerPlace{Layer: l, Part: parts[i], Stream: sum})
	}
	if err := dev.Sync(); err != nil {
		return nil, 0, fail(agentapi.StepWrite, agentapi.ReasonWriteFailed, "sync %s: %v", dev.Path, err)
	}
	return lay, time.Since(start).Seconds(), nil
}

// resolve makes a layer URL that is a path ("/v1/…") absolute under the appliance in use.
func (a *Agent) resolve(ref *agentapi.ImageRef) *agentapi.ImageRef {
	if strings.HasPrefix(ref.URL, "/") {
		ref.URL = a.endpoint() + ref.URL
	}
	return ref
}

// verifyVerity runs `veritysetup verify DATA HASH ROOTHASH --hash-offset=N` on the base
// image's kiln-root partition, the hash device being kiln-root-verity when the image has
// it, else kiln-root itself (the tree appended after the data).
func (a *Agent) verifyVerity(ctx context.Context, dev *Device, base agentapi.Layer) error {
	vs, err := a.lookPath(toolVeritysetup)
	if err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonToolMissing, "%s: %v", toolVeritysetup, err)
	}
	parts, err := ReadGPTPartitions(dev, dev.SectorSize)
	if err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonVerityMismatch, "read GPT: %v", err)
	}
	var root, tree *GPTPart
	for i := range parts {
		switch parts[i].Name {
		case agentapi.PartRoot:
			root = &parts[i]
		case agentapi.PartRootVerity:
			tree = &parts[i]
		}
	}
	if root == nil {
		return fail(agentapi.StepVerify, agentapi.ReasonVerityMismatch, "the base image has no %s partition", agentapi.PartRoot)
	}
	if tree == nil {
		tree = root
	}
	if err := dev.Sync(); err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonWriteFailed, "sync: %v", err)
	}
	_ = dev.RereadPartitions() // best effort: PartitionDevice adds what it did not create
	dataDev, err := PartitionDevice(dev, *root, 5*time.Second)
	if err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonInternal, "%v", err)
	}
	hashDev, err := PartitionDevice(dev, *tree, 5*time.Second)
	if err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonInternal, "%v", err)
	}
	args := []string{"verify", dataDev, hashDev, strings.ToLower(base.VerityRootHash)}
	if base.VerityHashOffset > 0 {
		args = append(args, "--hash-offset="+strconv.FormatUint(base.VerityHashOffset, 10))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, vs, args...).CombinedOutput()
	if err != nil {
		return fail(agentapi.StepVerify, agentapi.ReasonVerityMismatch, "veritysetup verify %s: %v: %s", dataDev, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// PartitionDevice returns the device node of partition p of the whole disk dev (a block
// device). It looks in sysfs (/sys/class/block/DISK/*/partition, start and size, in
// 512-byte units) for the kernel's view of the partition; when the re-read of the table
// did not create it (a loop device without partition scanning, a kernel that keeps the
// old table) or created it with other bounds, it is added with BLKPG_ADD_PARTITION (the
// ioctl partx uses). A missing /dev node is made (mknod) from sysfs's dev file.
func PartitionDevice(dev *Device, p GPTPart, wait time.Duration) (string, error) {
	if !dev.IsBlock {
		return "", fmt.Errorf("%s is not a block device: its partitions have no device", dev.Path)
	}
	disk := filepath.Base(dev.Path)
	sysDir := filepath.Join("/sys/class/block", disk)
	find := func() (node string, match bool, found bool) {
		entries, _ := os.ReadDir(sysDir)
		for _, e := range entries {
			n, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "partition"))
			if err != nil || strings.TrimSpace(string(n)) != strconv.Itoa(p.Index) {
				continue
			}
			st := readInt(filepath.Join(sysDir, e.Name(), "start"))
			sz := readInt(filepath.Join(sysDir, e.Name(), "size"))
			node = "/dev/" + e.Name()
			if _, err := os.Stat(node); err != nil {
				if err := mknodFromSysfs(node, filepath.Join(sysDir, e.Name(), "dev")); err != nil {
					return "", false, false
				}
			}
			return node, st*512 == p.Start && sz*512 == p.Size, true
		}
		return "", false, false
	}
	added := false
	deadline := time.Now().Add(wait)
	for {
		node, match, found := find()
		switch {
		case found && match:
			return node, nil
		case found && !added:
			_ = dev.blkpg(unix.BLKPG_DEL_PARTITION, p.Index, 0, 0)
			if err := dev.blkpg(unix.BLKPG_ADD_PARTITION, p.Index, p.Start, p.Size); err != nil {
				return "", fmt.Errorf("partition %d of %s: re-add with BLKPG: %v", p.Index, dev.Path, err)
			}
			added = true
		case !found && !added:
			if err := dev.blkpg(unix.BLKPG_ADD_PARTITION, p.Index, p.Start, p.Size); err != nil {
				return "", fmt.Errorf("partition %d of %s: add with BLKPG: %v", p.Index, dev.Path, err)
			}
			added = true
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("partition %d of %s: no device after %s", p.Index, dev.Path, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// stageNode builds the per-node ext4 file system with mkfs.ext4 -d from the task's node
// files, the credentials (GET /v1/agent/credentials) and a new SSH host key, writes it
// into the kiln-node partition and returns the SHA-256 of the partition as written
// (checked by an O_DIRECT read-back) and the host key's fingerprint.
func (a *Agent) stageNode(ctx context.Context, task *agentapi.Task, dev *Device, part PartInfo) (string, string, error) {
	var files []agentapi.NodeFile
	if task.NodeLayer != nil {
		files = append(files, task.NodeLayer.Files...)
	}
	var creds agentapi.Credentials
	if err := a.call(ctx, http.MethodGet, "/v1/agent/credentials", nil, &creds); err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "fetch credentials: %v", err)
	}
	for _, f := range creds.Files {
		if f.Mode == 0 {
			f.Mode = 0o600 // secrets are private unless the appliance says otherwise
		}
		files = append(files, f)
	}
	host := a.cfg.MachineID
	for _, f := range files {
		if f.Path == "/etc/hostname" {
			if h := strings.TrimSpace(string(f.Data)); h != "" {
				host = h
			}
		}
	}
	hk, err := NewHostKey("root@" + host)
	if err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "host key: %v", err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hk.Public))
	if err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "host key: %v", err)
	}
	fp := ssh.FingerprintSHA256(pub)
	files = append(files,
		agentapi.NodeFile{Path: "/etc/ssh/ssh_host_ed25519_key", Mode: 0o600, Data: []byte(hk.PrivatePEM)},
		agentapi.NodeFile{Path: "/etc/ssh/ssh_host_ed25519_key.pub", Mode: 0o644, Data: []byte(hk.Public + "\n")})

	tmp, err := os.MkdirTemp(a.cfg.TempDir, "kiln-node-")
	if err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "%v", err)
	}
	defer os.RemoveAll(tmp) // the private key does not outlive the step in RAM
	tree := filepath.Join(tmp, "root")
	if err := WriteNodeTree(tree, files); err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "%v", err)
	}
	img := filepath.Join(tmp, "node.ext4")
	if err := MakeExt4(ctx, a.lookPath, img, part.Size, tree); err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "%v", err)
	}
	sum, err := copyToDevice(dev, img, part.Start, part.Size)
	if err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonWriteFailed, "write %s: %v", agentapi.PartNode, err)
	}
	if err := dev.Sync(); err != nil {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonWriteFailed, "sync: %v", err)
	}
	got, _, err := a.readBack(ctx, agentapi.StepStage, task.Heartbeat, dev, part.Start, part.Size, nil)
	if err != nil || got != sum {
		return "", "", fail(agentapi.StepStage, agentapi.ReasonVerifyMismatch, "%s reads back sha256 %s (err %v), wrote %s", agentapi.PartNode, got, err, sum)
	}
	return sum, fp, nil
}

// WriteNodeTree lays files out below dir: directories 0755, each file with its Mode
// (0644 when 0). Paths must be absolute and clean, without "..", and unique.
func WriteNodeTree(dir string, files []agentapi.NodeFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range files {
		p := f.Path
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.Contains(p, "/../") || strings.ContainsRune(p, 0) {
			return fmt.Errorf("%w: node file path %q is not absolute and clean", ErrBadTask, p)
		}
		if seen[p] {
			return fmt.Errorf("%w: node file %q given twice", ErrBadTask, p)
		}
		seen[p] = true
		mode := os.FileMode(f.Mode)
		if mode == 0 {
			mode = 0o644
		}
		if mode&^0o777 != 0 {
			return fmt.Errorf("%w: node file %q mode %o", ErrBadTask, p, f.Mode)
		}
		full := filepath.Join(dir, filepath.FromSlash(p[1:]))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, f.Data, mode); err != nil {
			return err
		}
		if err := os.Chmod(full, mode); err != nil { // umask
			return err
		}
	}
	return nil
}

// MakeExt4 makes an ext4 image file of size bytes labelled kiln-node holding the tree
// (mkfs.ext4 -d; owners as in the tree, the root directory root:root).
func MakeExt4(ctx context.Context, lookPath func(string) (string, error), img string, size int64, tree string) error {
	mk, err := lookPath(toolMkfsExt4)
	if err != nil {
		return fmt.Errorf("%s: %w", toolMkfsExt4, err)
	}
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	cmd := exec.CommandContext(ctx, mk, "-q", "-F", "-L", agentapi.PartNode, "-d", tree,
		"-E", "root_owner=0:0,nodiscard,lazy_itable_init=0,lazy_journal_init=0", "-b", "4096", img)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyToDevice copies size bytes of file src to dev at off, returning their SHA-256 hex.
func copyToDevice(dev *Device, src string, off, size int64) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, writeBufSize)
	var done int64
	for done < size {
		n, err := io.ReadFull(f, buf[:min(int64(len(buf)), size-done)])
		if n > 0 {
			h.Write(buf[:n])
			if _, werr := dev.WriteAt(buf[:n], off+done); werr != nil {
				return "", werr
			}
			done += int64(n)
		}
		if err != nil {
			if done == size {
				break
			}
			return "", fmt.Errorf("read %s: %d of %d bytes: %v", src, done, size, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
