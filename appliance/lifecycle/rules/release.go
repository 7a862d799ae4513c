package rules

import (
	"fmt"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"

	"kiln/store"
)

// Issue 15: the field rules of a release manifest (CheckManifest) and of a
// claim's cluster block (CheckCluster, TokenStrength). Both are the one
// home of their rules: the API, the lifecycle and the CLI call them.

// layerNameRe is a layer name: 1 to 32 of [a-z0-9-], starting with a letter
// or digit (it becomes the GPT partition name kiln-layer-<name>, at most 36
// UTF-16 characters).
var layerNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// kubeVersionRe is a pinned Kubernetes (kubeadm) version: v<major>.<minor>.<patch>.
var kubeVersionRe = regexp.MustCompile(`^v[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,4}$`)

// verityHashRe is a dm-verity root hash: 64 (sha256) to 128 (sha512) hex digits.
var verityHashRe = regexp.MustCompile(`^(?:[0-9a-f]{64}|[0-9a-f]{128})$`)

// MaxLayers bounds a release's layers.
const MaxLayers = 16

// CheckManifest checks the release manifest of image im and normalises it
// in place (hex lower-cased, the base layer's Image set to im.ID and every
// PartName set): KubeadmVersion required, v<major>.<minor>.<patch>; 1 to
// MaxLayers layers, the first named "base" with When "always"; names
// unique, 1 to 32 of [a-z0-9-]; When one of store.LayerWhens; every layer
// other than the base names its catalog image (Image, CheckID); SHA256,
// when given (a pin the registration checks against the layer's image),
// 64 hex digits; VerityRootHash empty or 64/128 hex digits. That each
// layer's image exists, is raw and has that digest is the lifecycle's
// check (SetManifest). Errors: *FieldError naming the JSON path
// ("kubeadm_version", "layers[1].when").
func CheckManifest(im *store.Image) error {
	if !kubeVersionRe.MatchString(im.KubeadmVersion) {
		return bad("kubeadm_version", "%q: required, the kubeadm version the release carries (v1.31.2)", im.KubeadmVersion)
	}
	if len(im.Layers) == 0 || len(im.Layers) > MaxLayers {
		return bad("layers", "%d layers: want 1 to %d, the first the base layer", len(im.Layers), MaxLayers)
	}
	seen := map[string]bool{}
	for i := range im.Layers {
		l := &im.Layers[i]
		f := fmt.Sprintf("layers[%d]", i)
		l.SHA256 = strings.ToLower(strings.TrimSpace(l.SHA256))
		l.VerityRootHash = strings.ToLower(strings.TrimSpace(l.VerityRootHash))
		switch {
		case !layerNameRe.MatchString(l.Name):
			return bad(f+".name", "%q: use 1 to 32 of a-z, 0-9 and '-'", l.Name)
		case seen[l.Name]:
			return bad(f+".name", "%q: a second layer of that name", l.Name)
		case i == 0 && (l.Name != store.BaseLayer || l.When != store.LayerAlways):
			return bad(f, "the first layer is the base layer: name %q, when %q", store.BaseLayer, store.LayerAlways)
		case i > 0 && l.Name == store.BaseLayer:
			return bad(f+".name", "%q is the first layer's name", store.BaseLayer)
		case !knownWhen(l.When):
			return bad(f+".when", "%q: want one of %s", l.When, strings.Join(store.LayerWhens, ", "))
		case l.SHA256 != "" && !sha256Re.MatchString(l.SHA256):
			return bad(f+".sha256", "%q: want 64 hex digits", l.SHA256)
		case l.VerityRootHash != "" && !verityHashRe.MatchString(l.VerityRootHash):
			return bad(f+".verity_root_hash", "%q: want 64 or 128 hex digits (veritysetup format's root hash)", l.VerityRootHash)
		}
		seen[l.Name] = true
		if i == 0 {
			if l.Image != "" && l.Image != im.ID {
				return bad(f+".image", "%q: the base layer is the release image itself (%s)", l.Image, im.ID)
			}
			l.Image, l.PartName = im.ID, ""
			continue
		}
		if l.Image == "" {
			return bad(f+".image", "required: the catalog image (GET /v1/images) holding the layer")
		}
		if err := CheckID(f+".image", l.Image); err != nil {
			return err
		}
		l.PartName = store.LayerPartPrefix + l.Name
	}
	return nil
}

func knownWhen(w string) bool {
	for _, k := range store.LayerWhens {
		if k == w {
			return true
		}
	}
	return false
}

// Cluster roles of a claim's cluster block (the Kairos provider-kubernetes
// roles): init makes the cluster, control-plane and worker join it.
const (
	ClusterInit         = "init"
	ClusterControlPlane = "control-plane"
	ClusterWorker       = "worker"
)

// MinTokenLen is the shortest cluster token accepted (characters).
const MinTokenLen = 16

// WarnTokenBits is the estimated entropy (bits) below which a cluster
// token is accepted with a warning.
const WarnTokenBits = 128

// MaxTokenLen bounds a cluster token (bytes).
const MaxTokenLen = 1024

// DefaultAPIPort is the port a bare control_plane_host gets.
const DefaultAPIPort = "6443"

// CheckCluster checks a claim's cluster block and normalises it in place
// (a control_plane_host without a port gets :6443): Role init,
// control-plane or worker; ControlPlaneHost required except for init, a
// host name or IP address with an optional port (CheckHostPort);
// KubernetesVersion required, v<major>.<minor>.<patch> (that it equals the
// release's kubeadm version is the build's check step: version_mismatch);
// the token (when given: token, the write-only value) at least MinTokenLen
// and at most MaxTokenLen characters of printable ASCII — a claim that
// stores no token yet (tokenSet false) must give one. The token never
// appears in an error. Errors: *FieldError naming field + ".role",
// ".control_plane_host", ".kubernetesVersion", ".cluster_token".
func CheckCluster(field string, cl *store.ClusterSpec, token string, tokenSet bool) error {
	switch cl.Role {
	case ClusterInit, ClusterControlPlane, ClusterWorker:
	default:
		return bad(field+".role", "%q: want init, control-plane or worker", cl.Role)
	}
	if cl.ControlPlaneHost == "" && cl.Role != ClusterInit {
		return bad(field+".control_plane_host", "required for role %s: the API server's host[:port]", cl.Role)
	}
	if cl.ControlPlaneHost != "" {
		hp := cl.ControlPlaneHost
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(strings.Trim(hp, "[]"), DefaultAPIPort)
		}
		if err := CheckHostPort(hp); err != nil {
			return bad(field+".control_plane_host", "%v", err)
		}
		if _, p, _ := net.SplitHostPort(hp); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return bad(field+".control_plane_host", "port %q: want 1..65535", p)
			}
		}
		cl.ControlPlaneHost = hp
	}
	if !kubeVersionRe.MatchString(cl.KubernetesVersion) {
		return bad(field+".kubernetesVersion", "%q: required, pinned as v<major>.<minor>.<patch> (v1.31.2)", cl.KubernetesVersion)
	}
	if token == "" {
		if !tokenSet {
			return bad(field+".cluster_token", "required: at least %d characters", MinTokenLen)
		}
		return nil
	}
	if len(token) < MinTokenLen {
		return bad(field+".cluster_token", "too short: %d characters, at least %d", len(token), MinTokenLen)
	}
	if len(token) > MaxTokenLen {
		return bad(field+".cluster_token", "too long: more than %d bytes", MaxTokenLen)
	}
	for _, r := range token {
		if r < 0x21 || r > 0x7e {
			return bad(field+".cluster_token", "only printable ASCII without spaces")
		}
	}
	return nil
}

// TokenBits estimates a token's entropy in bits: its length times log2
// of the alphabet its character classes span (hex digits only 16; else
// digits 10 + lower-case 26 + upper-case 26 + other printable ASCII 32, for
// each class used). A token that repeats itself (fewer distinct characters
// than half of min(length, alphabet)) is scored by its characters'
// frequencies instead (length × Shannon entropy), so "aaaaaaaaaaaaaaaa"
// scores 0 and 32 random hex digits 128.
func TokenBits(token string) float64 {
	var digit, lower, upper, other, hex = false, false, false, false, true
	count := map[rune]int{}
	n := 0
	for _, r := range token {
		n++
		count[r]++
		switch {
		case r >= '0' && r <= '9':
			digit = true
		case r >= 'a' && r <= 'z':
			lower = true
			hex = hex && r <= 'f'
		case r >= 'A' && r <= 'Z':
			upper = true
			hex = hex && r <= 'F'
		default:
			other, hex = true, false
		}
	}
	if n == 0 {
		return 0
	}
	alphabet := 0
	if hex && !(lower && upper) {
		alphabet = 16
	} else {
		for _, c := range []struct {
			used bool
			size int
		}{{digit, 10}, {lower, 26}, {upper, 26}, {other, 32}} {
			if c.used {
				alphabet += c.size
			}
		}
	}
	if float64(len(count)) < float64(min(n, alphabet))/2 {
		h := 0.0
		for _, k := range count {
			p := float64(k) / float64(n)
			h -= p * math.Log2(p)
		}
		return float64(n) * h
	}
	return float64(n) * math.Log2(float64(alphabet))
}
