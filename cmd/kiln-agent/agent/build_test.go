package agent

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

const loopSerial = "LOOPTEST01"

func stageData() *agentapi.StageData {
	return &agentapi.StageData{
		Hostname: "node-07", InstanceID: "i-0007",
		UserData:      "#cloud-config\nruncmd:\n  - echo hello\n",
		NetworkConfig: "version: 2\nethernets:\n  eth0:\n    dhcp4: true\n",
		SSHKeys:       []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB5tOrGkYbGmkVAz1Y9Hpg0Nqn0kFHJ3Q2Lx2ZcH1aEE ops@site"},
		CABundle:      "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
		JoinData:      "apiVersion: kubeadm.k8s.io/v1beta3\nkind: JoinConfiguration\n",
		Labels:        map[string]string{"rack": "r12", "role": "worker"},
	}
}

func provisionTask(fa *fakeAppliance, name string, img []byte, format string) agentapi.Task {
	return agentapi.Task{
		Action: agentapi.ActionProvision, Heartbeat: 50 * 1e6, PollAfter: 10 * 1e6,
		Disk:  agentapi.DiskRule{Serial: loopSerial},
		Image: &agentapi.ImageRef{URL: fa.imageURL(name), SHA256: sha(img), Size: uint64(len(img)), Format: format},
		Stage: stageData(), Reboot: true,
	}
}

// checkImageRange asserts the disk's partition table is the image's plus the cidata entry
// the stage step is specified to add (checkPartitionTable: read back by sfdisk, not taken
// from the agent's report), and the disk equals img over the image range except the sectors
// the agent reported as changed by stage, and that those sectors really differ.
func checkImageRange(t *testing.T, diskFile string, img []byte, written map[string]string) {
	t.Helper()
	checkPartitionTable(t, diskFile, img)
	disk, err := os.ReadFile(diskFile)
	if err != nil {
		t.Fatal(err)
	}
	got := bytes.Clone(disk[:len(img)])
	ss, _ := strconv.Atoi(written["sector_size"])
	if ss == 0 {
		t.Fatalf("no sector_size in %v", written)
	}
	for _, f := range strings.Split(written["stage_changed_sectors"], ",") {
		if f == "" {
			continue
		}
		lba, _ := strconv.Atoi(f)
		off := lba * ss
		if bytes.Equal(got[off:off+ss], img[off:off+ss]) {
			t.Errorf("sector %d reported changed but equals the image", lba)
		}
		copy(got[off:off+ss], img[off:off+ss])
	}
	if sha(got) != sha(img) {
		t.Fatalf("disk image range differs from the image outside the reported sectors")
	}
}

// sfdiskTable is `sfdisk -J` output (util-linux): sizes and starts in sectors.
type sfdiskTable struct {
	PartitionTable struct {
		Label      string `json:"label"`
		ID         string `json:"id"`
		LastLBA    int64  `json:"lastlba"`
		SectorSize int64  `json:"sectorsize"`
		Partitions []struct {
			Start int64  `json:"start"`
			Size  int64  `json:"size"`
			Type  string `json:"type"`
			UUID  string `json:"uuid"`
			Name  string `json:"name"`
			Boot  bool   `json:"bootable"`
		} `json:"partitions"`
	} `json:"partitiontable"`
}

func readTable(t *testing.T, path string) sfdiskTable {
	t.Helper()
	var pt sfdiskTable
	if err := json.Unmarshal([]byte(run(t, "sfdisk", "-J", path)), &pt); err != nil {
		t.Fatalf("sfdisk -J %s: %v", path, err)
	}
	return pt
}

// checkPartitionTable reads the partition tables of the image and of the disk with sfdisk
// and requires the disk's to be the image's, unchanged (label, identifier, every entry's
// start, size, type, bootable flag, GPT UUID and name), plus one entry as doc.go and
// parttable.go specify the stage step: starting at the image's end rounded up to 1 MiB,
// DefaultStageSize long, type 0x0C (MBR) or Microsoft basic data named "cidata" (GPT), and,
// for GPT, the usable area grown to the disk (last usable LBA = last LBA - 33). For MBR
// the boot code in front of the table (bytes 0..445) must be the image's too.
func checkPartitionTable(t *testing.T, diskFile string, img []byte) {
	t.Helper()
	imgFile := filepath.Join(t.TempDir(), "image.raw")
	if err := os.WriteFile(imgFile, img, 0o644); err != nil {
		t.Fatal(err)
	}
	want, got := readTable(t, imgFile).PartitionTable, readTable(t, diskFile).PartitionTable
	if got.Label != want.Label || got.ID != want.ID || got.SectorSize != 512 {
		t.Fatalf("disk table %s %s (sector %d), image's %s %s", got.Label, got.ID, got.SectorSize, want.Label, want.ID)
	}
	if len(got.Partitions) != len(want.Partitions)+1 {
		t.Fatalf("disk has %d partitions, want the image's %d plus cidata", len(got.Partitions), len(want.Partitions))
	}
	for i, p := range want.Partitions {
		if got.Partitions[i] != p {
			t.Errorf("partition %d changed: %+v, image has %+v", i+1, got.Partitions[i], p)
		}
	}
	c := got.Partitions[len(want.Partitions)]
	start := alignUp(int64(len(img)), 1<<20) / 512
	wantType := map[string]string{"dos": "c", "gpt": "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"}[want.Label]
	if c.Start != start || c.Size != DefaultStageSize/512 || !strings.EqualFold(c.Type, wantType) || c.Boot {
		t.Errorf("cidata entry %+v, want start %d size %d type %s, not bootable", c, start, DefaultStageSize/512, wantType)
	}
	if want.Label == "gpt" {
		fi, err := os.Stat(diskFile)
		if err != nil {
			t.Fatal(err)
		}
		if c.Name != "cidata" || got.LastLBA != fi.Size()/512-34 {
			t.Errorf("GPT: cidata name %q, last usable LBA %d (disk of %d sectors)", c.Name, got.LastLBA, fi.Size()/512)
		}
	} else {
		disk, err := os.ReadFile(diskFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(disk[:446], img[:446]) {
			t.Error("MBR boot code (bytes 0..445) changed")
		}
	}
}

func checkCidata(t *testing.T, diskFile string, written map[string]string, wantHost string) {
	t.Helper()
	off := written["cidata_offset_bytes"]
	env := append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	mdir := exec.Command("mdir", "-i", diskFile+"@@"+off, "::")
	mdir.Env = env
	out, err := mdir.CombinedOutput()
	if err != nil {
		t.Fatalf("mdir: %v\n%s", err, out)
	}
	for _, n := range []string{"user-data", "meta-data", "network-config", "CIDATA"} {
		if !strings.Contains(string(out), n) {
			t.Errorf("mdir lacks %s:\n%s", n, out)
		}
	}
	cat := func(name string) string {
		c := exec.Command("mcopy", "-i", diskFile+"@@"+off, "::"+name, "-")
		c.Env = env
		b, err := c.Output()
		if err != nil {
			t.Fatalf("mcopy %s: %v", name, err)
		}
		return string(b)
	}
	if md := cat("meta-data"); !strings.Contains(md, `local-hostname: "`+wantHost+`"`) || !strings.Contains(md, "instance-id:") {
		t.Errorf("meta-data: %q", md)
	}
	ud := cat("user-data")
	for _, want := range []string{"#cloud-config", "ed25519_private", "BEGIN OPENSSH PRIVATE KEY", written["ssh_host_ed25519_pub"], "/etc/kiln/join.yaml"} {
		if !strings.Contains(ud, want) {
			t.Errorf("user-data lacks %q", want)
		}
	}
	// fsck.fat on the extracted volume.
	testreq.Commands(t, "fsck.fat")
	o, _ := strconv.ParseInt(off, 10, 64)
	sz, _ := strconv.ParseInt(written["cidata_size_bytes"], 10, 64)
	disk, _ := os.ReadFile(diskFile)
	vol := filepath.Join(t.TempDir(), "cidata.fat")
	if err := os.WriteFile(vol, disk[o:o+sz], 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("fsck.fat", "-n", vol).CombinedOutput(); err != nil {
		t.Errorf("fsck.fat: %v\n%s", err, b)
	}
}

func compress(t *testing.T, format string, b []byte) []byte {
	var buf bytes.Buffer
	switch format {
	case "gzip":
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
	case "zstd":
		w, _ := zstd.NewWriter(&buf)
		w.Write(b)
		w.Close()
	default:
		return b
	}
	return buf.Bytes()
}

// TestProvisionGoodWrite: the full gated build on a loop device for GPT/MBR images in each
// format; the image range and the cidata volume are checked from the host side.
func TestProvisionGoodWrite(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4", "mdir", "mcopy", "fsck.fat", "sgdisk", "debugfs")
	for _, tc := range []struct{ label, format string }{{"gpt", "raw"}, {"dos", "gzip"}, {"gpt", "zstd"}} {
		t.Run(tc.label+"-"+tc.format, func(t *testing.T) {
			img := buildImage(t, tc.label, 8, "marker-"+tc.label)
			fa := newFakeAppliance(t)
			fa.images["img"] = compress(t, tc.format, img)
			fa.tasks = []agentapi.Task{provisionTask(fa, "img", img, tc.format)}
			dev, file := newLoop(t, 64<<20, nil)
			if !runAgent(t, fa, dev, loopSerial) {
				t.Fatal("agent powered off instead of rebooting")
			}
			fin, ok := fa.final(agentapi.StepFinalize)
			if !ok || fin.State != agentapi.StateSucceeded {
				t.Fatalf("finalize: %+v (reports %+v)", fin, fa.Reports())
			}
			for _, st := range []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify, agentapi.StepStage} {
				if r, ok := fa.final(st); !ok || r.State != agentapi.StateSucceeded {
					t.Errorf("step %s: %+v", st, r)
				}
			}
			if fin.Written["sha256"] != sha(img) || fin.Written["disk"] != dev || fin.Written["bytes"] != strconv.Itoa(len(img)) {
				t.Errorf("written: %v", fin.Written)
			}
			if fa.reg == nil || fa.reg.MachineID != "m-1" || fa.reg.Inventory.CPUs < 1 {
				t.Errorf("registration: %+v", fa.reg)
			}
			checkImageRange(t, file, img, fin.Written)
			checkCidata(t, file, fin.Written, "node-07")
			// The partition table is valid and has the image's partition plus cidata.
			dump := run(t, "sfdisk", "-d", file)
			if strings.Count(dump, "start=") != 2 {
				t.Errorf("sfdisk -d:\n%s", dump)
			}
			if tc.label == "gpt" {
				if out := run(t, "sgdisk", "-v", file); !strings.Contains(out, "No problems found") {
					t.Errorf("sgdisk -v:\n%s", out)
				}
			}
			// The image's ext4 still holds the marker (debugfs reads it at the partition offset).
			part := filepath.Join(t.TempDir(), "p1")
			disk, _ := os.ReadFile(file)
			os.WriteFile(part, disk[1<<20:len(img)-(1<<20)], 0o644)
			if out := run(t, "debugfs", "-R", "cat /kiln-marker.txt", part); !strings.Contains(out, "marker-"+tc.label) {
				t.Errorf("marker: %q", out)
			}
		})
	}
}

// TestProvisionCorruptStream: a byte flipped mid-stream on every fetch → one rewrite, then
// digest_mismatch, and the disk is left without a partition table.
func TestProvisionCorruptStream(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "corrupt")
	fa := newFakeAppliance(t)
	bad := bytes.Clone(img)
	bad[len(bad)/2] ^= 0xFF
	fa.images["img"] = bad
	fa.tasks = []agentapi.Task{provisionTask(fa, "img", img, "raw")}
	dev, file := newLoop(t, 64<<20, nil)
	runAgent(t, fa, dev, loopSerial)
	r, ok := fa.final(agentapi.StepVerify)
	if !ok || r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonDigestMismatch || !strings.Contains(r.Message, "partition table cleared") {
		t.Fatalf("verify: %+v", r)
	}
	// The failed build leaves no partition table (the image's GPT was on the disk).
	checkNoPartitionTable(t, file)
	if fa.gets["img"] != 2 {
		t.Errorf("image fetched %d times, want 2 (one rewrite)", fa.gets["img"])
	}
	if _, ok := fa.final(agentapi.StepStage); ok {
		t.Error("stage ran after a failed verify")
	}
}

// TestProvisionTruncatedResumed: the first response is cut at 40%; the agent resumes with
// Range and the build succeeds.
func TestProvisionTruncatedResumed(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "resume")
	fa := newFakeAppliance(t)
	fa.images["img"] = img
	fa.imageHook = func(w http.ResponseWriter, r *http.Request, n int, data []byte) bool {
		if n != 0 {
			return false
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Header().Set("ETag", `"img-v1"`) // same validator as the full handler
		w.WriteHeader(http.StatusOK)
		w.Write(data[:len(data)*4/10])
		return true // handler returns short: net/http closes the connection
	}
	fa.tasks = []agentapi.Task{provisionTask(fa, "img", img, "raw")}
	dev, file := newLoop(t, 64<<20, nil)
	runAgent(t, fa, dev, loopSerial)
	fin, ok := fa.final(agentapi.StepFinalize)
	if !ok || fin.State != agentapi.StateSucceeded {
		t.Fatalf("finalize: %+v", fin)
	}
	if len(fa.ranges) != 1 || !strings.HasPrefix(fa.ranges[0], "bytes=") {
		t.Errorf("range requests: %v", fa.ranges)
	}
	if w, _ := fa.final(agentapi.StepWrite); !strings.Contains(w.Message, "1 resumptions") {
		t.Errorf("write message: %q", w.Message)
	}
	checkImageRange(t, file, img, fin.Written)
}

// TestProvisionDiskTooSmall: disk_too_small and not one byte of the disk changes.
func TestProvisionDiskTooSmall(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "small")
	fa := newFakeAppliance(t)
	fa.images["img"] = img
	fa.tasks = []agentapi.Task{provisionTask(fa, "img", img, "raw")}
	fill := bytes.Repeat([]byte("old-data"), 1<<17) // 1 MiB of recognisable bytes
	dev, file := newLoop(t, 8<<20, fill)
	before := fileSHA(t, file)
	runAgent(t, fa, dev, loopSerial)
	r, _ := fa.final(agentapi.StepCheck)
	if r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonDiskTooSmall {
		t.Fatalf("check: %+v", r)
	}
	if fa.gets["img"] != 0 {
		t.Error("image fetched after a failed check")
	}
	if after := fileSHA(t, file); after != before {
		t.Fatal("disk changed")
	}
}

// TestProvisionForeignOS: a disk with a partition table fails foreign_os_present (untouched)
// unless Wipe is set.
func TestProvisionForeignOS(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "foreign")
	for _, wipe := range []bool{false, true} {
		t.Run("wipe="+strconv.FormatBool(wipe), func(t *testing.T) {
			fa := newFakeAppliance(t)
			fa.images["img"] = img
			task := provisionTask(fa, "img", img, "raw")
			task.Wipe = wipe
			fa.tasks = []agentapi.Task{task}
			dev, file := newLoop(t, 64<<20, nil)
			c := exec.Command("sfdisk", "--quiet", dev)
			c.Stdin = strings.NewReader("label: dos\nstart=2048, size=20480, type=83\n")
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("sfdisk: %v %s", err, out)
			}
			before := fileSHA(t, file)
			runAgent(t, fa, dev, loopSerial)
			r, _ := fa.final(agentapi.StepCheck)
			if !wipe {
				if r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonForeignOSPresent {
					t.Fatalf("check: %+v", r)
				}
				if fileSHA(t, file) != before {
					t.Fatal("disk changed without wipe")
				}
				return
			}
			if fin, _ := fa.final(agentapi.StepFinalize); fin.State != agentapi.StateSucceeded {
				t.Fatalf("with wipe: %+v", fa.Reports())
			}
		})
	}
}

// TestRetriesAndHeartbeats: registration answered 503 twice is retried; a slow image stream
// produces running reports every Task.Heartbeat with rising progress.
func TestRetriesAndHeartbeats(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "slow")
	fa := newFakeAppliance(t)
	fa.images["img"] = img
	fa.failRegister = 2
	fa.imageHook = func(w http.ResponseWriter, r *http.Request, n int, data []byte) bool {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		for off := 0; off < len(data); off += 512 << 10 {
			w.Write(data[off:min(off+512<<10, len(data))])
			w.(http.Flusher).Flush()
			time.Sleep(40 * time.Millisecond)
		}
		return true
	}
	task := provisionTask(fa, "img", img, "raw")
	task.Heartbeat = 100 * time.Millisecond
	fa.tasks = []agentapi.Task{task}
	dev, _ := newLoop(t, 64<<20, nil)
	runAgent(t, fa, dev, loopSerial)
	if fin, _ := fa.final(agentapi.StepFinalize); fin.State != agentapi.StateSucceeded {
		t.Fatalf("finalize: %+v", fin)
	}
	var prog []float64
	for _, r := range fa.Reports() {
		if r.Step == agentapi.StepWrite && r.State == agentapi.StateRunning {
			prog = append(prog, r.Progress)
		}
	}
	if len(prog) < 3 {
		t.Fatalf("write heartbeats: %v", prog)
	}
	for i := 1; i < len(prog); i++ {
		if prog[i] < prog[i-1] || prog[i] > 1 {
			t.Errorf("progress not monotonic in [0,1]: %v", prog)
		}
	}
}

// TestProvisionStalledStreamResumed: the first response stops sending (connection kept
// open); the stall watchdog drops it and the agent resumes with Range.
func TestProvisionStalledStreamResumed(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "stall")
	fa := newFakeAppliance(t)
	fa.images["img"] = img
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	fa.imageHook = func(w http.ResponseWriter, r *http.Request, n int, data []byte) bool {
		if n != 0 {
			return false
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Header().Set("ETag", `"img-v1"`)
		w.WriteHeader(http.StatusOK)
		w.Write(data[:len(data)/3])
		w.(http.Flusher).Flush()
		select { // stall until the client gives up (or the test ends)
		case <-r.Context().Done():
		case <-release:
		}
		return true
	}
	fa.tasks = []agentapi.Task{provisionTask(fa, "img", img, "raw")}
	dev, file := newLoop(t, 64<<20, nil)
	runAgentCfg(t, fa, dev, loopSerial, func(c *Config) { c.StallTimeout = 300 * time.Millisecond })
	fin, _ := fa.final(agentapi.StepFinalize)
	if fin.State != agentapi.StateSucceeded {
		t.Fatalf("finalize: %+v", fa.Reports())
	}
	if len(fa.ranges) != 1 {
		t.Errorf("range requests: %v", fa.ranges)
	}
	checkImageRange(t, file, img, fin.Written)
}

// TestMessagesSanitized: control characters go, length is bounded.
func TestMessagesSanitized(t *testing.T) {
	m := sanitize("a\x1b[31mb\nc" + strings.Repeat("é", 600))
	if strings.ContainsAny(m, "\x1b\n") || len(m) > agentapi.MaxMessageLen {
		t.Errorf("%q (%d bytes)", m, len(m))
	}
}

// TestCheckGates: the remaining check-step gates, each with the disk left untouched.
func TestCheckGates(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup", "sfdisk", "mkfs.ext4")
	img := buildImage(t, "gpt", 8, "gates")
	for _, tc := range []struct {
		name   string
		adjust func(*agentapi.Task)
		reason agentapi.Reason
	}{
		{"slow", func(k *agentapi.Task) { k.MinReadMBps = 1e9 }, agentapi.ReasonDiskTooSlow},
		{"no-such-serial", func(k *agentapi.Task) { k.Disk = agentapi.DiskRule{Serial: "ABSENT"} }, agentapi.ReasonDiskNotFound},
		{"no-such-wwn", func(k *agentapi.Task) { k.Disk = agentapi.DiskRule{WWN: "naa.0"} }, agentapi.ReasonDiskNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fa := newFakeAppliance(t)
			fa.images["img"] = img
			task := provisionTask(fa, "img", img, "raw")
			tc.adjust(&task)
			fa.tasks = []agentapi.Task{task}
			dev, file := newLoop(t, 64<<20, bytes.Repeat([]byte{7}, 1<<20))
			before := fileSHA(t, file)
			runAgent(t, fa, dev, loopSerial)
			if r, _ := fa.final(agentapi.StepCheck); r.State != agentapi.StateFailed || r.Reason != tc.reason {
				t.Fatalf("check: %+v", r)
			}
			if fileSHA(t, file) != before || fa.gets["img"] != 0 {
				t.Fatal("disk changed or image fetched after a failed check")
			}
		})
	}
}
