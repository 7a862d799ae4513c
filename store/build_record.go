package store

import "time"

// BuildRecord is the gated build's record (layers chosen and why, per-node layer hash, first-boot report) (issue 15). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
//
// The lifecycle writes it when a build of a release starts (Release,
// Layers with their reasons, FirstBootTokenHash), fills the written
// digests from the agent's finalize report (Layers[i].Written,
// NodeLayerSHA256, SSHHostKeyFingerprint) and the first-boot report when
// the installed OS sends it (FirstBoot). A build of a plain image (no
// manifest) has no BuildRecord.
type BuildRecord struct {
	// Release is the image ID of the release; KubeadmVersion its manifest's.
	Release        string `json:"release"`
	KubeadmVersion string `json:"kubeadm_version,omitempty"`
	// Attempt is the build attempt (StepStatus.Attempt) this record belongs to.
	Attempt int       `json:"attempt,omitempty"`
	Started time.Time `json:"started"`
	// Layers are the layers chosen for this machine, base first, each with
	// the reason it was chosen and, after finalize, what was written.
	Layers []BuildLayer `json:"layers"`
	// Skipped are the manifest's layers not chosen, each with the reason.
	Skipped []BuildLayer `json:"skipped,omitempty"`
	// NodeLayerSHA256 is the SHA-256 (hex) of the whole kiln-node partition
	// as the agent wrote it; SSHHostKeyFingerprint the node's SSH host key
	// ("SHA256:…", as ssh-keygen -l prints it). Both from the finalize report.
	NodeLayerSHA256       string    `json:"node_layer_sha256,omitempty"`
	SSHHostKeyFingerprint string    `json:"ssh_host_key_fingerprint,omitempty"`
	Hostname              string    `json:"hostname,omitempty"`
	Built                 time.Time `json:"built,omitempty"`
	// FirstBootTokenHash is the SHA-256 (hex) of this provisioning's
	// first-boot token (the bearer of POST /v1/agent/firstboot). A
	// credential digest: no API view shows it.
	FirstBootTokenHash string `json:"first_boot_token_hash,omitempty"`
	// FirstBootDeadline is when the first-boot policy applies if no report came.
	FirstBootDeadline time.Time `json:"first_boot_deadline,omitempty"`
	// FirstBoot is the installed OS's report, once received.
	FirstBoot *FirstBootRecord `json:"first_boot,omitempty"`
}

// BuildLayer is one layer of a build: the manifest's pin (Name, Image,
// SHA256, Size, PartName), why it was chosen or skipped (Reason, e.g.
// "pci 0000:01:00.0 10de:2204 class 0x030000"), and what the agent wrote
// (Written, from the finalize report).
type BuildLayer struct {
	Name     string        `json:"name"`
	Image    string        `json:"image"`
	SHA256   string        `json:"sha256"`
	Size     uint64        `json:"size_bytes"`
	PartName string        `json:"part_name,omitempty"`
	Reason   string        `json:"reason"`
	Written  *LayerWritten `json:"written,omitempty"`
}

// LayerWritten is a layer as the agent read it back after writing: its
// SHA-256 (hex), and where it starts on the disk and how long it is (bytes).
type LayerWritten struct {
	SHA256 string `json:"sha256"`
	Start  uint64 `json:"start"`
	Size   uint64 `json:"size_bytes"`
}

// FirstBootRecord is the installed OS's first-boot report (POST
// /v1/agent/firstboot) as recorded: closed-enum Phase, Outcome and Reason,
// the sanitised, truncated Message, what the OS read from its per-node
// layer, and Match (the hostname and SSH host key fingerprint equal the
// build record's).
type FirstBootRecord struct {
	At                    time.Time `json:"at"`
	Phase                 string    `json:"phase"`
	Outcome               string    `json:"outcome"`
	Reason                string    `json:"reason,omitempty"`
	Message               string    `json:"message,omitempty"`
	Hostname              string    `json:"hostname,omitempty"`
	SSHHostKeyFingerprint string    `json:"ssh_host_key_fingerprint,omitempty"`
	NodeLayerSHA256       string    `json:"node_layer_sha256,omitempty"`
	BootID                string    `json:"boot_id,omitempty"`
	Match                 bool      `json:"match"`
}
