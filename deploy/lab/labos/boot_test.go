package labos

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/qemuvm"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// node is what the test writes into a kiln-node partition, the way the agent
// does (contracts: the per-node layer).
type node struct {
	hostname, machineID, token string
	fingerprint                string // as ssh-keygen -l prints it
	sha256                     string // of the whole partition
}

// stageDisk copies the base image to disk, appends the control-plane layer
// (partition kiln-layer-control-plane) and a kiln-node partition holding an
// ext4 filesystem made with mkfs.ext4 -d: hostname, machine-id, node.json,
// a fresh ed25519 host key (private key 0600), firstboot.json (0600).
func stageDisk(t *testing.T, r *Release, disk string, n *node, urls []string) {
	t.Helper()
	dir := t.TempDir()
	files := filepath.Join(dir, "node")
	for _, d := range []string{"etc/kiln", "etc/ssh"} {
		if err := os.MkdirAll(filepath.Join(files, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, mode os.FileMode, b []byte) {
		if err := os.WriteFile(filepath.Join(files, p), b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(files, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/hostname", 0o644, []byte(n.hostname+"\n"))
	write("etc/kiln/machine-id", 0o644, []byte(n.machineID+"\n"))
	write("etc/kiln/node.json", 0o644, []byte(`{"role":"worker","labels":{"rack":"r1"}}`+"\n"))
	cfg, _ := json.Marshal(agentapi.FirstBootFile{URLs: urls, MachineID: n.machineID, Token: n.token})
	write("etc/kiln/firstboot.json", 0o600, cfg)
	key := filepath.Join(files, "etc/ssh/ssh_host_ed25519_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@"+n.hostname, "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", key+".pub").Output()
	if err != nil {
		t.Fatal(err)
	}
	n.fingerprint = strings.Fields(string(out))[1]
	fs := filepath.Join(dir, "node.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", agentapi.PartNode, "-E", "root_owner=0:0", "-d", files, fs, "8M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if n.sha256, _, err = hashFile(fs); err != nil {
		t.Fatal(err)
	}

	// The disk: base image, then the layer and the node partition, each from a MiB boundary.
	base := r.Layer("base")
	cp := r.Layer("control-plane")
	layerStart := base.Size
	nodeStart := layerStart + (cp.Size+mib-1)/mib*mib
	total := nodeStart + 8*mib + mib
	if err := copyRange(r.Paths["base"], disk, 0, base.Size); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, total); err != nil {
		t.Fatal(err)
	}
	s := func(off int64) string { return strconv.FormatInt(off/512, 10) }
	if out, err := exec.Command("sgdisk", "-e",
		"-n", "3:"+s(layerStart)+":"+s(nodeStart-512), "-t", "3:8300", "-c", "3:"+cp.PartName,
		"-n", "4:"+s(nodeStart)+":"+s(nodeStart+8*mib-512), "-t", "4:8300", "-c", "4:"+agentapi.PartNode,
		disk).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v: %s", err, out)
	}
	if err := copyAt(disk, r.Paths["control-plane"], layerStart, -1); err != nil {
		t.Fatal(err)
	}
	if err := copyAt(disk, fs, nodeStart, -1); err != nil {
		t.Fatal(err)
	}
}

// TestBootReportsFirstBoot boots the base image, with a control-plane layer
// and a kiln-node partition appended, straight from a virtio disk under
// qemu/TCG, once with SeaBIOS (-machine pc: gptmbr.bin → syslinux) and once
// with OVMF (q35: EFI/BOOT/BOOTX64.EFI = systemd-boot). The OS opens its
// root through dm-verity, gets an address from dnsmasq (netns lbt-*,
// 10.79.15.0/24) and reports its first boot to an HTTP server here on the
// host end of the lab link (10.79.15.1); the report must carry the hostname,
// the host key fingerprint (as ssh-keygen -l prints it) and the partition's
// SHA-256 that were written. Runtime: the shared build plus about a minute
// per boot under TCG.
func TestBootReportsFirstBoot(t *testing.T) {
	testreq.Root(t, "network namespaces and a tap device", "ip", "qemu-system-x86_64", "dnsmasq", "ssh-keygen", "mkfs.ext4", "sgdisk")
	testreq.HostFile(t, "/usr/share/seabios/bios-256k.bin", "seabios")
	r := release(t)
	dir := t.TempDir()
	id := testkit.ID()
	lan := qemuvm.NewNet(t, qemuvm.Net{NS: "lbt-" + id, Host: "lbth" + id, Peer: "lbtc" + id, Bridge: "lbtb" + id,
		Tap: "lbtt" + id, HostCIDR: "10.79.15.1/24", BridgeCIDR: "10.79.15.2/24"})
	dm := exec.Command("ip", "netns", "exec", lan.NS, "dnsmasq", "-k", "--conf-file=/dev/null", "--port=0",
		"--bind-interfaces", "--interface="+lan.Bridge, "--dhcp-range=10.79.15.100,10.79.15.150,255.255.255.0,1h", "--no-ping",
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--user=root", "--group=root",
		"--pid-file="+filepath.Join(dir, "dnsmasq.pid"), "--log-facility="+filepath.Join(dir, "dnsmasq.log"))
	if err := dm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dm.Process.Kill(); _ = dm.Wait() })

	// The receiver: the first-boot endpoint, bearer token checked per machine.
	ln, err := net.Listen("tcp", "10.79.15.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*node{}
	tokens := map[string]string{}
	for _, fw := range []string{"bios", "uefi"} {
		nodes[fw] = &node{hostname: "node-" + fw, machineID: "m-" + fw, token: fmt.Sprintf("firstboot-token-%s-0123456789", fw)}
		tokens[nodes[fw].machineID] = nodes[fw].token
	}
	reports := make(chan agentapi.FirstBootReport, 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var rep agentapi.FirstBootReport
		if req.URL.Path != agentapi.EndpointFirstBoot || req.Method != http.MethodPost {
			http.NotFound(w, req)
			return
		}
		if err := json.NewDecoder(req.Body).Decode(&rep); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if tok, ok := tokens[rep.MachineID]; !ok || req.Header.Get("Authorization") != "Bearer "+tok {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		if err := rep.Validate(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reports <- rep
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String()

	for i, fw := range []string{"bios", "uefi"} {
		n := nodes[fw]
		ok := t.Run(fw, func(t *testing.T) {
			disk := filepath.Join(dir, fw+".img")
			// A dead URL first: the reporter moves on to the next one.
			stageDisk(t, r, disk, n, []string{"http://10.79.15.1:1", url})
			args := []string{"-accel", "tcg", "-m", "512", "-smp", "1", "-nodefaults", "-nographic", "-monitor", "none", "-no-reboot",
				"-drive", "file=" + disk + ",format=raw,if=virtio",
				"-netdev", "tap,id=n0,ifname=" + lan.Tap + ",script=no,downscript=no",
				"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:79:15:%02x,romfile=", i+1)}
			if fw == "bios" {
				args = append([]string{"-machine", "pc"}, args...)
			} else {
				args = append(append([]string{"-machine", "q35"}, qemuvm.OVMF(t, filepath.Join(dir, "vars-"+fw+".fd"))...), args...)
			}
			start := time.Now()
			vm := qemuvm.Start(t, lan.NS, filepath.Join(dir, "serial-"+fw+".log"), args...)
			var rep agentapi.FirstBootReport
			deadline := time.After(240 * time.Second)
			for got := false; !got; {
				fail := ""
				select {
				case rep = <-reports:
					got = true
				case <-deadline:
					fail = "no first-boot report within 240 s"
				case <-time.After(time.Second):
					// /sbin/init prints "kiln-labos: up" after the reporter ended: no report is coming.
					if b, _ := os.ReadFile(vm.Serial); bytes.Contains(b, []byte("kiln-labos: up ")) || bytes.Contains(b, []byte(": stopped")) {
						select {
						case rep = <-reports:
							got = true
						default:
							fail = "the OS finished booting without reporting"
						}
					}
				}
				if fail != "" {
					b, _ := os.ReadFile(vm.Serial)
					lg, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
					t.Fatalf("%s: %s; qemu: %s\nserial:\n%s\ndnsmasq:\n%s", fw, fail, vm.Output(), qemuvm.Tail(b, 4000), qemuvm.Tail(lg, 1500))
				}
			}
			took := time.Since(start)
			if rep.MachineID != n.machineID || rep.Hostname != n.hostname || rep.SSHHostKeyFingerprint != n.fingerprint ||
				rep.NodeLayerSHA256 != n.sha256 || rep.Outcome != agentapi.OutcomeSucceeded || rep.Phase != agentapi.PhaseNodeLayer || rep.BootID == "" {
				t.Fatalf("%s: report %+v\nwant machine %s hostname %s fingerprint %s node sha256 %s", fw, rep, n.machineID, n.hostname, n.fingerprint, n.sha256)
			}
			b, err := vm.Wait(60*time.Second, func(b []byte) bool { return bytes.Contains(b, []byte("kiln-labos: up ")) })
			if err != nil && !errors.Is(err, qemuvm.ErrTimeout) {
				t.Fatal(err)
			}
			for _, want := range []string{
				"kiln-labos: root /dev/vda2 verified (dm-verity " + r.Layer("base").VerityRootHash + ")",
				"kiln-labos: layers: control-plane",
				"kiln-firstboot: reported hostname=" + n.hostname + " fp=" + n.fingerprint,
				"hostname " + n.hostname,
			} {
				if !bytes.Contains(b, []byte(want)) {
					t.Fatalf("%s: console lacks %q:\n%s", fw, want, qemuvm.Tail(b, 4000))
				}
			}
			if bytes.Contains(b, []byte(n.token)) {
				t.Fatalf("%s: the first-boot token reached the console", fw)
			}
			t.Logf("labos: %s boot to first-boot report in %.1f s (hostname %s, %s)", fw, took.Seconds(), rep.Hostname, rep.SSHHostKeyFingerprint)
		})
		if !ok {
			break
		}
	}
}
