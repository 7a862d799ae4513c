package agent

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

// eraseOnLoop fills a loop device of size bytes with random data, runs an erase task with
// policy pol and hooks h against it, detaches it and returns the erase step's final
// report, the old content and the file's content afterwards (read from the host).
func eraseOnLoop(t *testing.T, size int64, pol *agentapi.ErasePolicy, h eraseHooks) (agentapi.Report, []byte, []byte) {
	t.Helper()
	old := make([]byte, size)
	if _, err := rand.Read(old); err != nil {
		t.Fatal(err)
	}
	dev, file := newLoop(t, size, old)
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{{Action: agentapi.ActionErase, PollAfter: 1e7, Heartbeat: 1e7, ErasePolicy: pol}}
	runAgentCfg(t, fa, dev, loopSerial, func(c *Config) { c.erase = h })
	r, ok := fa.final(agentapi.StepErase)
	if !ok {
		t.Fatalf("no erase report: %+v", fa.Reports())
	}
	detachLoop(dev, file) // drop the loop device's cache before reading the file
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Erase) != 1 {
		t.Fatalf("want one certificate, got %+v", r.Erase)
	}
	c := r.Erase[0]
	t.Logf("certificate: %s", certLine(c))
	if c.Serial != loopSerial || c.Path != dev || c.SizeBytes != uint64(size) || c.Started.IsZero() || c.Ended.Before(c.Started) {
		t.Errorf("certificate identity/times: %+v", c)
	}
	return r, old, after
}

// survivors counts the 4 KiB blocks of after that still equal old.
func survivors(old, after []byte) (n int, first int) {
	first = -1
	for o := 0; o+eraseBlock <= len(old); o += eraseBlock {
		if bytes.Equal(old[o:o+eraseBlock], after[o:o+eraseBlock]) {
			n++
			if first < 0 {
				first = o
			}
		}
	}
	return n, first
}

// TestEraseOverwriteLoop: a loop device (no firmware method: the overwrite path) full of
// random data is overwritten with the pattern and read back, fully or sampled; the
// certificate states the coverage; from the host no 4 KiB block of the old data is left
// and the first and last MiB read zeros.
func TestEraseOverwriteLoop(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup")
	const size = 16 << 20
	for _, tc := range []struct {
		verify   string
		coverage float64 // lower bound
	}{
		{agentapi.VerifyFull, 1},
		// first and last MiB (512 blocks) + 1024 sampled of 4096 blocks, overlaps removed
		{agentapi.VerifySample, 0.125},
	} {
		t.Run(tc.verify, func(t *testing.T) {
			r, old, after := eraseOnLoop(t, size, &agentapi.ErasePolicy{Verify: tc.verify}, eraseHooks{})
			c := r.Erase[0]
			if r.State != agentapi.StateSucceeded || c.Method != agentapi.EraseOverwrite || c.Outcome != agentapi.EraseErased || !c.Verified || c.Mismatches != 0 {
				t.Fatalf("erase: %+v", r)
			}
			if c.Coverage < tc.coverage || c.Coverage > 1 || (tc.verify == agentapi.VerifySample && c.Coverage >= 1) {
				t.Errorf("coverage %.4f, want ≥ %.4f", c.Coverage, tc.coverage)
			}
			if !strings.Contains(c.Verification, tc.verify+" read-back") && !strings.Contains(c.Verification, "sampled read-back") {
				t.Errorf("verification text: %q", c.Verification)
			}
			if n, first := survivors(old, after); n != 0 {
				t.Fatalf("%d old 4 KiB blocks survived, first at %d", n, first)
			}
			mib := 1 << 20
			if !allZero(after[:mib]) || !allZero(after[size-mib:]) {
				t.Error("first/last MiB not zeros")
			}
			if allZero(after[mib : size-mib]) {
				t.Error("the middle reads zeros: the pattern was not written")
			}
		})
	}
}

// TestEraseVerifyCatchesSkippedBlock: the writer is made to skip one 4 KiB block (a
// fault injected into the overwrite); the verification finds exactly that block, the
// disk's outcome is verify_failed and the step fails. Full read-back: a block in the
// middle; sampled: a block inside the first MiB (always read back).
func TestEraseVerifyCatchesSkippedBlock(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup")
	const size = 16 << 20
	for _, tc := range []struct {
		verify string
		skip   int64
	}{
		{agentapi.VerifyFull, 9<<20 + 8192},
		{agentapi.VerifySample, 512 << 10},
	} {
		t.Run(tc.verify, func(t *testing.T) {
			r, old, after := eraseOnLoop(t, size, &agentapi.ErasePolicy{Verify: tc.verify},
				eraseHooks{skipWrite: []byteRange{{tc.skip, eraseBlock}}})
			c := r.Erase[0]
			if n, first := survivors(old, after); n != 1 || int64(first) != tc.skip {
				t.Fatalf("the fault did not leave exactly the planted block: %d survivors, first at %d", n, first)
			}
			if r.State != agentapi.StateFailed || r.Reason != agentapi.ReasonEraseFailed {
				t.Fatalf("step: %+v", r)
			}
			if c.Outcome != agentapi.EraseVerifyFailed || c.Verified || c.Mismatches != 1 || c.FirstMismatch != tc.skip {
				t.Fatalf("certificate: %+v", c)
			}
			if !strings.Contains(r.Message, loopName(r)+" verify_failed") {
				t.Errorf("step message: %q", r.Message)
			}
		})
	}
}

func loopName(r agentapi.Report) string { return r.Erase[0].Name }

// TestEraseTargets: every disk of ListDisks is a target; read-only, removable and mounted
// ones, and an optical drive holding a medium, are reported skipped with the reason; an empty
// optical drive is not listed.
func TestEraseTargets(t *testing.T) {
	root := t.TempDir()
	wr := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wr("sys/block/vda/ro", "0\n")
	wr("sys/block/vdb/ro", "1\n")
	wr("sys/block/sda/ro", "0\n")
	wr("sys/block/sr0/size", "1228800\n")
	wr("sys/block/sr0/device/model", "QEMU DVD-ROM\n")
	wr("sys/block/sr1/size", "0\n")
	wr("proc/self/mounts", "none / rootfs rw 0 0\n/dev/sda1 /media ext4 rw 0 0\n")
	wr("sys/block/sdb/ro", "0\n")
	disks := []agentapi.Disk{{Name: "vda", Path: "/dev/vda"}, {Name: "vdb", Path: "/dev/vdb"}, {Name: "sda", Path: "/dev/sda"},
		{Name: "sdb", Path: "/dev/sdb", Removable: true}}
	got := map[string]string{}
	for _, tg := range eraseTargets(root, disks) {
		got[tg.disk.Name] = tg.skip
	}
	if len(got) != 5 || got["vda"] != "" || !strings.Contains(got["sdb"], "removable=1") || !strings.Contains(got["vdb"], "read-only") ||
		!strings.Contains(got["sda"], "/dev/sda1 on /media") || !strings.Contains(got["sr0"], "removable medium") {
		t.Fatalf("targets: %q", got)
	}
	if _, ok := got["sr1"]; ok {
		t.Error("empty optical drive listed")
	}
}

// TestEraseSkippedAreCertified: a skipped disk still gets a certificate (method none,
// outcome skipped, the reason) and does not fail the step.
func TestEraseSkippedAreCertified(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "sys/block/vdz"), 0o755)
	os.WriteFile(filepath.Join(root, "sys/block/vdz/ro"), []byte("1"), 0o644)
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{{Action: agentapi.ActionErase, PollAfter: 1e7, Heartbeat: 1e7}}
	runAgentCfg(t, fa, "/dev/null", "X", func(c *Config) {
		c.Root = root
		c.ListDisks = func() ([]agentapi.Disk, error) {
			return []agentapi.Disk{{Name: "vdz", Path: "/dev/vdz", Serial: "RO1", SizeBytes: 1 << 30}}, nil
		}
	})
	r, _ := fa.final(agentapi.StepErase)
	if r.State != agentapi.StateSucceeded || len(r.Erase) != 1 {
		t.Fatalf("erase: %+v", r)
	}
	c := r.Erase[0]
	if c.Method != agentapi.EraseNone || c.Outcome != agentapi.EraseSkipped || !strings.Contains(c.Reason, "read-only") || c.Serial != "RO1" {
		t.Fatalf("certificate: %+v", c)
	}
}

func TestMountedAt(t *testing.T) {
	m := map[string]string{"/dev/sda1": "/a", "/dev/nvme0n1p2": "/b", "/dev/sdab": "/c"}
	for dev, want := range map[string]bool{"/dev/sda": true, "/dev/nvme0n1": true, "/dev/sdb": false, "/dev/nvme0": false, "/dev/sdab": true} {
		if got := mountedAt(m, dev) != ""; got != want {
			t.Errorf("%s: mounted %v, want %v", dev, got, want)
		}
	}
}

func TestSampleOffsets(t *testing.T) {
	size := int64(10<<20 + 512) // last block short
	offs := sampleOffsets(size, 100)
	if len(offs) != 102 || offs[0] != 0 || offs[len(offs)-1] != (size/eraseBlock)*eraseBlock {
		t.Fatalf("offsets: %d, first %d last %d", len(offs), offs[0], offs[len(offs)-1])
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] <= offs[i-1] || offs[i]%eraseBlock != 0 {
			t.Fatalf("not sorted/distinct/aligned at %d: %v", i, offs[i-1:i+1])
		}
	}
	if got := blockBytes(size, offs); got != 101*eraseBlock+512 {
		t.Errorf("blockBytes %d", got)
	}
	if small := sampleOffsets(3*eraseBlock, 100); len(small) != 3 {
		t.Errorf("a 3-block device samples %v", small)
	}
	ht := headTail(4 << 20)
	if len(ht) != 512 {
		t.Errorf("headTail: %d blocks", len(ht))
	}
}

func TestPatternIsPositional(t *testing.T) {
	p, err := newPattern()
	if err != nil {
		t.Fatal(err)
	}
	whole := make([]byte, 3*eraseBlock)
	p.fill(whole, 8192)
	part := make([]byte, eraseBlock)
	p.fill(part, 8192+eraseBlock)
	if !bytes.Equal(part, whole[eraseBlock:2*eraseBlock]) || allZero(part) || bytes.Equal(whole[:eraseBlock], part) {
		t.Fatal("pattern of a block differs when generated alone, or repeats")
	}
}

// TestEraseEveryDisk: every disk ListDisks returns is erased, not only one
// chosen by the task's disk rule; the report carries one certificate per disk, in name
// order; a fault on one disk fails the step and leaves the other erased and certified.
func TestEraseEveryDisk(t *testing.T) {
	testreq.Root(t, "loop devices", "losetup")
	const size = 8 << 20
	old := make([]byte, size)
	rand.Read(old)
	devA, fileA := newLoop(t, size, old)
	devB, fileB := newLoop(t, size, old)
	fa := newFakeAppliance(t)
	fa.tasks = []agentapi.Task{{Action: agentapi.ActionErase, Disk: agentapi.DiskRule{Serial: "A"}, PollAfter: 1e7, Heartbeat: 1e7,
		ErasePolicy: &agentapi.ErasePolicy{Verify: agentapi.VerifyFull}}}
	disks := []agentapi.Disk{{Name: filepath.Base(devA), Path: devA, Serial: "A"}, {Name: filepath.Base(devB), Path: devB, Serial: "B"}}
	// A fault at 4 MiB: both disks are written by the same faulty writer.
	runAgentCfg(t, fa, devA, "A", func(c *Config) {
		c.ListDisks = func() ([]agentapi.Disk, error) { return disks, nil }
		c.erase = eraseHooks{skipWrite: []byteRange{{4 << 20, eraseBlock}}}
	})
	r, _ := fa.final(agentapi.StepErase)
	if r.State != agentapi.StateFailed || len(r.Erase) != 2 {
		t.Fatalf("erase: %+v", r)
	}
	for _, c := range r.Erase {
		if c.Outcome != agentapi.EraseVerifyFailed || c.FirstMismatch != 4<<20 || c.Coverage != 1 {
			t.Errorf("%s: %+v", c.Serial, c)
		}
	}
	if r.Erase[0].Name > r.Erase[1].Name {
		t.Error("certificates not in name order")
	}
	detachLoop(devA, fileA)
	detachLoop(devB, fileB)
	for _, f := range []string{fileA, fileB} {
		after, _ := os.ReadFile(f)
		if n, first := survivors(old, after); n != 1 || first != 4<<20 {
			t.Errorf("%s: %d survivors, first %d", f, n, first)
		}
	}
}

// BenchmarkPatternFill: the overwrite's pattern generation (AES-128-CTR) per 4 MiB buffer.
func BenchmarkPatternFill(b *testing.B) {
	p, err := newPattern()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, writeBufSize)
	b.SetBytes(int64(len(buf)))
	for i := 0; i < b.N; i++ {
		p.fill(buf, int64(i)*int64(len(buf)))
	}
}
