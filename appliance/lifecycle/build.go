// Release builds (issue 15; DESIGN.md "Release builds"): what a build of a
// release adds to the gated build. startRelease records Machine.Build when
// the build starts (the layers chosen, layers.go; the first-boot token's
// hash) or fails it at check when the claim's kubernetesVersion is not the
// release's kubeadm version (version_mismatch, before anything is
// written); releaseTask adds the layers, the per-node layer's non-secret
// files and the cluster check to the task; AgentCredentials answers the
// secret files behind the CredentialGate; recordBuild takes the finalize
// report's digests into Machine.Build. The first boot's report is
// firstboot.go.

package lifecycle

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Opener opens what a Sealer sealed. The Config's Sealer implements it
// when cluster and first-boot tokens are to be handed out (AgentCredentials).
type Opener interface {
	Open(sealed []byte) ([]byte, error)
}

// CredentialGate decides whether machine m's agent may have its secret
// files now (GET /v1/agent/credentials): nil allows, an error refuses and
// says why (ErrCredentialsRefused is returned wrapping it). Issue 16
// supplies the attestation gate (a passing attestation of this
// provisioning, or the model's no-TPM policy).
type CredentialGate func(ctx context.Context, m store.Machine) error

// AllowWithoutAttestation is the CredentialGate while no attestation is
// required: it allows every machine whose build asks.
func AllowWithoutAttestation(context.Context, store.Machine) error { return nil }

// Secret keys of issue 15 (Store.PutSecret; values sealed by Config.Sealer).
func clusterTokenKey(nonce string) string { return "cluster/" + nonce }
func firstBootKey(machineID, hash string) string {
	return "firstboot/" + machineID + "/" + hash[:16]
}

// newFirstBootToken makes a first-boot token for machine id, seals it and
// stores it (firstBootKey, so that two nodes starting the same build at
// once never overwrite each other's token), and returns its SHA-256 hex.
func (c *Controller) newFirstBootToken(ctx context.Context, id string) (string, error) {
	if c.cfg.Sealer == nil {
		return "", ErrNoSealer
	}
	tok, err := c.newToken()
	if err != nil {
		return "", err
	}
	sealed, err := c.cfg.Sealer.Seal([]byte(tok))
	if err != nil {
		return "", fmt.Errorf("lifecycle: seal first-boot token: %w", err)
	}
	h := tokenHash(tok)
	if err := c.st.PutSecret(ctx, firstBootKey(id, h), sealed, store.W{Actor: ActorController, Reason: "first_boot_token"}); err != nil {
		return "", fmt.Errorf("lifecycle: store first-boot token: %w", err)
	}
	return h, nil
}

// startRelease records the build of release img on m (inside the update
// that moves m to provisioning): the layers chosen and skipped with their
// reasons, the first-boot token's hash, the attempt.
func startRelease(m *store.Machine, img store.Image, fbHash string, now time.Time) {
	chosen, skipped := chooseLayers(img, *m)
	m.Build = &store.BuildRecord{Release: img.ID, KubeadmVersion: img.KubeadmVersion, Started: now,
		Layers: chosen, Skipped: skipped, FirstBootTokenHash: fbHash, Hostname: hostnameOf(*m)}
	if m.Step != nil {
		m.Build.Attempt = m.Step.Attempt
	}
}

// versionMismatch is the cluster rule of the check step (the one home of
// version_mismatch): a claim with a cluster block builds only a release
// whose kubeadm version is the claim's kubernetesVersion. "" = they agree
// (or there is no cluster block).
func versionMismatch(m store.Machine, img store.Image) string {
	if m.Claim == nil || m.Claim.Cluster == nil {
		return ""
	}
	want := m.Claim.Cluster.KubernetesVersion
	switch {
	case !img.IsRelease():
		return fmt.Sprintf("kubernetesVersion %s: image %s is no release (it declares no kubeadm version)", want, img.ID)
	case img.KubeadmVersion != want:
		return fmt.Sprintf("kubernetesVersion %s, release %s carries kubeadm %s", want, img.ID, img.KubeadmVersion)
	}
	return ""
}

// failVersionMismatch fails m's build at check (nothing written yet).
func (c *Controller) failVersionMismatch(ctx context.Context, id, why string) (store.Machine, error) {
	now := c.now()
	return c.update(ctx, id, store.W{Actor: ActorController, Reason: string(agentapi.ReasonVersionMismatch), Message: why},
		func(m *store.Machine) error {
			if m.State != store.StateProvisioning || m.Step == nil || m.Step.Step != agentapi.StepCheck || m.Step.State != stepPending {
				return errNoChange
			}
			m.State = store.StateFailed
			m.Reason, m.Message = string(agentapi.ReasonVersionMismatch), agentapi.StepCheck+": "+why
			m.Step = &store.StepStatus{Step: agentapi.StepCheck, State: string(agentapi.StateFailed),
				Reason: string(agentapi.ReasonVersionMismatch), Message: why, At: now, Attempt: m.Step.Attempt}
			return nil
		})
}

// hostnameOf is the host name a build gives m: the claim's, else the
// machine's name, else its ID.
func hostnameOf(m store.Machine) string {
	if m.Claim != nil && m.Claim.Hostname != "" {
		return m.Claim.Hostname
	}
	if m.Name != "" {
		return m.Name
	}
	return m.ID
}

// layerImages returns the image record of each chosen layer of m's build
// (the release itself for the base).
func (c *Controller) layerImages(m store.Machine, img store.Image) ([]store.Image, error) {
	if m.Build == nil {
		return nil, nil
	}
	out := make([]store.Image, len(m.Build.Layers))
	for i, l := range m.Build.Layers {
		if l.Image == img.ID {
			out[i] = img
			continue
		}
		li, err := c.st.GetImage(l.Image)
		if err != nil {
			return nil, fmt.Errorf("lifecycle: machine %s layer %s image %s: %w", m.ID, l.Name, l.Image, err)
		}
		out[i] = li
	}
	return out, nil
}

// releaseTask adds a release build's instructions to t: the chosen layers
// (base first, each with its URL on this node and its reason), the per-node
// layer's non-secret files, the cluster check. The NoCloud stage data is
// dropped: nothing is configured at first boot.
func (c *Controller) releaseTask(t *agentapi.Task, m store.Machine, img store.Image) error {
	imgs, err := c.layerImages(m, img)
	if err != nil {
		return err
	}
	byName := map[string]store.Layer{}
	for _, l := range img.Layers {
		byName[l.Name] = l
	}
	for i, bl := range m.Build.Layers {
		ml := byName[bl.Name]
		format := imgs[i].Format
		if format == "" {
			format = "raw"
		}
		t.Layers = append(t.Layers, agentapi.Layer{Name: bl.Name, URL: c.cfg.ImageBaseURL + "/images/" + url.PathEscape(imgs[i].Name),
			SHA256: bl.SHA256, Size: bl.Size, Format: format, When: ml.When, Reason: bl.Reason, PartName: bl.PartName,
			VerityRootHash: ml.VerityRootHash, VerityHashOffset: ml.VerityHashOffset})
	}
	t.NodeLayer = nodeLayer(m)
	t.Stage = nil
	if cl := m.Claim.Cluster; cl != nil {
		t.Cluster = &agentapi.ClusterCheck{KubernetesVersion: cl.KubernetesVersion, ImageKubeadmVersion: img.KubeadmVersion}
	}
	return nil
}

// NodeInfo is /etc/kiln/node.json of the per-node layer: who the node is
// and how it joins, without secrets.
type NodeInfo struct {
	MachineID     string            `json:"machine_id"`
	Hostname      string            `json:"hostname"`
	Role          string            `json:"role,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	NetworkConfig string            `json:"network_config,omitempty"`
	SSHKeys       []string          `json:"ssh_keys,omitempty"`
	Release       string            `json:"release"`
	Layers        []string          `json:"layers"`
	Cluster       *NodeCluster      `json:"cluster,omitempty"`
}

// NodeCluster is node.json's cluster block (the token is in the secret
// kubeadm configuration only).
type NodeCluster struct {
	Role              string `json:"role"`
	ControlPlaneHost  string `json:"control_plane_host,omitempty"`
	KubernetesVersion string `json:"kubernetes_version"`
}

// nodeLayer is the per-node layer's non-secret files for m's build.
func nodeLayer(m store.Machine) *agentapi.NodeLayer {
	host := hostnameOf(m)
	cl := m.Claim
	labels := map[string]string{}
	for k, v := range m.Labels {
		labels[k] = v
	}
	for k, v := range cl.Labels {
		labels[k] = v
	}
	if cl.Role != "" {
		labels["kiln.io/role"] = cl.Role
	}
	info := NodeInfo{MachineID: m.ID, Hostname: host, Role: cl.Role, Labels: labels, NetworkConfig: cl.NetworkConfig,
		SSHKeys: cl.SSHKeys, Release: m.Build.Release}
	for _, l := range m.Build.Layers {
		info.Layers = append(info.Layers, l.Name)
	}
	if cc := cl.Cluster; cc != nil {
		info.Cluster = &NodeCluster{Role: cc.Role, ControlPlaneHost: cc.ControlPlaneHost, KubernetesVersion: cc.KubernetesVersion}
	}
	js, _ := json.MarshalIndent(info, "", "  ") // plain strings and maps: never fails
	return &agentapi.NodeLayer{Files: []agentapi.NodeFile{
		{Path: agentapi.PathHostname, Mode: 0o644, Data: []byte(host + "\n")},
		{Path: agentapi.PathMachineID, Mode: 0o644, Data: []byte(m.ID + "\n")},
		{Path: agentapi.PathNodeJSON, Mode: 0o644, Data: append(js, '\n')},
	}}
}

// AgentCredentials answers GET /v1/agent/credentials: the secret files of
// machine id's per-node layer — /etc/kiln/firstboot.json (the first-boot
// token and where to report, 0600), and with a cluster block the kubeadm
// configuration holding the cluster token (0600) and the cluster CA (0644).
// Only while a release build of the machine is under way and not complete,
// and only when the CredentialGate allows (ErrCredentialsRefused
// otherwise). Nothing of the answer is logged or recorded. Errors:
// ErrCredentialsRefused, ErrNoSealer (the Sealer cannot open), store errors.
func (c *Controller) AgentCredentials(ctx context.Context, id string) (agentapi.Credentials, error) {
	c.seen(id)
	m, err := c.st.GetMachine(id)
	if err != nil {
		return agentapi.Credentials{}, fmt.Errorf("lifecycle: credentials %s: %w", id, err)
	}
	if m.State != store.StateProvisioning || m.Build == nil || m.Claim == nil || buildComplete(m) || m.Build.FirstBootTokenHash == "" {
		return agentapi.Credentials{}, fmt.Errorf("%w: machine %s is not building a release (state %s)", ErrCredentialsRefused, id, m.State)
	}
	gate := c.cfg.CredentialGate
	if gate == nil {
		gate = AllowWithoutAttestation
	}
	if err := gate(ctx, m); err != nil {
		return agentapi.Credentials{}, fmt.Errorf("%w: %w", ErrCredentialsRefused, err)
	}
	op, ok := c.cfg.Sealer.(Opener)
	if !ok {
		return agentapi.Credentials{}, fmt.Errorf("%w: the sealer cannot open secrets", ErrNoSealer)
	}
	open := func(key string) ([]byte, error) {
		sealed, err := c.st.Secret(key)
		if err != nil {
			return nil, fmt.Errorf("lifecycle: secret %s: %w", key, err)
		}
		return op.Open(sealed)
	}
	tok, err := open(firstBootKey(id, m.Build.FirstBootTokenHash))
	if err != nil {
		return agentapi.Credentials{}, err
	}
	urls := c.cfg.AgentEndpoints
	if len(urls) == 0 {
		urls = []string{c.cfg.ImageBaseURL}
	}
	fb, _ := json.Marshal(agentapi.FirstBootFile{URLs: urls, MachineID: id, Token: string(tok)})
	out := agentapi.Credentials{Files: []agentapi.NodeFile{{Path: agentapi.PathFirstBoot, Mode: 0o600, Data: append(fb, '\n')}}}
	if cl := m.Claim.Cluster; cl != nil {
		ctok, err := open(cl.TokenRef)
		if err != nil {
			return agentapi.Credentials{}, err
		}
		out.Files = append(out.Files, agentapi.NodeFile{Path: agentapi.PathKubeadm, Mode: 0o600,
			Data: kubeadmConfig(m, string(ctok))})
		clear(ctok)
		if m.Claim.CABundle != "" {
			out.Files = append(out.Files, agentapi.NodeFile{Path: agentapi.PathClusterCA, Mode: 0o644, Data: []byte(m.Claim.CABundle)})
		}
	}
	return out, nil
}

// q quotes s as a YAML scalar (a JSON string is a YAML double-quoted scalar).
func q(s string) string { b, _ := json.Marshal(s); return string(b) }

// kubeadmConfig is the kubeadm configuration (kubeadm.k8s.io/v1beta4) of
// m's cluster block with token: InitConfiguration + ClusterConfiguration
// for role init, JoinConfiguration (with controlPlane for control-plane)
// otherwise, pinned to the claim's CA by its public-key hash when the claim
// has a CA bundle.
func kubeadmConfig(m store.Machine, token string) []byte {
	cl := m.Claim.Cluster
	host := hostnameOf(m)
	var b strings.Builder
	b.WriteString("# written by kiln for machine " + m.ID + "; applied at first boot by kubeadm --config\n")
	if cl.Role == rules.ClusterInit {
		b.WriteString("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nbootstrapTokens:\n")
		b.WriteString("- token: " + q(token) + "\n")
		b.WriteString("nodeRegistration:\n  name: " + q(host) + "\n---\n")
		b.WriteString("apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n")
		b.WriteString("kubernetesVersion: " + q(cl.KubernetesVersion) + "\n")
		if cl.ControlPlaneHost != "" {
			b.WriteString("controlPlaneEndpoint: " + q(cl.ControlPlaneHost) + "\n")
		}
		return []byte(b.String())
	}
	b.WriteString("apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n")
	b.WriteString("    apiServerEndpoint: " + q(cl.ControlPlaneHost) + "\n")
	b.WriteString("    token: " + q(token) + "\n")
	if h := caHash(m.Claim.CABundle); h != "" {
		b.WriteString("    caCertHashes:\n    - " + q(h) + "\n")
	} else {
		b.WriteString("    unsafeSkipCAVerification: true\n")
	}
	b.WriteString("nodeRegistration:\n  name: " + q(host) + "\n")
	if cl.Role == rules.ClusterControlPlane {
		b.WriteString("controlPlane: {}\n")
	}
	return []byte(b.String())
}

// caHash is kubeadm's CA pin of the first certificate of bundle
// ("sha256:" + hex SHA-256 of its SubjectPublicKeyInfo), "" when there is
// none.
func caHash(bundle string) string {
	blk, _ := pem.Decode([]byte(bundle))
	if blk == nil {
		return ""
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

var (
	hex64Re       = regexp.MustCompile(`^[0-9a-f]{64}$`)
	fingerprintRe = regexp.MustCompile(`^SHA256:[A-Za-z0-9+/]{43}$`)
)

// recordBuild takes a release build's finalize report into m.Build: every
// chosen layer's read-back digest must be its pinned SHA-256 and the
// per-node layer hash and SSH fingerprint well-formed; otherwise the
// returned error says what is wrong (the build then fails, digest_mismatch).
func recordBuild(m *store.Machine, rep *agentapi.BuildReport, now time.Time) error {
	if rep == nil {
		return errors.New("the finalize report carries no build record")
	}
	written := map[string]agentapi.LayerWritten{}
	for _, l := range rep.Layers {
		written[l.Name] = l
	}
	for i := range m.Build.Layers {
		bl := &m.Build.Layers[i]
		w, ok := written[bl.Name]
		if !ok {
			return fmt.Errorf("layer %s: not in the finalize report", bl.Name)
		}
		if !strings.EqualFold(w.SHA256, bl.SHA256) {
			return fmt.Errorf("layer %s: read back %s, pinned %s", bl.Name, w.SHA256, bl.SHA256)
		}
		bl.Written = &store.LayerWritten{SHA256: strings.ToLower(w.SHA256), Start: w.Start, Size: w.Size}
	}
	nl := strings.ToLower(rep.NodeLayerSHA256)
	if !hex64Re.MatchString(nl) {
		return fmt.Errorf("node layer sha256 %q: want 64 hex digits", truncate(sanitize(rep.NodeLayerSHA256), 80))
	}
	if !fingerprintRe.MatchString(rep.SSHHostKeyFingerprint) {
		return fmt.Errorf("ssh host key fingerprint %q: want SHA256:<43 base64 characters>", truncate(sanitize(rep.SSHHostKeyFingerprint), 80))
	}
	m.Build.NodeLayerSHA256, m.Build.SSHHostKeyFingerprint, m.Build.Built = nl, rep.SSHHostKeyFingerprint, now
	return nil
}

// awaitsFirstBoot reports whether m's build is a release build, whose
// provisioned is recorded only from the OS's first-boot report: a build
// record with a first-boot token, of the release the claim names (a record
// an older command kept from an earlier claim does not count).
func awaitsFirstBoot(m store.Machine) bool {
	return m.Build != nil && m.Build.FirstBootTokenHash != "" && (m.Claim == nil || m.Claim.Image == m.Build.Release)
}
