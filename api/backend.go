package api

import (
	"context"
	"io"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/intake"
	"kiln/store"
)

// Backend is everything the REST API needs from the rest of the appliance:
// the domain's reads and writes (lifecycle.Service implements all but
// Health; the appliance adds Health, appliance/adapters.go). The API
// writes machine records only through the domain: CreateMachine,
// UpdateIntended and the lifecycle operations, which apply the field rules
// (package rules) themselves.
//
// Backend methods return store records; handlers answer with view types
// (view.go), so no record field reaches the wire unless a view names it.
//
// Errors: implementations return (possibly wrapped) store.ErrNotFound,
// store.ErrConflict, store.ErrNotLeader, *store.IllegalTransitionError,
// *intake.ErrRows, *rules.FieldError or *ValidationError; the API maps each
// to one HTTP status and stable code (see errors.go). Any other error is a
// 500 "internal".
type Backend interface {
	ListMachines(opt store.ListOptions) ([]store.Machine, string, error)
	GetMachine(id string) (store.Machine, error)
	// CreateMachine records one registered machine with intended fields in.
	CreateMachine(ctx context.Context, in lifecycle.Intended, w store.W) (store.Machine, error)
	// UpdateIntended changes intended fields with compare-and-set on
	// p.ResourceVersion (store.ErrConflict when the machine changed).
	UpdateIntended(ctx context.Context, id string, p lifecycle.IntendedPatch, w store.W) (store.Machine, error)
	ListSites() ([]store.Site, error)
	PutSite(ctx context.Context, s store.Site, w store.W) (store.Site, error)
	ListRacks() ([]store.Rack, error)
	PutRack(ctx context.Context, r store.Rack, w store.W) (store.Rack, error)
	ListImages() ([]store.Image, error)
	GetImage(id string) (store.Image, error)
	ListJobs(machine string) ([]store.Job, error)
	GetJob(id string) (store.Job, error)
	// Events returns up to limit events with Index > after, oldest first.
	Events(after uint64, limit int) ([]store.Event, error)
	// WaitEvents blocks until an event with Index > after exists or ctx ends
	// (then it returns ctx.Err()).
	WaitEvents(ctx context.Context, after uint64) error
	CountByState() (map[store.MachineState]int, error)
	// Barrier returns once this node's replica has applied everything the
	// leader had committed when it was called (forwarded to the leader):
	// the reads after it are current (?consistent=true). store.ErrNotLeader
	// when no leader is reachable.
	Barrier(ctx context.Context) error
	Health() Health

	// Lifecycle operations (lifecycle.Controller).

	// Import parses r as format "csv", "json" or "netbox" and creates the
	// machines as registered; a file with any bad row imports nothing
	// (*intake.ErrRows).
	Import(ctx context.Context, r io.Reader, format string, w store.W) (intake.Result, error)
	Provision(ctx context.Context, id string, c store.Claim, w store.W) (store.Machine, error)
	ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, c store.Claim, w store.W) ([]store.Machine, error)
	Release(ctx context.Context, id string, w store.W) (store.Machine, error)
	Erase(ctx context.Context, id string, w store.W) (store.Machine, error)
	Inspect(ctx context.Context, id string, w store.W) (store.Machine, error)
	// EnrollBMC stores the BMC and its encrypted credential; password is
	// write-only and never returned.
	EnrollBMC(ctx context.Context, machineID string, b store.BMC, password string, w store.W) (store.BMC, error)
	// UploadImage streams r into the image store; meta.SHA256 (hex) is the
	// declared digest and a mismatch is an error.
	UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error)
	DeleteImage(ctx context.Context, id string, w store.W) error
	// SetManifest makes image id a release (issue 15): layers pinned by
	// SHA-256, base first, and the kubeadm version it carries.
	SetManifest(ctx context.Context, id string, layers []store.Layer, kubeadm string, w store.W) (store.Image, error)

	// Day 2 (issue 14; remediation.go): health, drain, power, maintenance,
	// retire, rma, reprovision, the remediation status and the brake.
	RemediationBackend

	// Agent protocol (package agentapi).
	AgentRegister(ctx context.Context, machineID string, reg agentapi.Registration) (agentapi.Task, error)
	AgentTask(ctx context.Context, machineID string) (agentapi.Task, error)
	AgentReport(ctx context.Context, machineID string, rep agentapi.Report) error
	// VerifyAgentToken reports whether token is the current per-boot agent
	// token of machineID.
	VerifyAgentToken(machineID, token string) bool
	// Issue 15: the secret files of the per-node layer (behind the
	// credential gate), and the installed OS's first-boot report with its
	// token check.
	AgentCredentials(ctx context.Context, machineID string) (agentapi.Credentials, error)
	VerifyFirstBootToken(machineID, token string) bool
	FirstBoot(ctx context.Context, machineID string, rep agentapi.FirstBootReport) (store.Machine, error)
}

// Health is the appliance's view of itself, served by /readyz and
// /v1/site/status. Leader is the raft leader's address ("" when none);
// Stats holds raft statistics as strings (hashicorp/raft Stats()).
type Health struct {
	Leader   string            `json:"leader"`
	IsLeader bool              `json:"is_leader"`
	Ready    bool              `json:"ready"`
	Stats    map[string]string `json:"stats,omitempty"`
	Version  string            `json:"version"`
	// Halted is the store's halt error (store.Store.Halted): this node's
	// FSM stopped at a log entry of a command type its binary does not
	// know, and it applies nothing further until upgraded and restarted.
	// "" while it applies the log.
	Halted string `json:"halted,omitempty"`
}
