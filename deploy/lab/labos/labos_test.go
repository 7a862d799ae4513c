package labos

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/deploy/lab/testreq"
)

// The package's tests share one release build (it takes tens of seconds on a
// loaded machine); TestBuildIsReproducible makes a second one.
var (
	shared     *Release
	sharedErr  error
	sharedOnce sync.Once
	sharedDir  string
)

func requireTools(t testing.TB) {
	t.Helper()
	testreq.Commands(t, append([]string{"go", "apt-get", "dpkg", "flock"}, Tools...)...)
	for f, pkg := range HostFiles {
		testreq.HostFile(t, f, pkg)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
	os.Exit(code)
}

func release(t testing.TB) *Release {
	t.Helper()
	requireTools(t)
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "labos-")
		if sharedErr != nil {
			return
		}
		start := time.Now()
		shared, sharedErr = Build(Options{Dir: sharedDir})
		if sharedErr == nil {
			t.Logf("labos: release %s built in %.1f s", shared.Manifest.Release, time.Since(start).Seconds())
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// TestBuildIsReproducible builds the release twice, a second apart, and
// requires identical manifests and identical bytes in every file.
func TestBuildIsReproducible(t *testing.T) {
	a := release(t)
	time.Sleep(1100 * time.Millisecond) // no wall-clock time may leak in
	b, err := Build(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ma, _ := os.ReadFile(a.ManifestPath)
	mb, _ := os.ReadFile(b.ManifestPath)
	if !bytes.Equal(ma, mb) {
		t.Fatalf("two builds' manifests differ:\n%s\n%s", ma, mb)
	}
	for name, p := range a.Paths {
		sa, _, err := hashFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sb, _, err := hashFile(b.Paths[name])
		if err != nil {
			t.Fatal(err)
		}
		if sa != sb || sa != a.Layer(name).SHA256 {
			t.Fatalf("layer %s: %s vs %s (manifest %s)", name, sa, sb, a.Layer(name).SHA256)
		}
	}
	t.Logf("labos: reproducible: %s, base %d bytes sha256 %s", a.Manifest.Release, a.Layer("base").Size, a.Layer("base").SHA256)
}

// TestBaseLayout checks the base image with the tools a person would use:
// the GPT (names, types, the legacy BIOS bootable attribute), gptmbr.bin in
// the MBR, and the ESP's files (both boot loaders and their configuration).
func TestBaseLayout(t *testing.T) {
	r := release(t)
	m := r.Manifest
	if len(m.Layers) != 4 || m.Layers[0].Name != "base" || m.KubeadmVersion != KubeadmVersion || m.Kernel == "" {
		t.Fatalf("manifest %+v", m)
	}
	for _, l := range m.Layers {
		if len(l.SHA256) != 64 || len(l.VerityRootHash) != 64 || l.VerityHashOffset <= 0 || l.Size <= l.VerityHashOffset {
			t.Fatalf("layer %+v", l)
		}
		if l.Name != "base" && l.PartName != "kiln-layer-"+l.Name {
			t.Fatalf("layer %s part name %q", l.Name, l.PartName)
		}
	}
	img := r.Paths["base"]
	out, err := exec.Command("sgdisk", "-p", img).CombinedOutput()
	if err != nil {
		t.Fatalf("sgdisk -p: %v: %s", err, out)
	}
	for _, want := range []string{"Disk identifier (GUID): " + DiskGUID, "EF00  kiln-esp", "8304  kiln-root"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("sgdisk -p lacks %q:\n%s", want, out)
		}
	}
	out, _ = exec.Command("sgdisk", "-A", "1:show", img).CombinedOutput()
	if !strings.Contains(string(out), "legacy BIOS bootable") {
		t.Fatalf("p1 is not legacy BIOS bootable: %s", out)
	}
	mbr, _ := os.ReadFile("/usr/lib/syslinux/mbr/gptmbr.bin")
	head := make([]byte, 440)
	f, _ := os.Open(img)
	_, _ = f.ReadAt(head, 0)
	f.Close()
	if len(mbr) < 440 || !bytes.Equal(head, mbr[:440]) {
		t.Fatal("the MBR boot code is not gptmbr.bin")
	}
	esp := filepath.Join(t.TempDir(), "esp.img")
	if err := copyRange(img, esp, r.Base.ESPStart, r.Base.ESPSize); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"::/EFI/BOOT/BOOTX64.EFI", "::/syslinux/ldlinux.sys", "::/syslinux/ldlinux.c32", "::/vmlinuz", "::/initrd.img"} {
		if out, err := exec.Command("mdir", "-a", "-i", esp, p).CombinedOutput(); err != nil {
			t.Fatalf("ESP lacks %s: %v: %s", p, err, out)
		}
	}
	for _, p := range []string{"::/syslinux/syslinux.cfg", "::/loader/entries/kiln.conf"} {
		out, err := exec.Command("mtype", "-i", esp, p).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "kiln.roothash="+m.Layers[0].VerityRootHash) {
			t.Fatalf("%s does not pass the root hash: %v: %s", p, err, out)
		}
	}
	if out, err := exec.Command("fsck.fat", "-n", esp).CombinedOutput(); err != nil {
		t.Fatalf("fsck.fat -n: %v: %s", err, out)
	}
}

// TestVerityAcceptsBuiltRootRejectsFlippedByte: veritysetup verify accepts
// the base image's kiln-root partition and every extra layer as built, with
// the manifest's root hash and offset, and rejects them after one byte of
// data or of the hash tree is flipped.
func TestVerityAcceptsBuiltRootRejectsFlippedByte(t *testing.T) {
	r := release(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "kiln-root.part")
	if err := copyRange(r.Paths["base"], root, r.Base.RootStart, r.Base.RootSize); err != nil {
		t.Fatal(err)
	}
	parts := map[string]string{"base": root}
	for _, l := range r.Manifest.Layers[1:] {
		parts[l.Name] = r.Paths[l.Name]
	}
	for name, part := range parts {
		l := r.Layer(name)
		verify := func(p string) error {
			out, err := exec.Command("veritysetup", "verify", p, p, l.VerityRootHash,
				"--hash-offset="+strconv.FormatInt(l.VerityHashOffset, 10)).CombinedOutput()
			if err != nil {
				return &exec.ExitError{Stderr: out}
			}
			return nil
		}
		if err := verify(part); err != nil {
			t.Fatalf("%s: veritysetup verify rejects the built image: %s", name, err.(*exec.ExitError).Stderr)
		}
		flips := map[string]int64{"data": 17}
		if l.VerityHashOffset > 4096 { // one data block has no hash block: the root hash is its hash
			flips["hash tree"] = l.VerityHashOffset + 4096 + 5
		}
		for what, off := range flips {
			bad := filepath.Join(dir, name+"-"+strings.ReplaceAll(what, " ", "")+".part")
			b, err := os.ReadFile(part)
			if err != nil {
				t.Fatal(err)
			}
			b[off] ^= 0x01
			if err := os.WriteFile(bad, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := verify(bad); err == nil {
				t.Fatalf("%s: veritysetup verify accepts a flipped byte in the %s at %d", name, what, off)
			}
			os.Remove(bad)
		}
	}
}
