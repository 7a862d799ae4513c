// Package e2e runs Kiln's main job in the lab: a real qemu VM with real
// firmware (SeaBIOS + iPXE ROM, or OVMF) is imported, powered on through its
// BMC (ipmi_sim for IPMI, the virtual Redfish BMC for Redfish), PXE-boots from
// Kiln, is inspected by the in-RAM agent, claimed, built (check, write,
// verify, stage) and rebooted to its disk. The same Run serves `make e2e`
// (deploy/lab/e2e tests) and `make demo` (deploy/lab/demo). RunHA (ha.go,
// halab.go) is `make e2e-ha`: the same flow for four VMs against a site
// cluster of three nodes, with a leader killed mid-build, a node restarted
// and a partition, and every node checked at the end.
package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/cmd/kiln-agent/agent"
	"kiln/deploy/lab/ipmilab"
	"kiln/deploy/lab/labimage"
	"kiln/deploy/lab/labnet"
	"kiln/deploy/lab/labos"
	"kiln/deploy/lab/swtpm"
)

// Options of one run.
type Options struct {
	Root     string // repository root (bin/, build/env, deploy/lab)
	Work     string // scratch directory for this run (created)
	Prefix   string // network namespace prefix, e.g. "kln"
	Firmware string // "bios" or "uefi"
	BMC      string // "ipmi" or "redfish"
	DiskMiB  int    // the VM's virtio disk
	ImageMiB int    // ext4 size of the image (the image is 1 MiB larger)
	// WantReason, when set, expects the build to fail with this reason
	// (e.g. disk_too_small) instead of reaching provisioned.
	WantReason string
	Timeout    time.Duration
	KeepUp     bool      // leave the lab running at the end (demo)
	Out        io.Writer // progress, one line per event
	// ExtraConfig is appended to the lab's kiln.yaml (top-level sections,
	// e.g. `remediation:` with the lab's short timeouts).
	ExtraConfig string
	// MemMiB is each VM's memory (0: 512).
	MemMiB int
	// Attest gives the VM a TPM 2.0 (swtpm) and runs the attestation
	// gate (issue 16): the first claim is refused (no approved state),
	// the operator learns and approves the VM's measured boot as the
	// model's reference, has it inspected again and claims it again; that
	// build attests, passes and gets the claim's join data. The caller's
	// ExtraConfig must require attestation (e2eAttest).
	Attest bool
	// Release provisions the lab OS release (deploy/lab/labos, issue 15)
	// with a cluster block of role control-plane instead of the plain lab
	// image: provisioned only from the written OS's first-boot report, then
	// every layer and the per-node layer checked from the host (release.go).
	Release bool
	// VerifyFault (with Release): the first build is served a layer whose
	// bytes on the appliance no longer match its pin. It must fail in
	// verify with a cleared partition table and netboot the agent again on
	// a power cycle; the bytes are restored and the machine reprovisioned.
	VerifyFault bool
	// ClaimWith, when set, places the claim instead of the flow's own
	// Provision of the plain lab image (not with Release, Attest or
	// VerifyFault): the Cluster API provider's end-to-end run
	// (cmd/kiln-capi) claims through a KilnMachine. It gets the lab's Kiln,
	// the available machine's ID and the uploaded image's ID, and returns
	// once its claim is placed (or will be: the flow then waits for the
	// machine to settle as usual).
	ClaimWith func(ctx context.Context, k LabKiln, machineID, imageID string) error
	qemuExtra []string // appended to the VM's qemu arguments (the TPM)
}

// LabKiln is the lab's Kiln as ClaimWith sees it: its API URL (inside the
// lab's server namespace), the admin token, an HTTP client whose
// connections are opened in that namespace, and a client of the API.
type LabKiln struct {
	URL, Token string
	HTTP       *http.Client
	API        *client.Client
}

// Result of a run.
type Result struct {
	MachineID     string
	FinalState    client.MachineState
	Reason        string
	PowerOnAt     time.Time
	Seconds       float64 // power-on → final state
	ImageSHA256   string
	DiskImageOK   bool   // every byte of the disk is as expected (checkDisk)
	DiskProblem   string // the first difference checkDisk found ("" when DiskImageOK)
	DiskUntouched bool   // the disk is all zeros (failing path)
	Cidata        map[string]string
	DiskBooted    bool // BIOS: the image's boot sector ran after the exit-to-disk script; UEFI: OVMF went on to the disk's boot option
	// BurnIn summarises the machine's burn-in record when one ran before it
	// was available (issue 17: "passed cpu=1.0s memory=... "), "" otherwise.
	BurnIn string
	// Attest runs only: the refused reference build's attestation, the
	// passing one's, the attest step's time in the passing build (the
	// step's started→succeeded events, Kiln's clock), and whether the
	// claim's join data is on the disk.
	AttestRefused, AttestPassed *api.Attestation
	AttestSeconds               float64
	JoinDataStaged              bool
	// Release runs only. Machine is the final record (its Build: layers,
	// node layer hash, first-boot report). LayerChoice describes the chosen
	// and skipped layers; ReleaseProblem is checkReleaseDisk's first
	// problem ("" when none); OSUp: the written OS's console said it was up
	// with the claim's hostname; SecretLeak names where the cluster token
	// was found (kiln.log, a serial log, the CLI's answer), "" when nowhere.
	Machine        api.Machine
	LayerChoice    string
	ReleaseProblem string
	OSUp           bool
	SecretLeak     string
	BuildSeconds   float64 // the last build: build_started → provisioned (Kiln's clock)
	// VerifyFault runs only: the failed build's reason, whether its disk's
	// partition table was cleared, and the seconds from the power cycle to
	// the agent registering again from the network.
	FaultReason    string
	FaultCleared   bool
	NetbootSeconds float64
	Lab            *labnet.Lab
}

const (
	vmMAC   = "52:54:00:99:01:01"
	vmUUID  = "5e1f0000-0000-4000-8000-525400990101"
	bmcUser = "admin"
	bmcPass = "lab-bmc-Secret-42"
	diskMsg = "KILN-DISK-BOOT"
)

// Run executes the flow. It returns an error when a step of the lab itself
// fails or the machine does not reach the expected state in time.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := preflight(o); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, err
	}
	r := &Result{}
	say := func(f string, a ...any) { fmt.Fprintf(o.Out, f+"\n", a...) }

	lab, err := labnet.Setup(o.Prefix)
	if err != nil {
		return nil, err
	}
	r.Lab = lab
	if !o.KeepUp {
		defer lab.Teardown()
	}
	if err := lab.AddTap("tap0"); err != nil {
		return nil, err
	}
	say("lab: namespaces %s and %s, bridge br0, Kiln on %s, BMC on %s", lab.Srv, lab.LAN, labnet.ServerIP, labnet.BMCAddr)

	var img labimage.Image
	var rel *labos.Release
	if o.Release {
		if rel, err = labRelease(o, say); err != nil {
			return nil, fmt.Errorf("lab OS release: %w", err)
		}
		r.ImageSHA256 = rel.Layer("base").SHA256
		say("release: %s, %d layers, base sha256 %s", rel.Manifest.Release, len(rel.Manifest.Layers), r.ImageSHA256[:16])
	} else {
		if img, err = buildImage(o); err != nil {
			return nil, err
		}
		r.ImageSHA256 = img.SHA256
		say("image: %s, %d bytes, sha256 %s", filepath.Base(img.Path), img.Size, img.SHA256[:16])
	}
	disk := filepath.Join(o.Work, "disk.img")
	_ = os.Remove(disk)
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		return nil, err
	}
	if err := os.Truncate(disk, int64(o.DiskMiB)<<20); err != nil {
		return nil, err
	}

	k, err := startKiln(ctx, o, lab)
	if err != nil {
		return nil, err
	}
	say("kiln: serving DHCP/TFTP/HTTP on %s (log %s)", labnet.ServerIf, k.logPath)
	if err := startRadvd(o, lab); err != nil {
		return nil, err
	}

	if o.Attest {
		tpm, err := swtpm.StartQEMU(filepath.Join(o.Work, "tpm"))
		if err != nil {
			return nil, fmt.Errorf("swtpm: %w", err)
		}
		if !o.KeepUp {
			defer tpm.Close()
		}
		o.qemuExtra = tpm.Args
		say("tpm: swtpm (TPM 2.0, EK certificate) attached to the VM")
	}
	bmcAddr, driver, stateDir, err := startBMC(ctx, o, lab, disk)
	if err != nil {
		return nil, err
	}
	say("bmc: %s (%s) controls the VM (%s firmware)", bmcAddr, driver, o.Firmware)

	// Intake: the machine as the purchase record / rack plan knows it.
	mode := "legacy"
	if o.Firmware == "uefi" {
		mode = "uefi"
	}
	csv := fmt.Sprintf("name,macs,boot_mode,rack,u,labels\nlab-%s,%s,%s,lab-r1,1,lab=e2e\n", o.Firmware, vmMAC, mode)
	if err := os.WriteFile(filepath.Join(o.Work, "plan.csv"), []byte(csv), 0o644); err != nil {
		return nil, err
	}
	imp, err := k.api.ImportMachines(ctx, "csv", strings.NewReader(csv))
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	ms, err := k.api.ListAllMachines(ctx, client.MachineQuery{})
	if err != nil {
		return nil, fmt.Errorf("machines list: %w", err)
	}
	if imp.Created != 1 || len(ms) != 1 || ms[0].ID != imp.IDs[0] {
		return nil, fmt.Errorf("after import: %d created, %d machines, want 1", imp.Created, len(ms))
	}
	r.MachineID = ms[0].ID
	say("import: machine %s (%s) registered", r.MachineID, ms[0].Name)

	var im api.Image
	var layerImgs map[string]api.Image
	if o.Release {
		if im, layerImgs, err = uploadRelease(ctx, k.api, rel); err != nil {
			return nil, err
		}
		say("release: uploaded; image %s is the release (%d layers, kubeadm %s)", im.ID, len(im.Layers), im.KubeadmVersion)
	} else {
		if im, err = uploadImage(ctx, k.api, img); err != nil {
			return nil, err
		}
		say("image: uploaded as %s (%s)", im.ID, im.Name)
	}

	if _, err := k.api.EnrollBMC(ctx, r.MachineID, api.BMCEnrollRequest{Address: bmcAddr, Driver: driver,
		Username: bmcUser, Password: bmcPass, InsecureTLS: driver == "redfish"}); err != nil {
		return nil, fmt.Errorf("bmc enroll: %w", err)
	}
	say("bmc: enrolled; Kiln sets next boot to PXE and powers the machine on")

	// Follow events until the machine settles.
	w := &watcher{k: k, o: o, id: r.MachineID, stateDir: stateDir, say: say}
	if err := w.until(ctx, func(m api.Machine) bool {
		return m.State == client.StateAvailable || m.State == client.StateFailed || m.State == client.StateQuarantined
	}); err != nil {
		return r, err
	}
	if w.last.State != client.StateAvailable {
		return r, fmt.Errorf("inspection ended %s (%s): %s", w.last.State, w.last.Reason, w.last.Message)
	}
	if b := w.last.BurnIn; b != nil {
		r.BurnIn = fmt.Sprintf("passed=%v policy=%s", b.Passed, b.Policy)
		for _, x := range b.Tests {
			r.BurnIn += fmt.Sprintf(" %s=%v/%.1fs", x.Name, x.Passed, x.Duration.Seconds())
		}
		say("burn-in: %s", r.BurnIn)
	}
	say("claim: provisioning %s with %s", r.MachineID, im.ID)
	claim := api.Claim{Image: im.ID, Hostname: "lab-node-1", Role: "worker", Labels: map[string]string{"lab": "e2e"}}
	secret := attestJoinData // what the attestation gate holds back
	if o.Release {
		secret = clusterToken()
		claim.Role = "control-plane"
		claim.Cluster = &api.ClusterBlock{Role: "control-plane", ControlPlaneHost: labnet.ServerIP,
			KubernetesVersion: rel.Manifest.KubeadmVersion, ClusterToken: secret}
	} else if o.Attest {
		claim.JoinData = attestJoinData
	}
	var faulty string // the catalog file of the layer VerifyFault corrupts
	if o.VerifyFault {
		l := rel.Layer("control-plane")
		if faulty, err = catalogFile(filepath.Join(o.Work, "images"), layerImgs["control-plane"].SHA256); err != nil {
			return r, err
		}
		if err := flipByte(faulty, l.Size/2); err != nil {
			return r, err
		}
		say("fault: one byte of layer control-plane flipped in the appliance's catalog (%s); its pin is unchanged", filepath.Base(faulty))
	}
	settled := func(m api.Machine) bool {
		return m.State == client.StateProvisioned || m.State == client.StateFailed || m.State == client.StateQuarantined
	}
	if o.ClaimWith != nil {
		if o.Release || o.Attest || o.VerifyFault {
			return r, errors.New("e2e: ClaimWith runs the plain image only")
		}
		if err := o.ClaimWith(ctx, LabKiln{URL: k.url, Token: k.token, HTTP: k.hc, API: k.api}, r.MachineID, im.ID); err != nil {
			return r, fmt.Errorf("claim: %w", err)
		}
	} else if _, err := k.api.Provision(ctx, r.MachineID, api.ProvisionRequest{Reason: "e2e", Claim: claim}); err != nil {
		return r, fmt.Errorf("provision: %w", err)
	}
	if err := w.until(ctx, settled); err != nil {
		return r, err
	}
	if o.VerifyFault {
		if err := verifyFault(ctx, k, w, r, disk, faulty, rel.Layer("control-plane").Size/2, stateDir, say); err != nil {
			return r, err
		}
		if err := w.until(ctx, settled); err != nil {
			return r, err
		}
	}
	if o.Attest {
		if err := attestReference(ctx, k, w, r, disk, im.ID, claim, secret, say); err != nil {
			return r, err
		}
		if err := w.until(ctx, settled); err != nil {
			return r, err
		}
		r.AttestPassed = w.last.Attestation
		r.AttestSeconds = attestStepSeconds(w.seen, r.MachineID)
		say("attest: %s in %.2f s (state %s)", attestSummary(w.last.Attestation), r.AttestSeconds, attestState(w.last.Attestation))
	}
	r.FinalState, r.Reason = w.last.State, w.last.Reason
	r.PowerOnAt = w.powerOn
	// The built binary's CLI, run as an operator runs it, sees what the client saw.
	var seen api.Machine
	if err := k.cliJSON(ctx, &seen, "machines", "get", r.MachineID); err != nil {
		return r, err
	}
	if seen.State != r.FinalState {
		return r, fmt.Errorf("kiln machines get %s: state %s, the API client saw %s", r.MachineID, seen.State, r.FinalState)
	}
	if !w.powerOn.IsZero() {
		r.Seconds = w.lastChange.Sub(w.powerOn).Seconds()
	}

	switch {
	case o.Release && r.FinalState == client.StateProvisioned:
		if err := checkRelease(ctx, k, w, r, o, rel, disk, stateDir, secret, say); err != nil {
			return r, err
		}
	case o.WantReason == "" && r.FinalState == client.StateProvisioned:
		if o.Firmware == "bios" {
			// The reboot's iPXE script exits to the local disk; SeaBIOS then runs
			// the image's boot sector, which prints diskMsg on the serial port.
			r.DiskBooted = waitSerial(ctx, stateDir, diskMsg, 60*time.Second)
			say("reboot: exit to local disk; boot sector ran: %v", r.DiskBooted)
		} else {
			// The lab image holds no EFI loader; what shows the exit worked
			// is OVMF moving on from the network to the disk's boot option.
			r.DiskBooted = waitSerialFor(ctx, stateDir, 90*time.Second, uefiTriedDisk)
			say("reboot: exit to local disk; OVMF went on to the disk's boot option: %v", r.DiskBooted)
		}
		stopVM(ctx, k, r.MachineID, lab)
		if o.Attest {
			b, err := os.ReadFile(disk)
			if err != nil {
				return r, err
			}
			r.JoinDataStaged = bytes.Contains(b, []byte(attestJoinData))
			say("attest: the claim's join data is on the disk: %v", r.JoinDataStaged)
		}
		if r.DiskProblem, err = checkDisk(disk, img); err != nil {
			return r, err
		}
		r.DiskImageOK = r.DiskProblem == ""
		if r.Cidata, err = readCidata(disk); err != nil {
			return r, err
		}
		say("disk: every byte as expected (image, partition table, cidata, zeros): %v %s; cidata files: %d", r.DiskImageOK, r.DiskProblem, len(r.Cidata))
	case o.WantReason != "" && r.FinalState == client.StateFailed:
		stopVM(ctx, k, r.MachineID, lab)
		r.DiskUntouched, err = allZero(disk)
		if err != nil {
			return r, err
		}
		say("disk: untouched (all zeros): %v", r.DiskUntouched)
	}
	return r, nil
}

func preflight(o Options) error {
	if os.Geteuid() != 0 {
		return labnet.ErrNotRoot
	}
	need := []string{"ip", "qemu-system-x86_64", "mkfs.ext4", "sfdisk", "mcopy", "radvd"}
	if o.BMC == "ipmi" {
		need = append(need, "ipmi_sim", "ipmitool")
	}
	for _, b := range need {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s not found: run deploy/scripts/install-deps.sh", b)
		}
	}
	for _, f := range []string{filepath.Join(o.Root, "bin/kiln"), filepath.Join(o.Root, "bin/vbmc"),
		filepath.Join(envDir(o), "vmlinuz"), filepath.Join(envDir(o), "initramfs")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s missing: run make build env (or make e2e)", f)
		}
	}
	if o.Firmware == "uefi" {
		for _, f := range []string{ovmfCode, ovmfVars} {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("%s missing: apt-get install ovmf", f)
			}
		}
	}
	return nil
}

// envDir is the in-RAM environment Kiln serves: $KILN_ENV_DIR when set
// (a worktree using a shared build), else the repository's build/env.
func envDir(o Options) string {
	if d := os.Getenv("KILN_ENV_DIR"); d != "" {
		return d
	}
	return filepath.Join(o.Root, "build/env")
}

// bootSector is x86 real-mode code for the image's MBR: it writes diskMsg to
// COM1 (I/O port 0x3F8) and halts, so a disk boot is visible on the serial log.
func bootSector() []byte {
	code := []byte{
		0x31, 0xC0, // xor ax,ax
		0x8E, 0xD8, // mov ds,ax
		0xFC,             // cld
		0xBE, 0x17, 0x7C, // mov si,0x7C17 (message)
		0xBA, 0xF8, 0x03, // mov dx,0x3F8
		0xAC,       // 0x0B: lodsb
		0x84, 0xC0, // test al,al
		0x74, 0x03, // jz 0x13
		0xEE,       // out dx,al
		0xEB, 0xF8, // jmp 0x0B
		0xFA,       // 0x13: cli
		0xF4,       // hlt
		0xEB, 0xFC, // jmp 0x13
	}
	return append(code, []byte(diskMsg+"\r\n\x00")...)
}

func buildImage(o Options) (labimage.Image, error) {
	img, err := labimage.Build(o.Work, "lab", o.ImageMiB, "provisioned-by-kiln")
	if err != nil {
		return img, err
	}
	f, err := os.OpenFile(img.Path, os.O_WRONLY, 0)
	if err != nil {
		return img, err
	}
	_, err = f.WriteAt(bootSector(), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return img, err
	}
	img.SHA256, img.Size, err = labimage.HashFile(img.Path, -1)
	return img, err
}

// kiln is the running appliance: api reaches its REST API inside the
// server namespace; cli runs its CLI there.
type kiln struct {
	lab     *labnet.Lab
	root    string
	data    string
	logPath string
	api     *client.Client
	url     string       // apiURL
	token   string       // the admin token
	hc      *http.Client // dials inside the server namespace
}

// apiURL is where the lab's Kiln serves its API, inside the server namespace.
const apiURL = "http://127.0.0.1:7480"

func startKiln(ctx context.Context, o Options, lab *labnet.Lab) (*kiln, error) {
	data := filepath.Join(o.Work, "kiln-data")
	_ = os.RemoveAll(data)
	cfg := fmt.Sprintf(`node_id: kiln-lab
data_dir: %s
api:
  addr: 127.0.0.1:7480
raft:
  addr: 127.0.0.1:7481
  forward_addr: 127.0.0.1:7482
  bootstrap: true
boot:
  interface: %s
  server_ip: %s
  http_addr: %s:8080
  env_dir: %s
  image_dir: %s
  kernel_args: ["console=ttyS0,115200"]
  dhcp:
    enabled: true
    mode: authoritative
    subnets:
      - cidr: 10.99.0.0/24
        pool_start: 10.99.0.100
        pool_end: 10.99.0.199
        lease_time: 1h
bmc:
  timeout: 20s
  retries: 2
  ipmi_cipher_suite: "3"
  ipmi_ignore_valid_bit: true
lifecycle:
  step_timeout: 10m
  agent_poll_after: 1s
`+o.ExtraConfig, data, labnet.ServerIf, labnet.ServerIP, labnet.ServerIP, envDir(o), filepath.Join(o.Work, "images"))
	cfgPath := filepath.Join(o.Work, "kiln.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	k := &kiln{lab: lab, root: o.Root, data: data, logPath: filepath.Join(o.Work, "kiln.log")}
	logf, err := os.Create(k.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", lab.Srv, filepath.Join(o.Root, "bin/kiln"), "serve", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	hc := nsHTTPClient(lab.Srv)
	anon, err := client.New(client.Config{Server: apiURL, HTTPClient: hc})
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := anon.Ready(rctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kiln did not become ready in 30 s (see %s): %w", k.logPath, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(data, "admin.token"))
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	k.url, k.token, k.hc = apiURL, strings.TrimSpace(string(tok)), hc
	if k.api, err = client.New(client.Config{Server: apiURL, Token: k.token, HTTPClient: hc}); err != nil {
		return nil, err
	}
	if _, err := k.api.SiteStatus(ctx); err != nil {
		return nil, fmt.Errorf("site status with the admin token: %w", err)
	}
	return k, nil
}

// uploadImage streams the lab image to Kiln, which checks it against its
// SHA-256 as it stores it.
func uploadImage(ctx context.Context, c *client.Client, img labimage.Image) (api.Image, error) {
	f, err := os.Open(img.Path)
	if err != nil {
		return api.Image{}, err
	}
	defer f.Close()
	im, err := c.UploadImage(ctx, client.ImageMeta{Name: "lab-image", Version: "1", SHA256: img.SHA256,
		Source: filepath.Base(img.Path)}, f, img.Size)
	if err != nil {
		return api.Image{}, fmt.Errorf("image upload: %w", err)
	}
	return im, nil
}

// cli runs bin/kiln inside the server namespace, where the API listens on
// 127.0.0.1, with the admin token of this run.
func (k *kiln) cli(ctx context.Context, args ...string) ([]byte, error) {
	cmd := k.lab.Command(ctx, k.lab.Srv, filepath.Join(k.root, "bin/kiln"), args...)
	cmd.Env = append(os.Environ(), "KILN_SERVER="+apiURL, "KILN_TOKEN_FILE="+filepath.Join(k.data, "admin.token"), "KILN_TOKEN=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kiln %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

func (k *kiln) cliJSON(ctx context.Context, v any, args ...string) error {
	out, err := k.cli(ctx, append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("kiln %s: decoding output: %v", strings.Join(args, " "), err)
	}
	return nil
}

// watcher prints the machine's events as they come and tracks its state.
type watcher struct {
	k          *kiln
	o          Options
	id         string
	stateDir   string
	say        func(string, ...any)
	after      uint64
	last       api.Machine
	powerOn    time.Time
	lastChange time.Time
	seen       []api.Event // every event printed, in order
}

func (w *watcher) until(ctx context.Context, done func(api.Machine) bool) error {
	for {
		if w.powerOn.IsZero() {
			// Power-on as the VM sees it: the BMC started qemu with a serial log.
			if logs, _ := filepath.Glob(filepath.Join(w.stateDir, "serial*.log")); len(logs) > 0 {
				w.powerOn = time.Now()
				w.say("  power: the BMC started the VM")
			}
		}
		// The machine first, then the events: every event up to its state is printed.
		m, err := w.k.api.GetMachine(ctx, w.id)
		if err != nil {
			return fmt.Errorf("machines get %s: %w", w.id, err)
		}
		for {
			el, err := w.k.api.Events(ctx, client.EventQuery{After: w.after, Limit: api.MaxListLimitCap})
			if err != nil {
				return fmt.Errorf("events after %d: %w", w.after, err)
			}
			for _, e := range el.Events {
				if e.Kind == "transition" && e.Subject == "machine/"+w.id {
					w.lastChange = e.Time // the leader's clock, on this host
				}
				w.print(e)
				w.seen = append(w.seen, e)
			}
			w.after = el.Next
			if len(el.Events) < api.MaxListLimitCap {
				break
			}
		}
		w.last = m
		if done(m) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("machine %s stuck in %s (%s): %w", w.id, m.State, m.Reason, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *watcher) print(e api.Event) {
	var b strings.Builder
	fmt.Fprintf(&b, "  event %-5d %-10s %-22s", e.Index, e.Kind, e.Subject)
	if e.From != "" || e.To != "" {
		fmt.Fprintf(&b, " %s→%s", e.From, e.To)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", e.Reason)
	}
	if e.Message != "" {
		msg := e.Message
		if len(msg) > 100 {
			msg = msg[:100] + "…"
		}
		fmt.Fprintf(&b, " %q", msg)
	}
	w.say("%s", b.String())
}

const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// qemuArgs is the VM: network first (bootindex 1), then its virtio disk.
func qemuArgs(o Options, disk string) []string {
	return vmArgs(o, disk, vmSpec{mac: vmMAC, uuid: vmUUID, tap: "tap0"})
}

// vmSpec is what tells one lab VM from another on a shared lab.
type vmSpec struct{ mac, uuid, tap string }

// vmArgs is qemuArgs for the VM v.
func vmArgs(o Options, disk string, v vmSpec) []string {
	mem := o.MemMiB
	if mem == 0 {
		mem = 512
	}
	args := []string{"qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", strconv.Itoa(mem), "-smp", "1", "-uuid", v.uuid,
		"-nodefaults", "-nographic", "-monitor", "none"}
	if o.Firmware == "uefi" {
		vars := filepath.Join(o.Work, "OVMF_VARS.fd")
		// The VM network-boots through its NIC's option ROM (qemu's
		// efi-virtio.rom, an iPXE). OVMF's own PXE and HTTP boot options
		// are off (RUNTIME_CONFIG.md of edk2's OvmfPkg: IPv4Support,
		// IPv6Support), as a site turns off the firmware's network stack
		// when the NIC's ROM boots: OVMF's PXE would chainload ipxe.efi,
		// whose exit returns EFI_SUCCESS, and the boot manager answers that
		// with its menu (UEFI 2.x §3.1.1) instead of the disk; the ROM's
		// iPXE returns an error, and OVMF goes on to the disk.
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars,
			"-fw_cfg", "name=opt/org.tianocore/IPv4Support,string=no",
			"-fw_cfg", "name=opt/org.tianocore/IPv6Support,string=no")
	} else {
		args = append(args, "-machine", "pc")
	}
	return append(args,
		"-netdev", "tap,id=n0,ifname="+v.tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+v.mac+",bootindex=1",
		"-drive", "file="+disk+",format=raw,if=none,id=d0,cache=writeback",
		"-device", "virtio-blk-pci,drive=d0,bootindex=2")
}

func startBMC(ctx context.Context, o Options, lab *labnet.Lab, disk string) (addr, driver, stateDir string, err error) {
	stateDir = filepath.Join(o.Work, "bmc")
	_ = os.RemoveAll(stateDir)
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return "", "", "", err
	}
	if o.Firmware == "uefi" {
		b, err := os.ReadFile(ovmfVars)
		if err != nil {
			return "", "", "", err
		}
		if err := os.WriteFile(filepath.Join(o.Work, "OVMF_VARS.fd"), b, 0o644); err != nil {
			return "", "", "", err
		}
	}
	args := append(qemuArgs(o, disk), o.qemuExtra...)
	switch o.BMC {
	case "ipmi":
		// Left running: the lab's teardown ends it with everything in the
		// namespace (and the demo keeps it up).
		if _, err := ipmilab.Start(ctx, ipmilab.Options{NetNS: lab.LAN, ProbeNetNS: lab.Srv, Name: "kiln-lab-bmc",
			Addr: labnet.BMCAddr, User: bmcUser, Password: bmcPass, StateDir: stateDir,
			LabDir: filepath.Join(o.Root, "deploy/lab/ipmi"), QEMUArgs: args}); err != nil {
			return "", "", "", err
		}
		return labnet.BMCAddr, "ipmi", stateDir, nil
	case "redfish":
		listen := labnet.BMCAddr + ":8443"
		if err := startVBMC(ctx, o, lab, stateDir, listen, args, vmMAC, vmUUID); err != nil {
			return "", "", "", err
		}
		return listen, "redfish", stateDir, nil
	}
	return "", "", "", fmt.Errorf("unknown BMC kind %q (ipmi or redfish)", o.BMC)
}

// startVBMC runs the virtual Redfish BMC of one VM (qemu command line args)
// in the LAN namespace on listen, its state (QMP socket, serial logs,
// vbmc.log) in stateDir, and waits until it answers from the server
// namespace.
func startVBMC(ctx context.Context, o Options, lab *labnet.Lab, stateDir, listen string, args []string, mac, uuid string) error {
	if err := os.WriteFile(filepath.Join(stateDir, "qemu.args"), []byte(strings.Join(args, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	pw := filepath.Join(stateDir, "pw")
	if err := os.WriteFile(pw, []byte(bmcPass), 0o600); err != nil {
		return err
	}
	mode := "Legacy"
	if o.Firmware == "uefi" {
		mode = "UEFI"
	}
	logf, err := os.Create(filepath.Join(stateDir, "vbmc.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", lab.LAN, filepath.Join(o.Root, "bin/vbmc"), "--listen", listen,
		"--user", bmcUser, "--password-file", pw, "--qemu-args-file", filepath.Join(stateDir, "qemu.args"),
		"--state-dir", stateDir, "--mode", mode, "--uuid", uuid, "--mac", mac)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	for i := 0; i < 50; i++ {
		probe := exec.CommandContext(ctx, "ip", "netns", "exec", lab.Srv, "curl", "-ksf", "-o", "/dev/null", "https://"+listen+"/redfish/v1/")
		if probe.Run() == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("vbmc did not answer on %s (see %s)", listen, filepath.Join(stateDir, "vbmc.log"))
}

// startRadvd answers IPv6 router solicitations on the provisioning network,
// as a site's routers do. Without any router advertisement iPXE waits ~12 s
// for IPv6 autoconfiguration on every boot (top-level DESIGN.md "The lab"). The RA carries
// no default route and only a lab-local ULA prefix.
func startRadvd(o Options, lab *labnet.Lab) error {
	conf := filepath.Join(o.Work, "radvd.conf")
	body := "interface " + labnet.ServerIf + ` {
  AdvSendAdvert on;
  MinRtrAdvInterval 3;
  MaxRtrAdvInterval 10;
  AdvDefaultLifetime 0;
  prefix fd99:0:0:99::/64 { AdvOnLink on; AdvAutonomous on; };
};
`
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("ip", "netns", "exec", lab.Srv, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		return fmt.Errorf("sysctl in %s: %v: %s", lab.Srv, err, out)
	}
	logf, err := os.Create(filepath.Join(o.Work, "radvd.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", lab.Srv, "radvd", "-n", "-C", conf, "-p", filepath.Join(o.Work, "radvd.pid"), "-m", "stderr")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("radvd: %w", err)
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	return nil
}

// stopVM powers the machine off (SIGKILL of qemu through the namespace
// teardown would also do, but the disk must be settled before it is read).
func stopVM(ctx context.Context, k *kiln, id string, lab *labnet.Lab) {
	out, _ := exec.Command("ip", "netns", "pids", lab.LAN).Output()
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.HasPrefix(cmdline, []byte("qemu-system")) {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
}

func waitSerial(ctx context.Context, dir, marker string, d time.Duration) bool {
	return waitSerialFor(ctx, dir, d, func(b []byte) bool { return bytes.Contains(b, []byte(marker)) })
}

// waitSerialFor waits up to d for one of dir's serial logs to satisfy ok.
func waitSerialFor(ctx context.Context, dir string, d time.Duration, ok func([]byte) bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		logs, _ := filepath.Glob(filepath.Join(dir, "serial*.log"))
		for _, l := range logs {
			if b, err := os.ReadFile(l); err == nil && ok(b) {
				return true
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false
}

// localScriptMsg is what Kiln's exit-to-disk iPXE script prints
// (httpboot.LocalScript).
const localScriptMsg = "from local disk"

// afterLastScript is the serial console b from the last exit-to-disk
// script on, when iPXE did not stay (no iPXE shell prompt after it): what
// the firmware did next. ok is false without a script or with a prompt.
func afterLastScript(b []byte) (rest string, ok bool) {
	s := string(b)
	i := strings.LastIndex(s, localScriptMsg)
	if i < 0 || strings.Contains(s[i:], "iPXE>") {
		return "", false
	}
	return s[i:], true
}

// uefiTriedDisk reports whether OVMF, after the last exit-to-disk script
// on the serial console b, went on to a boot option that is not a network
// one: its BdsDxe prints `BdsDxe: loading Boot#### "<description>" from
// <device path>`, a network option's device path holds MAC(...), and a
// firmware application's (UiApp, the boot manager menu OVMF shows when a
// boot option returned EFI_SUCCESS; the shell) starts with Fv(...).
func uefiTriedDisk(b []byte) bool {
	rest, ok := afterLastScript(b)
	if !ok {
		return false
	}
	for _, line := range strings.Split(rest, "\n") {
		if j := strings.Index(line, "BdsDxe: loading Boot"); j >= 0 && !strings.Contains(line[j:], "MAC(") && !strings.Contains(line[j:], " from Fv(") {
			return true
		}
	}
	return false
}

// uefiReturnedToFirmware reports whether, after the last exit-to-disk
// script on the serial console b, iPXE gave control back to OVMF (a BdsDxe
// line follows). It is what the HA run can require: there the firmware's
// next option may be another network boot that gets no DHCP offer while
// the cluster has no leader that can commit a lease, and OVMF reaches the
// disk only after that option's timeout.
func uefiReturnedToFirmware(b []byte) bool {
	rest, ok := afterLastScript(b)
	return ok && strings.Contains(rest, "BdsDxe: ")
}

// Expected layout of the disk after a build with stage, from the agent's
// specification (cmd/kiln-agent/agent doc.go "stage" and parttable.go "MBR"),
// not from the disk: the cidata partition starts at the image's end rounded up
// to stageAlign, is agent.DefaultStageSize bytes long, and takes the first free
// MBR slot as type 0x0C (FAT32 LBA) with LBA-only CHS FE FF FF (UEFI 2.10
// §5.2.1 legacy MBR: 16-byte entries at offset 446, signature 0x55 0xAA at 510).
const (
	stageAlign   = 1 << 20 // bytes
	sectorSize   = 512     // the VM's virtio disk: 512-byte logical blocks
	mbrEntries   = 446     // offset of the four 16-byte partition entries
	mbrCidataTyp = 0x0C
)

// expectedMBR is sector 0 of the disk as the stage step must leave it: the
// image's boot code, disk signature and partition entry 1 unchanged; entry 2
// the cidata partition at start (bytes) of size (bytes); entries 3 and 4
// zero; the 0x55AA signature. It fails when the image itself does not have
// that shape (one partition in entry 1 ending at or before start), since
// then the expectation would not be the one the agent is specified to meet.
func expectedMBR(imgSec0 []byte, start, size int64) ([]byte, error) {
	if len(imgSec0) != sectorSize || imgSec0[510] != 0x55 || imgSec0[511] != 0xAA {
		return nil, errors.New("lab image: sector 0 is not an MBR")
	}
	e1 := imgSec0[mbrEntries : mbrEntries+16]
	if e1[4] == 0 || !bytes.Equal(imgSec0[mbrEntries+16:510], make([]byte, 510-mbrEntries-16)) {
		return nil, errors.New("lab image: want exactly one partition, in MBR entry 1")
	}
	if end := int64(binary.LittleEndian.Uint32(e1[8:])+binary.LittleEndian.Uint32(e1[12:])) * sectorSize; end > start {
		return nil, fmt.Errorf("lab image: partition 1 ends at %d, after the expected cidata start %d", end, start)
	}
	want := make([]byte, sectorSize)
	copy(want, imgSec0[:mbrEntries+16]) // boot code, disk signature, entry 1
	e2 := want[mbrEntries+16 : mbrEntries+32]
	e2[0] = 0x00 // not bootable
	copy(e2[1:4], []byte{0xFE, 0xFF, 0xFF})
	e2[4] = mbrCidataTyp
	copy(e2[5:8], []byte{0xFE, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(e2[8:], uint32(start/sectorSize))
	binary.LittleEndian.PutUint32(e2[12:], uint32(size/sectorSize))
	want[510], want[511] = 0x55, 0xAA
	return want, nil
}

// checkDisk reads the whole disk after a successful build and compares every
// byte with what is expected, computed from the image and the specification
// only (nothing of the disk is copied into the expectation):
//
//	sector 0                 expectedMBR (image's entry 1, the cidata entry 2, zero 3 and 4, 0x55AA)
//	512 … image end          the image's bytes
//	image end … cidata start zero
//	cidata partition         a FAT16 volume: boot signature 0x55AA, label "CIDATA", hidden
//	                         sectors = its start LBA (its files are read by readCidata)
//	cidata end … disk end    zero
//
// It returns "" when all hold, else the first difference found.
func checkDisk(disk string, img labimage.Image) (string, error) {
	d, err := os.ReadFile(disk)
	if err != nil {
		return "", err
	}
	im, err := os.ReadFile(img.Path)
	if err != nil {
		return "", err
	}
	if int64(len(im)) != img.Size || len(im) < sectorSize {
		return "", fmt.Errorf("lab image %s: %d bytes, want %d", img.Path, len(im), img.Size)
	}
	start := (img.Size + stageAlign - 1) / stageAlign * stageAlign
	size := int64(agent.DefaultStageSize)
	end := start + size
	if int64(len(d)) < end {
		return fmt.Sprintf("disk is %d bytes, shorter than the cidata partition's end %d", len(d), end), nil
	}
	want, err := expectedMBR(im[:sectorSize], start, size)
	if err != nil {
		return "", err
	}
	if i := firstDiff(d[:sectorSize], want); i >= 0 {
		return fmt.Sprintf("sector 0 byte %d (%s) is %#02x, want %#02x", i, mbrField(i), d[i], want[i]), nil
	}
	if i := firstDiff(d[sectorSize:img.Size], im[sectorSize:]); i >= 0 {
		off := sectorSize + i
		return fmt.Sprintf("image byte %d is %#02x, want %#02x", off, d[off], im[off]), nil
	}
	if i := firstNonZero(d[img.Size:start]); i >= 0 {
		return fmt.Sprintf("byte %d between the image's end and the cidata partition is %#02x, want 0", img.Size+int64(i), d[img.Size+int64(i)]), nil
	}
	// FAT boot sector (Microsoft FAT specification §3.1/§3.2, FAT16 extended BPB).
	bs := d[start : start+sectorSize]
	switch {
	case bs[510] != 0x55 || bs[511] != 0xAA:
		return "cidata partition: no boot sector signature 0x55AA", nil
	case string(bs[43:54]) != "CIDATA     ":
		return fmt.Sprintf("cidata partition: volume label %q, want \"CIDATA\"", bs[43:54]), nil
	case string(bs[54:62]) != "FAT16   ":
		return fmt.Sprintf("cidata partition: file system type %q, want \"FAT16\"", bs[54:62]), nil
	case int64(binary.LittleEndian.Uint32(bs[28:])) != start/sectorSize:
		return fmt.Sprintf("cidata partition: BPB_HiddSec %d, want %d", binary.LittleEndian.Uint32(bs[28:]), start/sectorSize), nil
	}
	if i := firstNonZero(d[end:]); i >= 0 {
		return fmt.Sprintf("byte %d after the cidata partition is %#02x, want 0", end+int64(i), d[end+int64(i)]), nil
	}
	return "", nil
}

// mbrField names the MBR field holding byte i of sector 0.
func mbrField(i int) string {
	switch {
	case i < mbrEntries:
		return "boot code / disk signature"
	case i < 510:
		return fmt.Sprintf("partition entry %d byte %d", (i-mbrEntries)/16+1, (i-mbrEntries)%16)
	default:
		return "signature"
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}

func allZero(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		for _, c := range buf[:n] {
			if c != 0 {
				return false, nil
			}
		}
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// readCidata finds the partition labelled CIDATA that stage appended (sfdisk
// JSON for its offset) and copies its files out with mtools.
func readCidata(disk string) (map[string]string, error) {
	out, err := exec.Command("sfdisk", "-J", disk).Output()
	if err != nil {
		return nil, fmt.Errorf("sfdisk -J %s: %w", disk, err)
	}
	var pt struct {
		PartitionTable struct {
			Partitions []struct {
				Start int64 `json:"start"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &pt); err != nil {
		return nil, err
	}
	for _, p := range pt.PartitionTable.Partitions[1:] {
		img := fmt.Sprintf("%s@@%d", disk, p.Start*512)
		files := map[string]string{}
		for _, name := range []string{"meta-data", "user-data", "network-config"} {
			b, err := exec.Command("mtype", "-i", img, "::"+name).Output()
			if err == nil {
				files[name] = string(b)
			}
		}
		if len(files) > 0 {
			return files, nil
		}
	}
	return nil, errors.New("no cidata partition with NoCloud files found on the disk")
}
