package agentapi

// Issue 15 (build before boot): the first-boot report. The installed OS's
// reporter (cmd/kiln-firstboot, run by the lab OS's /sbin/init) reads the
// per-node layer (the GPT partition named kiln-node, ext4) and posts once:
//
//	POST {url}/v1/agent/firstboot   FirstBootReport   → 2xx
//
// with "Authorization: Bearer TOKEN", where {url} and TOKEN come from the
// node layer's /etc/kiln/firstboot.json (FirstBootConfig). Like Report it is
// retried until a 2xx or a 4xx (a 5xx or no answer means "retry", trying the
// next URL). The disk layout is in deploy/lab/labos/DESIGN.md.
//
// (r15os created this file with the first-boot types only; the release types
// of the contract — Layer, NodeLayer, ClusterCheck, Credentials, BuildReport,
// the inventory additions — are added here by their owners.)

// PathFirstBoot is the first-boot endpoint.
const PathFirstBoot = "/v1/agent/firstboot"

// NodePartName is the GPT partition name of the per-node layer (ext4, label
// kiln-node) that the agent appends after the image's layers.
const NodePartName = "kiln-node"

// FirstBootConfigPath is where the node layer holds the reporter's
// configuration (mode 0600, owner root).
const FirstBootConfigPath = "/etc/kiln/firstboot.json"

// FirstBootConfig is /etc/kiln/firstboot.json in the node layer: the Kiln URLs
// to report to (any node of the site cluster; tried in turn), the machine ID and
// the first-boot token (Kiln stores only its SHA-256).
type FirstBootConfig struct {
	URLs      []string `json:"urls"`
	MachineID string   `json:"machine_id"`
	Token     string   `json:"token"`
}

// FirstBootPhase is the closed set of first-boot phases.
type FirstBootPhase string

const (
	// FirstBootPhaseNodeLayer: the OS read its per-node layer (hostname, host key).
	FirstBootPhaseNodeLayer FirstBootPhase = "node_layer"
	// FirstBootPhaseJoin: the OS ran the staged cluster join.
	FirstBootPhaseJoin FirstBootPhase = "join"
)

// FirstBootOutcome is the closed set of first-boot outcomes.
type FirstBootOutcome string

const (
	FirstBootSucceeded FirstBootOutcome = "succeeded"
	FirstBootFailed    FirstBootOutcome = "failed"
)

// MaxFirstBootMessageLen bounds FirstBootReport.Message (bytes).
const MaxFirstBootMessageLen = 256

// FirstBootReport is the body of POST /v1/agent/firstboot. Reason is empty on
// success and one of the first_boot_* Reasons on failure; Message is
// sanitized (SanitizeMessage). SSHHostKeyFingerprint is "SHA256:…" as
// `ssh-keygen -l` prints it, computed from the node layer's
// /etc/ssh/ssh_host_ed25519_key.pub; NodeLayerSHA256 is the hex SHA-256 of the
// whole kiln-node partition as the OS read it before mounting it; BootID is
// /proc/sys/kernel/random/boot_id.
type FirstBootReport struct {
	MachineID             string           `json:"machine_id"`
	Phase                 FirstBootPhase   `json:"phase"`
	Outcome               FirstBootOutcome `json:"outcome"`
	Reason                Reason           `json:"reason,omitempty"`
	Message               string           `json:"message,omitempty"`
	Hostname              string           `json:"hostname,omitempty"`
	SSHHostKeyFingerprint string           `json:"ssh_host_key_fingerprint,omitempty"`
	NodeLayerSHA256       string           `json:"node_layer_sha256,omitempty"`
	BootID                string           `json:"boot_id,omitempty"`
}

// firstBootReasons are the Reasons a failed first boot may carry.
var firstBootReasons = map[Reason]bool{ReasonFirstBootNodeLayer: true, ReasonFirstBootJoinFailed: true}

// Validate checks the closed enums and bounds of r: a known phase and outcome,
// no reason on success and a first_boot_* reason on failure, a sanitized
// message of at most MaxFirstBootMessageLen bytes.
func (r FirstBootReport) Validate() error {
	switch {
	case r.MachineID == "":
		return errFirstBoot("machine_id missing")
	case r.Phase != FirstBootPhaseNodeLayer && r.Phase != FirstBootPhaseJoin:
		return errFirstBoot("unknown phase " + SanitizeMessage(string(r.Phase), 32))
	case r.Outcome != FirstBootSucceeded && r.Outcome != FirstBootFailed:
		return errFirstBoot("unknown outcome " + SanitizeMessage(string(r.Outcome), 32))
	case r.Outcome == FirstBootSucceeded && r.Reason != ReasonNone:
		return errFirstBoot("a succeeded report carries no reason")
	case r.Outcome == FirstBootFailed && !firstBootReasons[r.Reason]:
		return errFirstBoot("a failed report needs a first_boot_* reason, not " + SanitizeMessage(string(r.Reason), 32))
	case r.Message != SanitizeMessage(r.Message, MaxFirstBootMessageLen):
		return errFirstBoot("message not sanitized or longer than 256 bytes")
	}
	return nil
}

type errFirstBoot string

func (e errFirstBoot) Error() string { return "firstboot report: " + string(e) }

// SanitizeMessage keeps printable ASCII (space to '~'), turns every other
// byte (newlines, control characters, non-ASCII) into '?', and cuts the result
// to max bytes.
func SanitizeMessage(s string, max int) string {
	b := []byte(s)
	if len(b) > max {
		b = b[:max]
	}
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return string(b)
}
