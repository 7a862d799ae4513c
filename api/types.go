package api

import (
	"context"
	"time"

	"kiln/store"
)

// Request and response bodies of the API (JSON). Request bodies reject
// unknown fields (400 "unknown_field" naming the field).

// MachineList is a page of GET /v1/machines. Next is the cursor for
// ?after= of the next page; "" on the last page.
type MachineList struct {
	Items []Machine `json:"items"`
	Next  string    `json:"next,omitempty"`
}

// SiteList is GET /v1/sites.
type SiteList struct {
	Items []Site `json:"items"`
}

// RackList is GET /v1/racks (optionally ?site=ID).
type RackList struct {
	Items []Rack `json:"items"`
}

// ImageList is GET /v1/images.
type ImageList struct {
	Items []Image `json:"items"`
}

// JobList is GET /v1/jobs (optionally ?machine=ID).
type JobList struct {
	Items []Job `json:"items"`
}

// EventList is GET /v1/events. Next is the cursor to pass as ?after= next
// time: the Index of the last event returned, or the request's after when
// none were.
type EventList struct {
	Events []Event `json:"events"`
	Next   uint64  `json:"next"`
}

// SiteSpec creates (POST /v1/sites; ID optional, assigned when empty) or
// updates (PUT /v1/sites/{id}; ResourceVersion required) a site.
type SiteSpec struct {
	ID              string `json:"id,omitempty"`
	ResourceVersion uint64 `json:"resource_version,omitempty"`
	Name            string `json:"name"`
	Description     string `json:"description,omitempty"`
}

// RackSpec creates or updates a rack, like SiteSpec. Units in rack units (U).
type RackSpec struct {
	ID              string `json:"id,omitempty"`
	ResourceVersion uint64 `json:"resource_version,omitempty"`
	Site            string `json:"site"`
	Name            string `json:"name"`
	Row             string `json:"row,omitempty"`
	Units           int    `json:"units,omitempty"`
}

// MachineSpec creates one machine (POST /v1/machines) as registered, with
// its intended fields. Import creates many at once.
type MachineSpec struct {
	Name         string            `json:"name,omitempty"`
	Site         string            `json:"site,omitempty"`
	Rack         string            `json:"rack,omitempty"`
	RackUnit     int               `json:"rack_unit,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Intended     store.Hardware    `json:"intended"`
	RootDisk     store.DiskRule    `json:"root_disk"`
	Wipe         bool              `json:"wipe,omitempty"`
	BootMode     store.BootMode    `json:"boot_mode,omitempty"`
	IPv4         string            `json:"ipv4,omitempty"`
	BootOverride string            `json:"boot_override,omitempty"`
	Netboot      *bool             `json:"netboot,omitempty"`
}

// MachinePatch updates intended fields of a machine (PATCH
// /v1/machines/{id}). ResourceVersion is required and must equal the
// machine's current one, else 409 "conflict". Absent (null) fields are left
// as they are; Labels and Intended replace the whole value. State is not
// patchable: it changes only through actions.
type MachinePatch struct {
	ResourceVersion uint64             `json:"resource_version"`
	Name            *string            `json:"name,omitempty"`
	Site            *string            `json:"site,omitempty"`
	Rack            *string            `json:"rack,omitempty"`
	RackUnit        *int               `json:"rack_unit,omitempty"`
	Labels          *map[string]string `json:"labels,omitempty"`
	Intended        *store.Hardware    `json:"intended,omitempty"`
	RootDisk        *store.DiskRule    `json:"root_disk,omitempty"`
	Wipe            *bool              `json:"wipe,omitempty"`
	BootMode        *store.BootMode    `json:"boot_mode,omitempty"`
	IPv4            *string            `json:"ipv4,omitempty"`
	BootOverride    *string            `json:"boot_override,omitempty"`
	Netboot         *bool              `json:"netboot,omitempty"`
}

// ActionRequest is the optional body of release, erase and inspect: why.
type ActionRequest struct {
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// ManifestRequest is PUT /v1/images/{id}/manifest: make the image a
// release. Layers start with the base layer; KubeadmVersion is required.
type ManifestRequest struct {
	KubeadmVersion string  `json:"kubeadm_version"`
	Layers         []Layer `json:"layers"`
	Reason         string  `json:"reason,omitempty"`
}

// ProvisionRequest is POST /v1/machines/{id}/provision. Claim.Image is required.
type ProvisionRequest struct {
	Claim  Claim  `json:"claim"`
	Reason string `json:"reason,omitempty"`
}

// ClaimRequest is POST /v1/machines/claim: claim Count available machines
// matching Role and Labels and provision them with Claim (Claim.Role is set
// to Role). All or nothing.
type ClaimRequest struct {
	Role   string            `json:"role"`
	Labels map[string]string `json:"labels,omitempty"`
	Count  int               `json:"count"`
	Claim  Claim             `json:"claim"`
	Reason string            `json:"reason,omitempty"`
}

// ClaimResponse lists the claimed machines.
type ClaimResponse struct {
	Items []Machine `json:"items"`
}

// BMCEnrollRequest is POST /v1/machines/{id}/bmc. Password is write-only: it
// is stored encrypted and never returned by any route. Driver is redfish,
// ipmi or auto (default auto).
type BMCEnrollRequest struct {
	Address     string `json:"address"`
	Driver      string `json:"driver,omitempty"`
	Username    string `json:"username"`
	Password    string `json:"password"`
	InsecureTLS bool   `json:"insecure_tls,omitempty"`
	CACertPEM   string `json:"ca_cert_pem,omitempty"`
}

// ImportResult is the 201 body of POST /v1/machines/import.
type ImportResult struct {
	Created int      `json:"created"`
	IDs     []string `json:"ids"`
}

// MachineSummary is a short line about one machine (site status failures).
type MachineSummary struct {
	ID      string             `json:"id"`
	Name    string             `json:"name,omitempty"`
	Rack    string             `json:"rack,omitempty"`
	State   store.MachineState `json:"state"`
	Reason  string             `json:"reason,omitempty"`
	Message string             `json:"message,omitempty"`
	Updated time.Time          `json:"updated_at"`
}

// ImageVersion names one catalog image (site status versions). Nodes lists
// the IDs of the cluster nodes whose image file is the recorded content
// (sorted; verified by each node itself, appliance/imagesync.go): the image
// is offered for provisioning from those nodes. It is null when the
// backend does not report presence (ImagePresenceBackend).
type ImageVersion struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Version string   `json:"version"`
	SHA256  string   `json:"sha256"`
	Nodes   []string `json:"nodes"`
}

// ImagePresenceBackend is implemented by a Backend that knows which node
// holds which image file: image ID → node IDs. A node that did not answer is
// left out of the map and named in the error, and the status is still served.
type ImagePresenceBackend interface {
	ImagePresence(ctx context.Context) (map[string][]string, error)
}

// SiteStatus is GET /v1/site/status, what central pulls: machine counts by
// state (every state present, zeros included), up to FailuresInStatus failed
// machines, the software and image versions, and raft health.
type SiteStatus struct {
	Time     time.Time                  `json:"time"`
	Total    int                        `json:"total"`
	Counts   map[store.MachineState]int `json:"counts"`
	Failures []MachineSummary           `json:"failures"`
	Version  string                     `json:"version"`
	Images   []ImageVersion             `json:"images"`
	Raft     Health                     `json:"raft"`
	// Environment compares the in-RAM environment of every node; null when
	// the backend does not report it (EnvBackend).
	Environment *EnvStatus `json:"environment"`
}

// EnvStatus is the in-RAM environment across the site's nodes (issue 12:
// its build is reproducible, so its digests must match on every node; a
// mismatch is reported, and not served). Site is the set of digests (file
// name → hex SHA-256) that a strict majority of the reporting nodes serve,
// absent when there is none; Mismatch is true when some reporting node
// differs from Site or there is no majority. A node whose environment is
// not Site's does not serve it (/env/* answers 503).
type EnvStatus struct {
	Site     map[string]string `json:"site,omitempty"`
	Mismatch bool              `json:"mismatch"`
	Nodes    []EnvNode         `json:"nodes"`
}

// EnvNode is one node's environment as its version record reports it.
// Files is empty for a node that reports none (an older binary, or no
// environment files); Match says Files equal EnvStatus.Site (false when
// there is no Site, or Files is empty).
type EnvNode struct {
	Node  string            `json:"node"`
	Files map[string]string `json:"files,omitempty"`
	Match bool              `json:"match"`
}

// EnvBackend is implemented by a Backend that compares the in-RAM
// environment across nodes (site status).
type EnvBackend interface {
	EnvStatus() (*EnvStatus, error)
}

// Status is the body of /healthz and /readyz.
type Status struct {
	Status string `json:"status"` // ok | not_ready
	Leader string `json:"leader,omitempty"`
	// Error says why a node is not ready when it is more than waiting for
	// a leader: the store's halt error (Health.Halted).
	Error string `json:"error,omitempty"`
}
