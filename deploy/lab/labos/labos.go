// Package labos builds Kiln's lab OS release, reproducibly, from Debian
// packages: a GPT base disk image that boots under BIOS (syslinux through
// gptmbr.bin) and UEFI (systemd-boot as EFI/BOOT/BOOTX64.EFI) into Debian's
// kernel, an initramfs that opens the read-only root partition kiln-root
// through dm-verity, and a busybox root whose /sbin/init runs the first-boot
// reporter (cmd/kiln-firstboot). It also builds the small extra layers
// (control-plane, gpu, secure-runtime: squashfs images with a marker file and
// their own verity tree) and writes the release manifest (release.json).
// The disk layout and the build are described in DESIGN.md beside this file.
//
// Same inputs (kernel .deb, the host's busybox, veritysetup and syslinux
// packages, the Go toolchain and the repository's source) give the same bytes.
package labos

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// Fixed identifiers: the same inputs give the same bytes. 4b494c4e is "KILN".
const (
	DiskGUID     = "4B494C4E-4C41-4253-8000-000000000000"
	ESPGUID      = "4B494C4E-4C41-4253-8000-000000000001"
	RootGUID     = "4B494C4E-4C41-4253-8000-000000000002"
	ESPVolumeID  = "4b494c4e"
	VeritySalt   = "4b494c4e4c41425300000000000000000000000000000000000000000000c0de"
	VerityUUID   = "4b494c4e-4c41-4253-8000-00000000ea17"
	ESPPartName  = "kiln-esp"
	RootPartName = "kiln-root"
	// KubeadmVersion is what the lab release declares by default (the
	// cluster block's kubernetesVersion must match it).
	KubeadmVersion = "v1.31.2"
	// SourceDateEpoch is every timestamp the build writes (2023-11-14).
	SourceDateEpoch = 1700000000
)

// Layer selection rules (Layer.When).
const (
	WhenAlways       = "always"
	WhenControlPlane = "role:control-plane"
	WhenNVIDIAGPU    = "pci:10de/03"
	WhenVirtCPU      = "cpu:vmx|svm"
)

// Modules are the kernel modules the lab OS's initramfs loads (with their
// dependencies, in load order): disks, NICs, dm-verity, squashfs (the root)
// and ext4 (the node layer) with crc32c_generic, its soft dependency
// (modinfo's "softdep: pre: crypto-crc32c", which depends does not list).
var Modules = []string{"virtio_pci", "virtio_blk", "virtio_scsi", "virtio_net", "sd_mod", "ahci", "nvme",
	"e1000", "e1000e", "af_packet", "dm_mod", "dm_verity", "squashfs", "crc32c_generic", "ext4"}

// Options of Build. Only Dir is required.
type Options struct {
	Dir string // output directory (created); the build's scratch files go under Dir/work and are removed
	// KernelTree is Debian's kernel package unpacked (dpkg -x): boot/vmlinuz-*,
	// lib/modules/*. Empty: deploy/env/build.sh resolves, fetches and caches
	// it (KILN_ENV_KERNEL_ONLY=1; the cache is $KILN_ENV_CACHE or build/cache).
	KernelTree     string
	Busybox        string // static busybox; default /bin/busybox (busybox-static)
	Go             string // go command; default "go"
	RepoRoot       string // default: the repository this package is in
	KubeadmVersion string // default KubeadmVersion
	// Cmdline is added to the kernel command line (after console= and the
	// verity arguments), e.g. "loglevel=7".
	Cmdline string
}

// Manifest is release.json. Layer URLs are file names relative to the
// manifest; Kiln serves each layer and rewrites URL when it imports the
// release.
type Manifest struct {
	Name           string  `json:"name"`    // "kiln-lab-os"
	Release        string  `json:"release"` // "kiln-lab-os-" + the first 12 hex of the SHA-256 over the layers' digests
	KubeadmVersion string  `json:"kubeadm_version"`
	Kernel         string  `json:"kernel"` // the kernel release, e.g. "6.1.0-57-amd64"
	Layers         []Layer `json:"layers"` // base first
}

// Layer is one layer of a release. The base layer (Name "base", When
// "always", PartName "") is a whole GPT disk image written from sector 0;
// every other layer is a filesystem image the agent writes into its own
// appended GPT partition PartName. VerityRootHash and VerityHashOffset are
// the dm-verity root hash and the byte offset of the hash tree (superblock
// first) inside the verity-protected partition: for the base layer that is
// the partition named VerityPartName (kiln-root) inside the image, for the
// others the layer's own partition, so
//
//	veritysetup verify PART PART VerityRootHash --hash-offset=VerityHashOffset
//
// checks either (the tree's superblock holds the data size, salt and UUID).
type Layer struct {
	Name             string `json:"name"`
	URL              string `json:"url"`
	SHA256           string `json:"sha256"`
	Size             int64  `json:"size_bytes"`
	When             string `json:"when"`
	PartName         string `json:"part_name,omitempty"`
	VerityRootHash   string `json:"verity_root_hash"`
	VerityHashOffset int64  `json:"verity_hash_offset"`
	VerityPartName   string `json:"verity_part_name,omitempty"` // base only: "kiln-root"
}

// Release is a built release: the manifest and where its files are.
type Release struct {
	Dir          string
	ManifestPath string // Dir/release.json
	Manifest     Manifest
	Paths        map[string]string // layer name → file
	// Base image details (for tests and the e2e's disk checks).
	Base BaseInfo
}

// BaseInfo describes the base image's partitions (byte offsets and sizes).
type BaseInfo struct {
	ESPStart, ESPSize   int64
	RootStart, RootSize int64 // the kiln-root partition: squashfs, padded to 4 KiB, then the verity tree
	Cmdline             string
}

// Layer returns the manifest's layer name (nil if absent).
func (r *Release) Layer(name string) *Layer {
	for i := range r.Manifest.Layers {
		if r.Manifest.Layers[i].Name == name {
			return &r.Manifest.Layers[i]
		}
	}
	return nil
}

// Tools are the host commands Build runs (besides go and deploy/env/build.sh's).
var Tools = []string{"mksquashfs", "veritysetup", "mkfs.vfat", "mmd", "mcopy", "syslinux", "sgdisk", "/sbin/modinfo", "ldd"}

// Host files Build reads, with their Debian packages.
var HostFiles = map[string]string{
	"/usr/lib/syslinux/mbr/gptmbr.bin":              "syslinux-common",
	"/usr/lib/systemd/boot/efi/systemd-bootx64.efi": "systemd-boot-efi",
	"/usr/lib/syslinux/modules/bios/ldlinux.c32":    "syslinux-common",
	"/bin/busybox":          "busybox-static",
	"/usr/sbin/veritysetup": "cryptsetup-bin",
}

// extra are the extra layers: name, selection rule.
var extra = []struct{ name, when string }{
	{"control-plane", WhenControlPlane},
	{"gpu", WhenNVIDIAGPU},
	{"secure-runtime", WhenVirtCPU},
}

// Build builds the release into o.Dir: base.img, layer-NAME.img for each
// extra layer and release.json.
func Build(o Options) (*Release, error) {
	if o.Dir == "" {
		return nil, errors.New("labos: Options.Dir is required")
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.RepoRoot == "" {
		o.RepoRoot = repoRoot()
	}
	if o.KubeadmVersion == "" {
		o.KubeadmVersion = KubeadmVersion
	}
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			return nil, fmt.Errorf("labos: %s missing (deploy/scripts/install-deps.sh): %w", t, err)
		}
	}
	for f, pkg := range HostFiles {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("labos: %s missing (package %s): %w", f, pkg, err)
		}
	}
	if o.KernelTree == "" {
		t, err := kernelTree(o.RepoRoot)
		if err != nil {
			return nil, err
		}
		o.KernelTree = t
	}
	work := filepath.Join(o.Dir, "work")
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	b := &builder{o: o, work: work}
	rel := &Release{Dir: o.Dir, ManifestPath: filepath.Join(o.Dir, "release.json"), Paths: map[string]string{}}
	base, info, err := b.base()
	if err != nil {
		return nil, err
	}
	rel.Base = info
	rel.Manifest = Manifest{Name: "kiln-lab-os", KubeadmVersion: o.KubeadmVersion, Kernel: b.kver}
	rel.Manifest.Layers = append(rel.Manifest.Layers, base)
	rel.Paths[base.Name] = filepath.Join(o.Dir, base.URL)
	for _, e := range extra {
		l, err := b.extraLayer(e.name, e.when)
		if err != nil {
			return nil, err
		}
		rel.Manifest.Layers = append(rel.Manifest.Layers, l)
		rel.Paths[l.Name] = filepath.Join(o.Dir, l.URL)
	}
	h := sha256.New()
	for _, l := range rel.Manifest.Layers {
		fmt.Fprintf(h, "%s %s\n", l.Name, l.SHA256)
	}
	rel.Manifest.Release = "kiln-lab-os-" + hex.EncodeToString(h.Sum(nil))[:12]
	js, err := json.MarshalIndent(rel.Manifest, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(rel.ManifestPath, append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	return rel, nil
}

// ReadManifest reads a release.json.
func ReadManifest(path string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

type builder struct {
	o    Options
	work string
	kver string
}

// kernelTree asks deploy/env/build.sh for the unpacked kernel package.
func kernelTree(root string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "deploy/env/build.sh"))
	cmd.Env = append(os.Environ(), "KILN_ENV_KERNEL_ONLY=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("labos: deploy/env/build.sh (kernel only): %v: %s", err, stderr.String())
	}
	t := strings.TrimSpace(string(out))
	if lines := strings.Split(t, "\n"); len(lines) > 0 {
		t = lines[len(lines)-1]
	}
	return t, nil
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "../../.."))
}

// run runs a command with the build's fixed time and returns its combined output.
func run(dir string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", SourceDateEpoch), "LC_ALL=C", "TZ=UTC")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("labos: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// hashFile returns the hex SHA-256 and size of path.
func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// sortedKeys returns m's keys sorted.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
