package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

// Host tests of the layered build (issue 15) on real loop devices (partition scanning on,
// as a disk's partitions appear in the environment), a real HTTP server serving the
// layers, and real veritysetup and mkfs.ext4. Everything is checked from the host:
// every layer's digest re-read from the backing file, the kiln-node partition's hash,
// the files and their modes inside kiln-node (debugfs), and a failed build leaving no
// partition table.

var layeredTools = []string{"losetup", "sfdisk", "sgdisk", "mkfs.ext4", "debugfs", "e2fsck", "veritysetup"}

// baseImage is a lab-OS-like base layer: GPT; p1 kiln-esp (empty), p2 kiln-root (ext4
// with a marker, the dm-verity data), p3 kiln-root-verity (its hash tree, veritysetup
// format). With appended, the tree follows the data inside kiln-root (VerityHashOffset)
// and there is no p3.
type baseImage struct {
	img        []byte
	rootHash   string
	hashOffset uint64
}

func buildBase(t *testing.T, appended bool) baseImage {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "root")
	os.MkdirAll(filepath.Join(tree, "etc"), 0o755)
	os.WriteFile(filepath.Join(tree, "etc/os-release"), []byte("NAME=kiln-lab\n"), 0o644)
	data := filepath.Join(dir, "data.img")
	c := exec.Command("mkfs.ext4", "-q", "-F", "-U", "6b1f3a52-9d0c-4c1e-8e61-0d4b3f0a7c12", "-E", "root_owner=0:0", "-b", "4096", "-d", tree, data, "8M")
	c.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	hashFile := filepath.Join(dir, "hash.img")
	args := []string{"format", "--salt=00112233", "--uuid=6b1f3a52-9d0c-4c1e-8e61-0d4b3f0a7c13", data, hashFile}
	var off uint64
	if appended {
		off = 8 << 20
		args = []string{"format", "--salt=00112233", "--uuid=6b1f3a52-9d0c-4c1e-8e61-0d4b3f0a7c13", "--data-blocks=2048", "--hash-offset=" + strconv.FormatUint(off, 10), data, data}
	}
	out := run(t, "veritysetup", args...)
	m := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("veritysetup format: %s", out)
	}
	dataB, _ := os.ReadFile(data)
	// Layout (MiB): 1 ESP 1..3, kiln-root 3..(3+12), verity after; image ends 1 MiB after.
	img := filepath.Join(dir, "base.raw")
	os.WriteFile(img, nil, 0o644)
	rootMiB := 12
	size := int64(3+rootMiB+2+1) << 20
	os.Truncate(img, size)
	spec := "label: gpt\nstart=2048, size=4096, type=U, name=kiln-esp\nstart=6144, size=" + strconv.Itoa(rootMiB*2048) + ", type=L, name=kiln-root\n"
	if !appended {
		spec += "start=" + strconv.Itoa((3+rootMiB)*2048) + ", size=4096, type=L, name=kiln-root-verity\n"
	}
	cmd := exec.Command("sfdisk", "--quiet", img)
	cmd.Stdin = strings.NewReader(spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(img)
	copy(b[3<<20:], dataB)
	if !appended {
		h, _ := os.ReadFile(hashFile)
		copy(b[(3+rootMiB)<<20:], h)
	}
	return baseImage{img: b, rootHash: m[1], hashOffset: off}
}

// ext4Layer is a small file-system layer holding /LAYER = name.
func ext4Layer(t *testing.T, name string, sizeKiB int) []byte {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "LAYER"), []byte(name), 0o644)
	img := filepath.Join(t.TempDir(), name+".ext4")
	c := exec.Command("mkfs.ext4", "-q", "-F", "-E", "root_owner=0:0", "-b", "1024", "-d", dir, img, strconv.Itoa(sizeKiB)+"K")
	c.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(img)
	return b
}

type layeredCase struct {
	fa     *fakeAppliance
	task   agentapi.Task
	base   baseImage
	layers map[string][]byte // by layer name, base included
}

func layeredTask(t *testing.T, appended bool) layeredCase {
	t.Helper()
	lc := layeredCase{fa: newFakeAppliance(t), base: buildBase(t, appended), layers: map[string][]byte{}}
	lc.layers["base"] = lc.base.img
	lc.layers["gpu"] = ext4Layer(t, "gpu", 3000) // not a MiB multiple: the partition tail is zeroed
	cp := make([]byte, 1536<<10)
	rand.Read(cp)
	lc.layers["control-plane"] = cp
	var layers []agentapi.Layer
	for _, n := range []string{"base", "gpu", "control-plane"} {
		lc.fa.images[n] = lc.layers[n]
		l := agentapi.Layer{Name: n, URL: lc.fa.imageURL(n), SHA256: sha(lc.layers[n]), Size: uint64(len(lc.layers[n])), Format: "raw"}
		switch n {
		case "base":
			l.When, l.Reason, l.VerityRootHash, l.VerityHashOffset = agentapi.WhenAlways, "always", lc.base.rootHash, lc.base.hashOffset
		case "gpu":
			l.When, l.Reason, l.PartName = "pci:10de/03", "PCI 0000:3b:00.0 10de:1eb8 class 030200", "kiln-layer-gpu"
		default:
			l.When, l.Reason = "role:control-plane", "claim role control-plane" // PartName derived
		}
		layers = append(layers, l)
	}
	nodeJSON, _ := json.Marshal(map[string]any{"role": "control-plane", "labels": map[string]string{"rack": "r12"}})
	lc.task = agentapi.Task{
		Action: agentapi.ActionProvision, Heartbeat: 50 * time.Millisecond, PollAfter: 10 * time.Millisecond,
		Disk: agentapi.DiskRule{Serial: loopSerial}, Reboot: true, Layers: layers,
		NodeLayer: &agentapi.NodeLayer{Files: []agentapi.NodeFile{
			{Path: "/etc/hostname", Data: []byte("node-07\n")},
			{Path: "/etc/kiln/machine-id", Data: []byte("m-1\n")},
			{Path: "/etc/kiln/node.json", Mode: 0o644, Data: nodeJSON},
		}},
		Cluster: &agentapi.ClusterCheck{KubernetesVersion: "v1.31.2", ImageKubeadmVersion: "v1.31.2"},
	}
	lc.fa.credentials = &agentapi.Credentials{Files: []agentapi.NodeFile{
		{Path: "/etc/kubernetes/kubeadm-join.yaml", Data: []byte("apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n# token abcdef.0123456789abcdef\n")},
		{Path: "/etc/kubernetes/pki/ca.crt", Mode: 0o644, Data: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")},
		{Path: "/etc/kiln/firstboot.json", Mode: 0o600, Data: []byte(`{"urls":["http://10.0.2.2:1"],"machine_id":"m-1","token":"fb-secret"}`)},
	}}
	lc.fa.tasks = []agentapi.Task{lc.task}
	return lc
}

// newLoopP is newLoop with partition scanning (losetup -P): the kernel creates
// loopNpM for the table the agent writes, as it does for a real disk.
func newLoopP(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	dev = strings.TrimSpace(run(t, "losetup", "-f", "-P", "--show", file))
	t.Cleanup(func() { detachLoop(dev, file) })
	return dev, file
}

func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs %s: %v\n%s", req, err, out)
	}
	return string(out)
}

// statMode returns the mode (type bits included) and uid debugfs reports for path in img.
func statMode(t *testing.T, img, path string) (mode, uid int) {
	t.Helper()
	out := debugfs(t, img, "stat "+path)
	m := regexp.MustCompile(`Mode:\s+0?([0-7]+)`).FindStringSubmatch(out)
	typ := regexp.MustCompile(`Type:\s+(\w+)`).FindStringSubmatch(out)
	u := regexp.MustCompile(`User:\s+(\d+)`).FindStringSubmatch(out)
	if m == nil || u == nil {
		t.Fatalf("debugfs stat %s: %s", path, out)
	}
	mo, _ := strconv.ParseInt(m[1], 8, 32)
	uid, _ = strconv.Atoi(u[1])
	switch typ[1] {
	case "regular":
		mo |= 0o100000
	case "directory":
		mo |= 0o40000
	}
	return int(mo), uid
}

// checkNoPartitionTable: the disk the failed build left has no MBR signature and no GPT
// header at either end (sfdisk finds no table).
func checkNoPartitionTable(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:1<<20], make([]byte, 1<<20)) || !bytes.Equal(b[len(b)-1<<20:], make([]byte, 1<<20)) {
		t.Error("first or last MiB not zero after a failed build")
	}
	if what, _ := Foreign(bytes.NewReader(b), 512); what != "" {
		t.Errorf("disk still shows %s", what)
	}
	if out, err := exec.Command("sfdisk", "-d", file).CombinedOutput(); err == nil {
		t.Errorf("sfdisk still reads a table:\n%s", out)
	}
}

func TestLayeredBuild(t *testing.T) {
	testreq.Root(t, "loop devices", layeredTools...)
	for _, appended := range []bool{false, true} {
		t.Run(fmt.Sprintf("verity-appended=%v", appended), func(t *testing.T) {
			lc := layeredTask(t, appended)
			dev, file := newLoopP(t, 96<<20)
			if !runAgent(t, lc.fa, dev, loopSerial) {
				t.Fatal("agent powered off instead of rebooting")
			}
			fin, ok := lc.fa.final(agentapi.StepFinalize)
			if !ok || fin.State != agentapi.StateSucceeded || fin.Build == nil {
				t.Fatalf("finalize: %+v\nreports %+v", fin, lc.fa.Reports())
			}
			if v, _ := lc.fa.final(agentapi.StepVerify); !strings.Contains(v.Message, "veritysetup verify of kiln-root passed") {
				t.Errorf("verify: %+v", v)
			}
			disk, _ := os.ReadFile(file)
			br := fin.Build
			if len(br.Layers) != 3 {
				t.Fatalf("build report layers: %+v", br.Layers)
			}
			// Every layer's digest, re-read from the host (the base with the blocks the
			// partition append changed restored, as reported).
			ss, _ := strconv.Atoi(fin.Written["sector_size"])
			for _, l := range br.Layers {
				want := lc.layers[l.Name]
				got := bytes.Clone(disk[l.Start : l.Start+l.Size])
				if l.Name == "base" {
					for _, f := range strings.Split(fin.Written["stage_changed_sectors"], ",") {
						lba, _ := strconv.Atoi(f)
						copy(got[lba*ss:(lba+1)*ss], want[lba*ss:(lba+1)*ss])
					}
				}
				if l.SHA256 != sha(want) || sha(got) != sha(want) || l.Size != uint64(len(want)) {
					t.Errorf("layer %s: reported %s, host reads %s, want %s", l.Name, l.SHA256, sha(got), sha(want))
				}
			}
			// The table: valid, the image's partitions then one per layer and kiln-node.
			if out := run(t, "sgdisk", "-v", file); !strings.Contains(out, "No problems found") {
				t.Errorf("sgdisk -v:\n%s", out)
			}
			tab := readTable(t, file)
			var names []string
			for _, p := range tab.PartitionTable.Partitions {
				names = append(names, p.Name)
			}
			wantNames := "kiln-esp,kiln-root,kiln-root-verity,kiln-layer-gpu,kiln-layer-control-plane,kiln-node"
			if appended {
				wantNames = strings.Replace(wantNames, "kiln-root-verity,", "", 1)
			}
			if strings.Join(names, ",") != wantNames {
				t.Errorf("partitions %v, want %s", names, wantNames)
			}
			for _, p := range tab.PartitionTable.Partitions {
				for _, l := range br.Layers {
					if p.Name == "kiln-layer-"+l.Name && uint64(p.Start*512) != l.Start {
						t.Errorf("%s starts at %d, reported %d", p.Name, p.Start*512, l.Start)
					}
				}
			}
			// The gpu layer's partition is a file system holding its marker.
			gpu := filepath.Join(t.TempDir(), "gpu.img")
			for _, l := range br.Layers {
				if l.Name == "gpu" {
					os.WriteFile(gpu, disk[l.Start:l.Start+alignUpU(l.Size, 1<<20)], 0o644)
				}
			}
			if out := debugfs(t, gpu, "cat /LAYER"); !strings.Contains(out, "gpu") {
				t.Errorf("gpu layer: %q", out)
			}
			// kiln-node: the hash as recorded, a clean ext4 labelled kiln-node, the files
			// with their modes, root-owned, the fingerprint that of the .pub in it.
			off, _ := strconv.ParseInt(fin.Written["node_offset_bytes"], 10, 64)
			size, _ := strconv.ParseInt(fin.Written["node_size_bytes"], 10, 64)
			node := disk[off : off+size]
			if sha(node) != br.NodeLayerSHA256 {
				t.Errorf("kiln-node hashes %s on the host, reported %s", sha(node), br.NodeLayerSHA256)
			}
			np := filepath.Join(t.TempDir(), "node.img")
			os.WriteFile(np, node, 0o644)
			run(t, "e2fsck", "-fn", np)
			if out := run(t, "dumpe2fs", "-h", np); !strings.Contains(out, "Filesystem volume name:   kiln-node") {
				t.Errorf("dumpe2fs: %s", out)
			}
			for path, want := range map[string]int{
				"/etc/hostname": 0o100644, "/etc/kiln/machine-id": 0o100644, "/etc/kiln/node.json": 0o100644,
				"/etc/ssh/ssh_host_ed25519_key": 0o100600, "/etc/ssh/ssh_host_ed25519_key.pub": 0o100644,
				"/etc/kubernetes/kubeadm-join.yaml": 0o100600, "/etc/kubernetes/pki/ca.crt": 0o100644,
				"/etc/kiln/firstboot.json": 0o100600, "/etc": 0o40755, "/etc/ssh": 0o40755,
			} {
				if mode, uid := statMode(t, np, path); mode != want || uid != 0 {
					t.Errorf("%s: mode %o uid %d, want %o uid 0", path, mode, uid, want)
				}
			}
			if out := debugfs(t, np, "cat /etc/hostname"); !strings.Contains(out, "node-07") {
				t.Errorf("hostname: %q", out)
			}
			if out := debugfs(t, np, "cat /etc/kiln/firstboot.json"); !strings.Contains(out, "fb-secret") {
				t.Errorf("firstboot.json: %q", out)
			}
			pubLine := debugfs(t, np, "cat /etc/ssh/ssh_host_ed25519_key.pub")
			pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(pubLine[strings.Index(pubLine, "ssh-ed25519"):]))
			if err != nil || ssh.FingerprintSHA256(pub) != br.SSHHostKeyFingerprint || !strings.HasPrefix(br.SSHHostKeyFingerprint, "SHA256:") {
				t.Errorf("fingerprint: reported %s, .pub %v (%v)", br.SSHHostKeyFingerprint, pub, err)
			}
			// The private key matches the public one.
			priv := debugfs(t, np, "cat /etc/ssh/ssh_host_ed25519_key")
			signer, err := ssh.ParsePrivateKey([]byte(priv[strings.Index(priv, "-----BEGIN"):]))
			if err != nil || ssh.FingerprintSHA256(signer.PublicKey()) != br.SSHHostKeyFingerprint {
				t.Errorf("private key: %v", err)
			}
			// No secret appears in any report.
			for _, r := range lc.fa.Reports() {
				b, _ := json.Marshal(r)
				if bytes.Contains(b, []byte("fb-secret")) || bytes.Contains(b, []byte("PRIVATE KEY")) || bytes.Contains(b, []byte("0123456789abcdef")) {
					t.Errorf("a report carries a secret: %s", b)
				}
			}
		})
	}
}

func alignUpU(v, a uint64) uint64 { return (v + a - 1) / a * a }

// TestLayeredCorruptLayer: the gpu layer is served with a byte flipped on every fetch:
// one rewrite, then digest_mismatch in verify, and the disk has no partition table.
func TestLayeredCorruptLayer(t *testing.T) {
	testreq.Root(t, "loop devices", layeredTools...)
	lc := layeredTask(t, false)
	bad := bytes.Clone(lc.layers["gpu"])
	bad[len(bad)/3] ^= 0x40
	lc.fa.images["gpu"] = bad
	dev, file := newLoopP(t, 96<<20)
	runAgent(t, lc.fa, dev, loopSerial)
	r, ok := lc.fa.final(agentapi.StepVerify)
	if !ok || r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonDigestMismatch || !strings.Contains(r.Message, "partition table cleared") {
		t.Fatalf("verify: %+v", r)
	}
	if lc.fa.gets["gpu"] != 2 || lc.fa.gets["base"] != 2 {
		t.Errorf("fetches %v, want each layer twice (one rewrite)", lc.fa.gets)
	}
	if _, ok := lc.fa.final(agentapi.StepStage); ok {
		t.Error("stage ran after a failed verify")
	}
	checkNoPartitionTable(t, file)
}

// TestLayeredVerityMismatch: the manifest's root hash does not match the base's kiln-root:
// verity_mismatch in verify (no rewrite: the bytes read back are the digest's), and the
// disk is left without a partition table.
func TestLayeredVerityMismatch(t *testing.T) {
	testreq.Root(t, "loop devices", layeredTools...)
	lc := layeredTask(t, false)
	lc.fa.tasks[0].Layers[0].VerityRootHash = strings.Repeat("ab", 32)
	dev, file := newLoopP(t, 96<<20)
	runAgent(t, lc.fa, dev, loopSerial)
	r, ok := lc.fa.final(agentapi.StepVerify)
	if !ok || r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonVerityMismatch {
		t.Fatalf("verify: %+v", r)
	}
	checkNoPartitionTable(t, file)
}

// TestLayeredCheckFailsBeforeWriting: version_mismatch, a missing tool and a disk too
// small all fail in check; no layer is fetched and the disk is untouched.
func TestLayeredCheckFailsBeforeWriting(t *testing.T) {
	testreq.Root(t, "loop devices", layeredTools...)
	for _, tc := range []struct {
		name   string
		adjust func(*agentapi.Task)
		cfg    func(*Config)
		disk   int64
		reason agentapi.Reason
	}{
		{"version", func(task *agentapi.Task) { task.Cluster.KubernetesVersion = "v1.30.5" }, nil, 96 << 20, agentapi.ReasonVersionMismatch},
		{"tool", nil, func(c *Config) {
			c.LookPath = func(s string) (string, error) {
				if s == "veritysetup" {
					return "", exec.ErrNotFound
				}
				return exec.LookPath(s)
			}
		}, 96 << 20, agentapi.ReasonToolMissing},
		{"small", nil, nil, 40 << 20, agentapi.ReasonDiskTooSmall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := layeredTask(t, false)
			if tc.adjust != nil {
				tc.adjust(&lc.fa.tasks[0])
			}
			dev, file := newLoopP(t, tc.disk)
			runAgentCfg(t, lc.fa, dev, loopSerial, tc.cfg)
			r, ok := lc.fa.final(agentapi.StepCheck)
			if !ok || r.State != agentapi.StateFailed || r.Reason != tc.reason {
				t.Fatalf("check: %+v", r)
			}
			if _, ok := lc.fa.final(agentapi.StepWrite); ok || len(lc.fa.gets) != 0 {
				t.Errorf("write ran or layers fetched (%v)", lc.fa.gets)
			}
			b, _ := os.ReadFile(file)
			if !bytes.Equal(b, make([]byte, len(b))) {
				t.Error("the disk was written")
			}
		})
	}
}

// TestLayeredCredentialsRefused: the appliance refuses the credentials (the attestation
// gate): stage fails and the disk is left with no partition table.
func TestLayeredCredentialsRefused(t *testing.T) {
	testreq.Root(t, "loop devices", layeredTools...)
	lc := layeredTask(t, false)
	lc.fa.credentials = nil
	dev, file := newLoopP(t, 96<<20)
	runAgent(t, lc.fa, dev, loopSerial)
	r, ok := lc.fa.final(agentapi.StepStage)
	if !ok || r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonStageFailed || !strings.Contains(r.Message, "403") {
		t.Fatalf("stage: %+v", r)
	}
	checkNoPartitionTable(t, file)
}

// TestClearPartitionTable on a plain file holding a GPT image grown to a bigger disk by
// the partition append (so both the disk-end backup and the image's own stale backup
// exist): afterwards neither sgdisk nor sfdisk finds a table.
func TestClearPartitionTable(t *testing.T) {
	testreq.Commands(t, "sfdisk", "sgdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "clear")
	file := filepath.Join(t.TempDir(), "disk.img")
	os.WriteFile(file, img, 0o644)
	os.Truncate(file, 32<<20)
	dev, err := OpenDevice(file)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, _, err := AppendGPTPartitions(dev, dev.Size, 512, int64(len(img)), []PartSpec{{Name: "kiln-node", Size: 4 << 20}}); err != nil {
		t.Fatal(err)
	}
	if out := run(t, "sgdisk", "-v", file); !strings.Contains(out, "No problems found") {
		t.Fatalf("before: %s", out)
	}
	if err := ClearPartitionTable(dev, int64(len(img))); err != nil {
		t.Fatal(err)
	}
	checkNoPartitionTable(t, file)
	b, _ := os.ReadFile(file)
	if bytes.Contains(b, []byte("EFI PART")) {
		t.Errorf("a GPT header signature is left at %d", bytes.Index(b, []byte("EFI PART")))
	}
}

func TestCheckClusterVersion(t *testing.T) {
	for _, c := range []struct {
		k, img string
		ok     bool
	}{{"v1.31.2", "v1.31.2", true}, {"1.31.2", "v1.31.2", true}, {"v1.31.2", "v1.31.3", false}, {"", "v1.31.2", false}, {"v1.31.2", "", false}} {
		err := CheckClusterVersion(&agentapi.ClusterCheck{KubernetesVersion: c.k, ImageKubeadmVersion: c.img})
		if (err == nil) != c.ok {
			t.Errorf("%q vs %q: %v", c.k, c.img, err)
		}
		if err != nil && err.(*StepError).Reason != agentapi.ReasonVersionMismatch {
			t.Errorf("reason %v", err)
		}
	}
	if CheckClusterVersion(nil) != nil {
		t.Error("nil check")
	}
}

func TestWriteNodeTreeRejects(t *testing.T) {
	for _, p := range []string{"etc/x", "/etc/../x", "/", "/etc//x", "/etc/x/"} {
		if err := WriteNodeTree(t.TempDir(), []agentapi.NodeFile{{Path: p}}); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
	if err := WriteNodeTree(t.TempDir(), []agentapi.NodeFile{{Path: "/a"}, {Path: "/a"}}); err == nil {
		t.Error("duplicate accepted")
	}
	if err := WriteNodeTree(t.TempDir(), []agentapi.NodeFile{{Path: "/a", Mode: 0o4755}}); err == nil {
		t.Error("setuid accepted")
	}
}
