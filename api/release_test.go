package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/lifecycletest"

	. "kiln/api"
	"kiln/store"
)

// PUT /v1/images/{id}/manifest over real HTTP: admin only, the layer
// pinned by the layer image's digest, shown by GET /v1/images/{id};
// field errors name the JSON path.
func TestManifestAPI(t *testing.T) {
	h := newHarness(t)
	base := h.image([]byte("base disk image"))
	gpu := h.image([]byte("gpu layer blob"))
	req := ManifestRequest{KubeadmVersion: "v1.31.2", Layers: []Layer{{Name: "base", When: store.LayerAlways},
		{Name: "gpu", Image: gpu.ID, When: store.LayerNvidiaGPU}}}
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", viewerTok, req), http.StatusForbidden, "")
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", operatorTok, req), http.StatusForbidden, "")
	r := h.do("PUT", "/v1/images/"+base.ID+"/manifest", adminTok, req)
	h.want(r, http.StatusOK, "")
	var im Image
	r.into(t, &im)
	if len(im.Layers) != 2 || im.Layers[1].SHA256 != gpu.SHA256 || im.Layers[1].PartName != "kiln-layer-gpu" || im.KubeadmVersion != "v1.31.2" {
		t.Fatalf("manifest answer %+v", im)
	}
	var got Image
	g := h.do("GET", "/v1/images/"+base.ID, viewerTok, nil)
	h.want(g, http.StatusOK, "")
	g.into(t, &got)
	if len(got.Layers) != 2 || got.Layers[0].SHA256 != base.SHA256 {
		t.Fatalf("GET image %+v", got)
	}
	bad := req
	bad.Layers = []Layer{{Name: "base", When: "sometimes"}}
	r = h.do("PUT", "/v1/images/"+gpu.ID+"/manifest", adminTok, bad)
	h.want(r, http.StatusBadRequest, CodeInvalid)
	if r.err().Field != "layers[0]" && r.err().Field != "layers[0].when" {
		t.Fatalf("field %q: %s", r.err().Field, r.body)
	}
	// Another manifest on a release: 409.
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", adminTok, ManifestRequest{KubeadmVersion: "v1.31.3",
		Layers: []Layer{{Name: "base", When: "always"}}}), http.StatusConflict, "")
}

// The cluster block over real HTTP: the token is accepted, never in any
// answer (viewer, operator or admin), event or log line; the agent gets it
// only in the gated credentials; the installed OS's first-boot report,
// with its own token, makes the machine provisioned.
func TestClusterTokenAndFirstBootAPI(t *testing.T) {
	const tok = "9f86d081884c7d659a2feaa0c55ad015"
	logs := &lockedBuf{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d := lifecycletest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Controller.Run(ctx, logger); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	s, err := New(testConfig(), d.Backend(), prometheus.NewRegistry(), logger)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	h := &harness{t: t, d: d, st: d.Store, s: s, srv: srv}

	base := h.image([]byte("release base"))
	cp := h.image([]byte("control plane tools"))
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", adminTok, ManifestRequest{KubeadmVersion: "v1.31.2",
		Layers: []Layer{{Name: "base", When: "always"}, {Name: "control-plane", Image: cp.ID, When: store.LayerControlPlane}}}), 200, "")
	m := h.machine("n1", "52:54:00:00:15:01", store.StateAvailable, nil)

	// Refused: a short token, the error without it.
	r := h.do("POST", "/v1/machines/"+m.ID+"/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: base.ID,
		Cluster: &ClusterBlock{Role: "worker", ControlPlaneHost: "cp", KubernetesVersion: "v1.31.2", ClusterToken: "short-secret"}}})
	h.want(r, 400, CodeInvalid)
	if r.err().Field != "claim.cluster.cluster_token" || strings.Contains(string(r.body), "short-secret") {
		t.Fatalf("short token: %s", r.body)
	}
	r = h.do("POST", "/v1/machines/"+m.ID+"/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: base.ID,
		Cluster: &ClusterBlock{Role: "control-plane", ControlPlaneHost: "cp.example", KubernetesVersion: "v1.31.2", ClusterToken: tok}}})
	h.want(r, 202, "")
	if w := r.hdr.Get("Warning"); w != "" {
		t.Fatalf("a strong token got a warning: %s", w)
	}
	// A weak token: accepted, with a warning.
	m2 := h.machine("n2", "52:54:00:00:15:02", store.StateAvailable, nil)
	r2 := h.do("POST", "/v1/machines/"+m2.ID+"/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: base.ID,
		Cluster: &ClusterBlock{Role: "worker", ControlPlaneHost: "cp.example", KubernetesVersion: "v1.31.2", ClusterToken: "abcdabcdabcdabcd"}}})
	h.want(r2, 202, "")
	if w := r2.hdr.Get("Warning"); !strings.Contains(w, "299") || !strings.Contains(w, "128 bits") || strings.Contains(string(r2.body), "abcdabcdabcdabcd") {
		t.Fatalf("weak token: warning %q body %s", w, r2.body)
	}
	for _, who := range []string{viewerTok, operatorTok, adminTok} {
		for _, path := range []string{"/v1/machines/" + m.ID, "/v1/machines", "/v1/events"} {
			g := h.do("GET", path, who, nil)
			h.want(g, 200, "")
			if strings.Contains(string(g.body), tok) {
				t.Fatalf("GET %s shows the cluster token: %s", path, g.body)
			}
		}
	}
	var mv Machine
	h.do("GET", "/v1/machines/"+m.ID, viewerTok, nil).into(t, &mv)
	if mv.Claim == nil || mv.Claim.Cluster == nil || !mv.Claim.Cluster.TokenSet || mv.Claim.Cluster.ControlPlaneHost != "cp.example:6443" {
		t.Fatalf("viewer's claim %+v", mv.Claim)
	}

	// The agent: task with layers; the token only in the credentials.
	agentTok := h.agentToken(m)
	tr := h.do("GET", "/v1/agent/task", agentTok, nil, HeaderMachine, m.ID)
	h.want(tr, 200, "")
	var task agentapi.Task
	tr.into(t, &task)
	if len(task.Layers) != 2 || task.Layers[1].Name != "control-plane" || strings.Contains(string(tr.body), tok) {
		t.Fatalf("task %s", tr.body)
	}
	h.want(h.do("GET", "/v1/agent/credentials", viewerTok, nil, HeaderMachine, m.ID), 403, "")
	cr := h.do("GET", "/v1/agent/credentials", agentTok, nil, HeaderMachine, m.ID)
	h.want(cr, 200, "")
	var creds agentapi.Credentials
	cr.into(t, &creds)
	var fb agentapi.FirstBootFile
	for _, f := range creds.Files {
		if f.Path == agentapi.PathFirstBoot {
			if err := json.Unmarshal(f.Data, &fb); err != nil {
				t.Fatal(err)
			}
		}
		if f.Path == agentapi.PathKubeadm && !strings.Contains(string(f.Data), tok) {
			t.Fatalf("kubeadm config without the token: %s", f.Data)
		}
	}
	if fb.Token == "" || cr.hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("credentials %s", cr.body)
	}

	// The build completes (the domain takes the agent's reports as the API would).
	fp := "SHA256:" + strings.Repeat("A", 43)
	for _, st := range []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify, agentapi.StepStage} {
		if err := d.Service.AgentReport(ctx, m.ID, agentapi.Report{Step: st, State: agentapi.StateSucceeded, Attempt: task.Attempt}); err != nil {
			t.Fatal(err)
		}
	}
	br := &agentapi.BuildReport{NodeLayerSHA256: strings.Repeat("a", 64), SSHHostKeyFingerprint: fp}
	for _, l := range task.Layers {
		br.Layers = append(br.Layers, agentapi.LayerWritten{Name: l.Name, SHA256: l.SHA256, Size: l.Size})
	}
	if err := d.Service.AgentReport(ctx, m.ID, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Attempt: task.Attempt, Build: br}); err != nil {
		t.Fatal(err)
	}
	rep := agentapi.FirstBootReport{MachineID: m.ID, Phase: agentapi.PhaseNodeLayer, Outcome: agentapi.OutcomeSucceeded,
		Hostname: "n1", SSHHostKeyFingerprint: fp}
	h.want(h.do("POST", "/v1/agent/firstboot", agentTok, rep), 403, CodeForbidden) // the per-boot token is not the first-boot token
	h.want(h.do("POST", "/v1/agent/firstboot", "", rep), 401, CodeUnauthorized)
	h.want(h.do("POST", "/v1/agent/firstboot", fb.Token, agentapi.FirstBootReport{MachineID: m.ID, Phase: "x", Outcome: "y"}), 400, "")
	h.want(h.do("POST", "/v1/agent/firstboot", fb.Token, rep), 204, "")
	if got := h.get(m.ID); got.State != store.StateProvisioned || got.Reason != "first_boot_reported" {
		t.Fatalf("after first boot: %s %s", got.State, got.Reason)
	}
	var after Machine
	h.do("GET", "/v1/machines/"+m.ID, viewerTok, nil).into(t, &after)
	if after.Build == nil || after.Build.FirstBoot == nil || after.Build.SSHHostKeyFingerprint != fp {
		t.Fatalf("machine view build %+v", after.Build)
	}
	if raw := h.do("GET", "/v1/machines/"+m.ID, adminTok, nil).body; strings.Contains(string(raw), fb.Token) ||
		strings.Contains(string(raw), "first_boot_token_hash") {
		t.Fatal("the first-boot token or its hash is in the machine view")
	}
	if out := logs.String(); strings.Contains(out, tok) || strings.Contains(out, fb.Token) {
		t.Fatalf("a token in the log:\n%s", out)
	}
}
