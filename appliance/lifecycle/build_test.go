package lifecycle

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// A random-looking 32-hex-digit token (128 bits estimated) and a weak one.
const (
	strongToken = "9f86d081884c7d659a2feaa0c55ad015"
	weakToken   = "abcdabcdabcdabcd"
)

// syncBuf is a log sink safe for the controller's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// captureLog sends h's controller log (every level) to the returned buffer.
func captureLog(h *harness) *syncBuf {
	buf := &syncBuf{}
	h.c.log.Store(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return buf
}

func testCA(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	must(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func fingerprint(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// releaseBuild walks plan machine a through inspection (with inv's PCI
// and CPU flags) and a claim of a release with every layer and cluster
// block cl, to the served provision task.
func releaseBuild(t *testing.T, h *harness, a store.Machine, inv agentapi.Inventory, cl *store.ClusterSpec) (store.Image, agentapi.Task) {
	t.Helper()
	rel := h.release("os-"+a.ID, map[string]string{"control-plane": store.LayerControlPlane, "gpu": store.LayerNvidiaGPU,
		"secure-runtime": store.LayerVirt})
	_, err := h.c.AgentRegister(bg, a.ID, agentapi.Registration{Inventory: inv})
	must(t, err)
	h.mustState(a.ID, store.StateAvailable)
	_, err = h.c.Provision(bg, a.ID, store.Claim{Image: rel.ID, Hostname: "node-" + a.ID[len(a.ID)-4:], CABundle: testCA(t), Cluster: cl}, store.W{Actor: "alice"})
	must(t, err)
	task, err := h.c.AgentTask(bg, a.ID)
	must(t, err)
	return rel, task
}

// finishBuild reports the gated build's steps as an agent that wrote and
// read back every layer of task.
func finishBuild(t *testing.T, h *harness, id string, task agentapi.Task, nodeSHA, fp string) {
	t.Helper()
	for _, st := range []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify, agentapi.StepStage} {
		must(t, h.c.AgentReport(bg, id, agentapi.Report{Step: st, State: agentapi.StateStarted, Attempt: task.Attempt}))
		must(t, h.c.AgentReport(bg, id, agentapi.Report{Step: st, State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	}
	br := &agentapi.BuildReport{NodeLayerSHA256: nodeSHA, SSHHostKeyFingerprint: fp}
	var start uint64
	for _, l := range task.Layers {
		br.Layers = append(br.Layers, agentapi.LayerWritten{Name: l.Name, SHA256: l.SHA256, Start: start, Size: l.Size})
		start += l.Size
	}
	must(t, h.c.AgentReport(bg, id, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Attempt: task.Attempt, Build: br}))
}

// The release build end to end over the real store: layers chosen by
// hardware and role (with reasons, recorded), the per-node layer, the
// sealed cluster token only in the gated credentials, the written digests
// recorded from finalize, the disk boot that does not make the machine
// provisioned, and provisioned from the first-boot report.
func TestReleaseBuildFirstBoot(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	logs := captureLog(h)
	a := importPlan(t, h)[0]
	inv := inventory(a)
	inv.PCI = []agentapi.PCIDevice{{Address: "0000:01:00.0", VendorID: 0x10de, DeviceID: 0x2204, Class: 0x030000}}
	inv.CPUFlags = []string{"fpu", "sse2"}
	inv.TPM = &agentapi.TPMInfo{Version: "2.0", Manufacturer: "IBM"}
	rel, task := releaseBuild(t, h, a, inv, &store.ClusterSpec{Role: "control-plane", ControlPlaneHost: "10.0.0.5",
		KubernetesVersion: "v1.31.2", Token: strongToken})

	m := h.mustState(a.ID, store.StateProvisioning)
	if d := m.Discovered; d == nil || len(d.PCI) != 1 || d.PCI[0].VendorID != 0x10de || d.TPM == nil || d.TPM.Version != "2.0" || len(d.CPUFlags) != 2 {
		t.Fatalf("inspection fields not stored: %+v", m.Discovered)
	}
	cc := m.Claim.Cluster
	if cc == nil || cc.ControlPlaneHost != "10.0.0.5:6443" || cc.TokenRef == "" || cc.Token != "" || cc.TokenWeak {
		t.Fatalf("stored cluster block %+v", cc)
	}
	var names []string
	for _, l := range task.Layers {
		names = append(names, l.Name)
		if l.Reason == "" || !strings.HasPrefix(l.URL, "http://10.99.0.1:8080/images/") || len(l.SHA256) != 64 {
			t.Fatalf("task layer %+v", l)
		}
	}
	if strings.Join(names, ",") != "base,control-plane,gpu" {
		t.Fatalf("task layers %v, want base,control-plane,gpu", names)
	}
	if task.Layers[0].PartName != "" || task.Layers[2].PartName != "kiln-layer-gpu" || task.Layers[0].VerityRootHash == "" {
		t.Fatalf("part names / verity: %+v", task.Layers)
	}
	if task.Stage != nil || task.NodeLayer == nil || len(task.NodeLayer.Files) != 3 || task.Cluster == nil ||
		task.Cluster.KubernetesVersion != "v1.31.2" || task.Cluster.ImageKubeadmVersion != "v1.31.2" {
		t.Fatalf("task: stage %v node layer %+v cluster %+v", task.Stage, task.NodeLayer, task.Cluster)
	}
	for _, f := range task.NodeLayer.Files {
		if strings.Contains(string(f.Data), strongToken) {
			t.Fatalf("the cluster token is in the non-secret node layer file %s", f.Path)
		}
	}
	b := m.Build
	if b == nil || b.Release != rel.ID || len(b.Layers) != 3 || len(b.Skipped) != 1 || b.Skipped[0].Name != "secure-runtime" ||
		!strings.Contains(b.Skipped[0].Reason, "neither vmx nor svm") || !strings.Contains(b.Layers[2].Reason, "10de:2204") ||
		len(b.FirstBootTokenHash) != 64 || b.Hostname != m.Claim.Hostname {
		t.Fatalf("build record %+v", b)
	}

	// The secret files, behind the gate.
	cr, err := h.c.AgentCredentials(bg, a.ID)
	must(t, err)
	files := map[string]agentapi.NodeFile{}
	for _, f := range cr.Files {
		files[f.Path] = f
	}
	var fb agentapi.FirstBootFile
	must(t, json.Unmarshal(files[agentapi.PathFirstBoot].Data, &fb))
	if files[agentapi.PathFirstBoot].Mode != 0o600 || fb.MachineID != a.ID || len(fb.URLs) != 1 || !h.c.VerifyFirstBootToken(a.ID, fb.Token) {
		t.Fatalf("firstboot.json %+v", fb)
	}
	kc := string(files[agentapi.PathKubeadm].Data)
	if files[agentapi.PathKubeadm].Mode != 0o600 || !strings.Contains(kc, "kind: JoinConfiguration") || !strings.Contains(kc, `token: "`+strongToken+`"`) ||
		!strings.Contains(kc, `apiServerEndpoint: "10.0.0.5:6443"`) || !strings.Contains(kc, "caCertHashes:") || !strings.Contains(kc, "controlPlane: {}") {
		t.Fatalf("kubeadm config:\n%s", kc)
	}
	// A refusing gate refuses.
	h.c.cfg.CredentialGate = func(_ context.Context, m store.Machine) error { return errors.New("no attestation of " + m.ID) }
	if _, err := h.c.AgentCredentials(bg, a.ID); !errors.Is(err, ErrCredentialsRefused) {
		t.Fatalf("gated credentials: %v", err)
	}
	h.c.cfg.CredentialGate = nil

	fp := fingerprint(a.ID)
	nodeSHA := strings.Repeat("c", 64)
	finishBuild(t, h, a.ID, task, nodeSHA, fp)
	m = h.mustState(a.ID, store.StateProvisioning)
	if m.Reason != ReasonBuildComplete || m.Build.NodeLayerSHA256 != nodeSHA || m.Build.SSHHostKeyFingerprint != fp ||
		m.Build.Layers[1].Written == nil || m.Build.Layers[1].Written.SHA256 != m.Build.Layers[1].SHA256 || m.Build.FirstBootDeadline.IsZero() {
		t.Fatalf("after finalize: %s %s %+v", m.State, m.Reason, m.Build)
	}
	// The post-build netboot boots the disk but records nothing: still provisioning.
	boot, err := h.c.BootFor(bg, a.Intended.NICs[0].MAC)
	must(t, err)
	if boot.Action != BootLocal {
		t.Fatalf("built release netboot: %+v", boot)
	}
	h.mustState(a.ID, store.StateProvisioning)
	// Past RebootTimeout (but not FirstBootTimeout): no reboot_unobserved.
	h.clk.Advance(h.c.cfg.RebootTimeout + time.Second)
	must(t, h.c.checkDeadlines(bg))
	h.mustState(a.ID, store.StateProvisioning)

	wrong := "0" + fb.Token[1:]
	if fb.Token[0] == '0' {
		wrong = "1" + fb.Token[1:]
	}
	if h.c.VerifyFirstBootToken(a.ID, wrong) || h.c.VerifyFirstBootToken(a.ID, "") {
		t.Fatal("a wrong first-boot token verified")
	}
	rep := agentapi.FirstBootReport{MachineID: a.ID, Phase: agentapi.PhaseNodeLayer, Outcome: agentapi.OutcomeSucceeded,
		Hostname: m.Claim.Hostname, SSHHostKeyFingerprint: fp, NodeLayerSHA256: nodeSHA, BootID: "b-1",
		Message: "hello\x1b[31m " + strings.Repeat("x", 400)}
	m, err = h.c.FirstBoot(bg, a.ID, rep)
	must(t, err)
	if m.State != store.StateProvisioned || m.Reason != ReasonFirstBootReported || m.Build.FirstBoot == nil || !m.Build.FirstBoot.Match ||
		len(m.Build.FirstBoot.Message) > agentapi.MaxFirstBootMessageLen || strings.Contains(m.Build.FirstBoot.Message, "\x1b") {
		t.Fatalf("after the first-boot report: %s %s %+v", m.State, m.Reason, m.Build.FirstBoot)
	}
	// The token is nowhere but in the sealed secret.
	for _, ev := range allEvents(t, h.st.(*store.Store)) {
		if strings.Contains(ev.Message, strongToken) || strings.Contains(ev.Message, fb.Token) {
			t.Fatalf("a token in event %+v", ev)
		}
	}
	raw, _ := json.Marshal(h.get(a.ID))
	if strings.Contains(string(raw), strongToken) || strings.Contains(string(raw), fb.Token) {
		t.Fatal("a token in the machine record")
	}
	if out := logs.String(); strings.Contains(out, strongToken) || strings.Contains(out, fb.Token) {
		t.Fatalf("a token in the log:\n%s", out)
	}
}

// No first-boot report by FirstBootTimeout: failed (first_boot_unreported),
// never provisioned; and a failed machine is never told to boot its disk.
func TestFirstBootUnreported(t *testing.T) {
	h := newHarness(t, newStore(t), func(c *Config) { c.FirstBootTimeout = 5 * time.Minute })
	a := importPlan(t, h)[0]
	_, task := releaseBuild(t, h, a, inventory(a), nil)
	finishBuild(t, h, a.ID, task, strings.Repeat("d", 64), fingerprint("x"))
	h.clk.Advance(4 * time.Minute)
	must(t, h.c.checkDeadlines(bg))
	h.mustState(a.ID, store.StateProvisioning)
	h.clk.Advance(2 * time.Minute)
	must(t, h.c.checkDeadlines(bg))
	m := h.mustState(a.ID, store.StateFailed)
	if m.Reason != string(agentapi.ReasonFirstBootUnreported) {
		t.Fatalf("reason %q", m.Reason)
	}
	boot, err := h.c.BootFor(bg, a.Intended.NICs[0].MAC)
	must(t, err)
	if boot.Action != BootAgent {
		t.Fatalf("failed machine told %+v, want the agent (never its disk)", boot)
	}
	// A late report is recorded and moves nothing.
	m, err = h.c.FirstBoot(bg, a.ID, agentapi.FirstBootReport{Phase: agentapi.PhaseNodeLayer, Outcome: agentapi.OutcomeSucceeded,
		Hostname: m.Build.Hostname, SSHHostKeyFingerprint: fingerprint("x")})
	must(t, err)
	if m.State != store.StateFailed || m.Build.FirstBoot == nil {
		t.Fatalf("late report: %s %+v", m.State, m.Build.FirstBoot)
	}
}

// A report whose host key is not the build's, and a failed report: failed.
func TestFirstBootMismatchAndFailure(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	ms := importPlan(t, h)
	for i, tc := range []struct {
		rep    agentapi.FirstBootReport
		reason string
	}{
		{agentapi.FirstBootReport{Phase: agentapi.PhaseNodeLayer, Outcome: agentapi.OutcomeSucceeded, SSHHostKeyFingerprint: fingerprint("other")},
			string(agentapi.ReasonFirstBootMismatch)},
		{agentapi.FirstBootReport{Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeFailed, Message: "kubeadm join: timeout"},
			string(agentapi.ReasonFirstBootJoin)},
	} {
		a := ms[i]
		_, task := releaseBuild(t, h, a, inventory(a), nil)
		finishBuild(t, h, a.ID, task, strings.Repeat("e", 64), fingerprint(a.ID))
		rep := tc.rep
		rep.Hostname = h.get(a.ID).Build.Hostname
		m, err := h.c.FirstBoot(bg, a.ID, rep)
		must(t, err)
		if m.State != store.StateFailed || m.Reason != tc.reason {
			t.Fatalf("case %d: %s %s, want failed %s", i, m.State, m.Reason, tc.reason)
		}
	}
	// Bad enums are refused before anything is written.
	if _, err := h.c.FirstBoot(bg, ms[0].ID, agentapi.FirstBootReport{Phase: "boot", Outcome: "ok"}); !errors.Is(err, ErrBadReport) {
		t.Fatalf("bad phase: %v", err)
	}
}

// version_mismatch: the claim's kubernetesVersion is not the release's
// kubeadm version: the build fails at check, and no task (nothing to
// write) is served.
func TestVersionMismatch(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	a := importPlan(t, h)[0]
	_, task := releaseBuild(t, h, a, inventory(a), &store.ClusterSpec{Role: "worker", ControlPlaneHost: "cp.example",
		KubernetesVersion: "v1.30.4", Token: strongToken})
	if task.Action != agentapi.ActionWait || len(task.Layers) != 0 || task.Image != nil {
		t.Fatalf("task served on a version mismatch: %+v", task)
	}
	m := h.mustState(a.ID, store.StateFailed)
	if m.Reason != string(agentapi.ReasonVersionMismatch) || m.Step == nil || m.Step.Step != agentapi.StepCheck ||
		m.Step.State != string(agentapi.StateFailed) || !strings.Contains(m.Message, "v1.30.4") || !strings.Contains(m.Message, "v1.31.2") {
		t.Fatalf("version mismatch: %s %s %q %+v", m.State, m.Reason, m.Message, m.Step)
	}
}

// The token rules: refused empty or shorter than 16 characters, accepted
// with a warning (logged without the token, TokenWeak) below ~128 bits.
func TestClusterTokenRules(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	logs := captureLog(h)
	ms := importPlan(t, h)
	rel := h.release("os", nil)
	for _, m := range ms {
		_, err := h.c.AgentRegister(bg, m.ID, agentapi.Registration{Inventory: inventory(m)})
		must(t, err)
	}
	claim := func(tok, role, host string) store.Claim {
		return store.Claim{Image: rel.ID, Cluster: &store.ClusterSpec{Role: role, ControlPlaneHost: host, KubernetesVersion: "v1.31.2", Token: tok}}
	}
	for name, tc := range map[string]struct {
		cl    store.Claim
		field string
	}{
		"empty token":      {claim("", "worker", "cp"), "claim.cluster.cluster_token"},
		"short token":      {claim("0123456789abcde", "worker", "cp"), "claim.cluster.cluster_token"},
		"space in token":   {claim("0123456789 abcdef", "worker", "cp"), "claim.cluster.cluster_token"},
		"bad role":         {claim(strongToken, "master", "cp"), "claim.cluster.role"},
		"no host (worker)": {claim(strongToken, "worker", ""), "claim.cluster.control_plane_host"},
		"bad port":         {claim(strongToken, "worker", "cp:99999"), "claim.cluster.control_plane_host"},
		"unpinned version": {store.Claim{Image: rel.ID, Cluster: &store.ClusterSpec{Role: "init", KubernetesVersion: "1.31", Token: strongToken}}, "claim.cluster.kubernetesVersion"},
	} {
		_, err := h.c.Provision(bg, ms[0].ID, tc.cl, store.W{})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want ErrInvalid naming %s", name, err, tc.field)
		}
		if tc.cl.Cluster.Token != "" && strings.Contains(err.Error(), tc.cl.Cluster.Token) {
			t.Errorf("%s: the error shows the token: %v", name, err)
		}
	}
	if h.get(ms[0].ID).Claim != nil {
		t.Fatal("a refused claim was written")
	}
	// A weak token: accepted, flagged, warned about without the token.
	m, err := h.c.Provision(bg, ms[0].ID, claim(weakToken, "init", ""), store.W{})
	must(t, err)
	if m.Claim.Cluster.TokenRef == "" || !m.Claim.Cluster.TokenWeak {
		t.Fatalf("weak token claim %+v", m.Claim.Cluster)
	}
	out := logs.String()
	if !strings.Contains(out, "estimated entropy") || strings.Contains(out, weakToken) {
		t.Fatalf("weak-token warning missing or showing the token:\n%s", out)
	}
	// A strong token (ClaimMachines) is not flagged.
	got, err := h.c.ClaimMachines(bg, "worker", nil, 1, claim(strongToken, "worker", "[fd00::1]"), store.W{})
	must(t, err)
	if cc := got[0].Claim.Cluster; cc.TokenWeak || cc.ControlPlaneHost != "[fd00::1]:6443" || cc.TokenRef == "" {
		t.Fatalf("claimed cluster block %+v", cc)
	}
	for _, ev := range allEvents(t, h.st.(*store.Store)) {
		if strings.Contains(ev.Message, weakToken) || strings.Contains(ev.Message, strongToken) {
			t.Fatalf("a token in event %+v", ev)
		}
	}
}

// A finalize report whose read-back digest is not the pinned one fails
// the build (digest_mismatch).
func TestReleaseFinalizeDigestMismatch(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	a := importPlan(t, h)[0]
	_, task := releaseBuild(t, h, a, inventory(a), nil)
	task.Layers[0].SHA256 = strings.Repeat("1", 64) // h.image records 64 zeros
	finishBuild(t, h, a.ID, task, strings.Repeat("f", 64), fingerprint("y"))
	m := h.mustState(a.ID, store.StateFailed)
	if m.Reason != string(agentapi.ReasonDigestMismatch) || !strings.Contains(m.Message, "layer base") {
		t.Fatalf("%s %q", m.Reason, m.Message)
	}
}

// BootFor: failed and quarantined machines are never told to boot their
// disk, whatever their netboot flag; provisioned and retired boot it.
func TestBootForNeverFailedDisk(t *testing.T) {
	s := newStore(t)
	h := newHarness(t, s, nil)
	off := false
	for i, tc := range []struct {
		state   store.MachineState
		netboot *bool
		want    string
	}{
		{store.StateFailed, nil, BootAgent},
		{store.StateFailed, &off, BootAgent},
		{store.StateQuarantined, nil, BootAgent},
		{store.StateQuarantined, &off, BootAgent},
		{store.StateProvisioned, nil, BootLocal},
		{store.StateRetired, nil, BootLocal},
		{store.StateAvailable, &off, BootLocal},
	} {
		mac := "52:54:00:15:00:" + string("0123456789abcdef"[i/16]) + string("0123456789abcdef"[i%16])
		m := seed(t, s, store.Machine{Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}, Netboot: tc.netboot}, tc.state)
		b, err := h.c.BootFor(bg, mac)
		must(t, err)
		if b.Action != tc.want || b.MachineID != m.ID {
			t.Errorf("%s (netboot %v): %+v, want %s", tc.state, tc.netboot, b, tc.want)
		}
		if tc.want == BootAgent && (b.Token == "" || !h.c.VerifyAgentToken(m.ID, b.Token)) {
			t.Errorf("%s: agent boot without a valid token", tc.state)
		}
	}
}
