package lifecycle

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/qemuvm"
	"kiln/deploy/lab/swtpm"
	"kiln/deploy/lab/testreq"
	"kiln/store"
)

// agentMux serves the agent protocol straight from controller c (the
// in-process Kiln of the VM test: the real controller, store and
// verifier; package api's token checks are its own tests' business) and
// the image files of images.
func agentMux(t *testing.T, c *Controller, images map[string][]byte) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			t.Logf("agent API: %v", err)
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		if v == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	id := func(r *http.Request) string { return r.Header.Get(agentapi.HeaderMachine) }
	mux.HandleFunc("POST /v1/agent/register", func(w http.ResponseWriter, r *http.Request) {
		var reg agentapi.Registration
		_ = json.NewDecoder(r.Body).Decode(&reg)
		task, err := c.AgentRegister(r.Context(), id(r), reg)
		reply(w, task, err)
	})
	mux.HandleFunc("GET /v1/agent/task", func(w http.ResponseWriter, r *http.Request) {
		task, err := c.AgentTask(r.Context(), id(r))
		reply(w, task, err)
	})
	mux.HandleFunc("POST /v1/agent/report", func(w http.ResponseWriter, r *http.Request) {
		var rep agentapi.Report
		_ = json.NewDecoder(r.Body).Decode(&rep)
		reply(w, nil, c.AgentReport(r.Context(), id(r), rep))
	})
	mux.HandleFunc("POST /v1/agent/attest/start", func(w http.ResponseWriter, r *http.Request) {
		var st agentapi.AttestStart
		_ = json.NewDecoder(r.Body).Decode(&st)
		ch, err := c.AttestStart(r.Context(), id(r), st)
		reply(w, ch, err)
	})
	mux.HandleFunc("POST /v1/agent/attest/quote", func(w http.ResponseWriter, r *http.Request) {
		var q agentapi.AttestQuote
		_ = json.NewDecoder(r.Body).Decode(&q)
		res, err := c.AttestQuote(r.Context(), id(r), q)
		reply(w, res, err)
	})
	mux.HandleFunc("GET /images/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := images[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	})
	return mux
}

// TestAttestVM (issue 16): the in-RAM environment under OVMF with a
// software TPM (swtpm) attests against an in-process Kiln. Boot 1: the
// reference machine is refused (no approved state), its measured boot is
// learned and approved, and the same agent, served the build again, passes
// and writes. Boot 2, the same machine with an extra kernel argument, is
// quarantined (attestation_failed) naming PCR 9's kernel command line.
func TestAttestVM(t *testing.T) {
	testreq.Commands(t, "qemu-system-x86_64", "swtpm", "swtpm_setup")
	kernel, initrd := testreq.Env(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	guest := "http://10.0.2.2:" + port
	h := newHarness(t, newStore(t), func(c *Config) {
		c.ImageBaseURL = guest
		c.AgentPollAfter = 500 * time.Millisecond
		c.Attest.Default = AttestPolicy{Require: true}
		c.Now = nil // the real clock: the agent's reports and the challenge's life run on it
	})
	// A 1 MiB MBR disk image with one Linux partition (the stage step
	// appends its cidata partition to the table).
	img := make([]byte, 1<<20)
	copy(img[512:], "kiln attest vm image")
	img[446+4] = 0x83
	binary.LittleEndian.PutUint32(img[446+8:], 1)
	binary.LittleEndian.PutUint32(img[446+12:], 2047)
	img[510], img[511] = 0x55, 0xAA
	sum := sha256.Sum256(img)
	images := map[string][]byte{"att.raw": img}
	srv := &http.Server{Handler: agentMux(t, h.c, images), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	im, err := h.st.PutImage(bg, store.Image{Name: "att.raw", Version: "1", Format: "raw", SHA256: hex.EncodeToString(sum[:]), Size: uint64(len(img))}, store.W{Actor: "test"})
	must(t, err)
	const mac = "52:54:00:12:34:56" // qemu's default virtio-net MAC
	m, err := h.st.PutMachine(bg, store.Machine{Name: "att-vm", Intended: store.Hardware{NICs: []store.NIC{{Name: "eth0", MAC: mac}}},
		RootDisk: store.DiskRule{Serial: "KILNVM01"}}, store.W{Actor: "test"})
	must(t, err)
	disk := filepath.Join(dir, "disk.raw")
	must(t, os.WriteFile(disk, nil, 0o644))
	must(t, os.Truncate(disk, 64<<20))
	tpmDir := filepath.Join(dir, "tpm")
	cmdline := func(token string) string {
		return "console=ttyS0,115200 quiet " + agentapi.ArgURL + "=" + guest + " " + agentapi.ArgMachine + "=" + m.ID + " " + agentapi.ArgToken + "=" + token
	}

	var tpm *swtpm.QEMU
	boot := func(name, cmdline string) *qemuvm.VM {
		if tpm != nil {
			tpm.Close() // the same TPM state, a new swtpm (one process holds its lock)
		}
		tpm, err = swtpm.StartQEMU(tpmDir)
		must(t, err)
		t.Cleanup(func() { tpm.Close() })
		args := append([]string{"-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "768", "-smp", "2", "-nodefaults", "-nographic",
			"-monitor", "none", "-no-reboot", "-kernel", kernel, "-initrd", initrd, "-append", cmdline,
			"-drive", "file=" + disk + ",format=raw,if=none,id=d0,cache=unsafe", "-device", "virtio-blk-pci,drive=d0,serial=KILNVM01",
			"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,mac=" + mac},
			qemuvm.OVMF(t, filepath.Join(dir, name+"-vars.fd"))...)
		args = append(args, tpm.Args...)
		return qemuvm.StartHost(t, filepath.Join(dir, name+"-serial.log"), args...)
	}
	wait := func(vm *qemuvm.VM, what string, d time.Duration, ok func(store.Machine) bool) store.Machine {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			cur := h.get(m.ID)
			if ok(cur) {
				return cur
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(vm.Serial)
				t.Fatalf("%s: machine %s %s %q step %+v\nserial:\n%s\nqemu: %s", what, cur.State, cur.Reason, cur.Message, cur.Step,
					qemuvm.Tail(b, 3000), vm.Output())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	claim := func(vm *qemuvm.VM) {
		wait(vm, "available", 180*time.Second, func(x store.Machine) bool { return x.State == store.StateAvailable })
		_, err := h.c.Provision(bg, m.ID, store.Claim{Image: im.ID, JoinData: "kubeadm join SECRET", CABundle: "CA"}, store.W{Actor: "test"})
		must(t, err)
	}
	// back to available with its claim (an operator's inspect and a new build, in two writes).
	reset := func() {
		cur := h.get(m.ID)
		for _, s := range []store.MachineState{store.StateFailed, store.StateInspecting, store.StateAvailable} {
			if !store.CanTransition(cur.State, s) {
				continue
			}
			cur.State, cur.Reason, cur.Step = s, "test_reset", nil
			cur, err = h.st.PutMachine(bg, cur, store.W{Actor: "test", Reason: "test_reset"})
			must(t, err)
		}
	}

	t0 := time.Now()
	vm := boot("boot1", cmdline("boot-one-token"))
	claim(vm)
	ref := wait(vm, "reference refused", 120*time.Second, func(x store.Machine) bool { return x.State == store.StateQuarantined })
	if ref.Reason != ReasonAttestationFailed || ref.Attestation == nil || ref.Attestation.Reason != store.AttestReasonNoApprovedState {
		t.Fatalf("reference: %s %q %+v", ref.Reason, ref.Message, ref.Attestation)
	}
	t.Logf("boot 1 attested (refused: no approved state) %v after power-on; TPM %s, EK issuer %s, %d events", time.Since(t0).Round(time.Second),
		ref.Attestation.TPM, ref.Attestation.EKIssuer, len(ref.Attestation.Events))
	masked := ""
	for _, e := range ref.Attestation.Events {
		t.Logf("  PCR %d #%d %s %s %q %q", e.PCR, e.Seq, e.Type, short(e.Digest), e.Data, e.Text)
		if e.Text != "" {
			masked = e.Text
		}
	}
	if masked == "" || strings.Contains(masked, "boot-one-token") {
		t.Fatalf("the kernel command line was not read from PCR 9 (masked %q)", masked)
	}
	st, err := h.c.LearnAttestState(bg, m.ID, "ovmf lab", true, "token:admin")
	must(t, err)
	reset()
	passed := wait(vm, "pass", 60*time.Second, func(x store.Machine) bool {
		return x.Attestation != nil && x.Attestation.Result == store.AttestResultPassed && x.Step != nil &&
			buildIndex(x.Step.Step) > buildIndex(agentapi.StepAttest)
	})
	if passed.Attestation.State != st.ID || passed.Labels[LabelAttestation] != "passed" {
		t.Fatalf("pass: %+v labels %v", passed.Attestation, passed.Labels)
	}
	var started, done time.Time
	for _, ev := range allEvents(t, h.st.(*store.Store)) {
		if ev.Subject == "machine/"+m.ID && ev.Kind == "step" && strings.HasPrefix(ev.Message, agentapi.StepAttest) {
			switch ev.To {
			case string(agentapi.StateStarted):
				started = ev.Time
			case string(agentapi.StateSucceeded):
				done = ev.Time
				t.Logf("attest step: %s", ev.Message)
			}
		}
	}
	t.Logf("attest step took %v (started→succeeded, Kiln's clock)", done.Sub(started).Round(time.Millisecond))

	// The pass released the credentials: the build staged them on the disk.
	wait(vm, "build complete", 60*time.Second, func(x store.Machine) bool { return x.Reason == ReasonBuildComplete })
	if b, _ := os.ReadFile(disk); !bytes.Contains(b, []byte("kubeadm join SECRET")) {
		t.Fatal("the passing build's disk holds no join data")
	}

	// Boot 2: another boot token (masked) and one more kernel argument
	// (named), on a new disk: refused before write, it holds no credentials.
	vm.Kill()
	reset()
	must(t, os.Truncate(disk, 0))
	must(t, os.Truncate(disk, 64<<20))
	vm = boot("boot2", cmdline("boot-two-token")+" kiln.extra=1")
	bad := wait(vm, "changed chain refused", 180*time.Second, func(x store.Machine) bool {
		return x.State == store.StateQuarantined && x.Attestation != nil && x.Attestation.Reason == store.AttestReasonStateMismatch
	})
	if !strings.Contains(bad.Message, "PCR 9") || !strings.Contains(bad.Message, "arguments +kiln.extra=1;") || bad.Reason != ReasonAttestationFailed {
		t.Fatalf("changed chain: %s %q", bad.Reason, bad.Message)
	}
	for _, mm := range bad.Attestation.Mismatches {
		if mm.PCR != 9 {
			t.Fatalf("a measurement other than PCR 9 differs: %+v", bad.Attestation.Mismatches)
		}
	}
	t.Logf("boot 2 quarantined: %s", bad.Message)
	if b, _ := os.ReadFile(disk); bytes.Contains(b, []byte("SECRET")) || bytes.Contains(b, []byte("CA")) && bytes.Contains(b, []byte("kubeadm")) {
		t.Fatal("the refused machine's disk holds credentials")
	}
	t.Logf("TestAttestVM total %v", time.Since(t0).Round(time.Second))
}
