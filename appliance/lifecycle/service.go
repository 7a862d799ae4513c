// Service, the domain as the REST API sees it (package api's Backend): who
// answers each method.

package lifecycle

import (
	"context"
	"io"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/intake"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Records is the part of *store.Store that Service reads, and writes for
// sites and racks; machine records are not written through it (Service
// sends every machine write to the Controller). Signatures and errors per
// the store's docs.
type Records interface {
	GetMachine(id string) (store.Machine, error)
	ListMachines(opt store.ListOptions) ([]store.Machine, string, error)
	CountByState() (map[store.MachineState]int, error)
	ListSites() ([]store.Site, error)
	PutSite(ctx context.Context, s store.Site, w store.W) (store.Site, error)
	ListRacks() ([]store.Rack, error)
	PutRack(ctx context.Context, r store.Rack, w store.W) (store.Rack, error)
	GetImage(id string) (store.Image, error)
	ListImages() ([]store.Image, error)
	ListJobs(machine string) ([]store.Job, error)
	GetJob(id string) (store.Job, error)
	Events(after uint64, limit int) ([]store.Event, error)
	WaitEvents(ctx context.Context, after uint64) error
	Barrier(ctx context.Context) error
}

// Service is the domain as the REST API sees it (package api's Backend,
// all but Health, which the appliance adds): each method says here who
// answers it. Reads come from the store's local replica (Records); machine
// writes, images, BMC enrolment and the agent protocol go to the
// Controller, the only writer of machine records; sites and racks are
// written to the store as they are (they carry no lifecycle).
type Service struct {
	c *Controller
	r Records
}

// NewService returns the Service of controller c over records r (the same
// store the controller writes).
func NewService(c *Controller, r Records) *Service { return &Service{c: c, r: r} }

// Reads (Records, the local replica).

func (s *Service) ListMachines(opt store.ListOptions) ([]store.Machine, string, error) {
	return s.r.ListMachines(opt)
}
func (s *Service) GetMachine(id string) (store.Machine, error)       { return s.r.GetMachine(id) }
func (s *Service) CountByState() (map[store.MachineState]int, error) { return s.r.CountByState() }
func (s *Service) ListSites() ([]store.Site, error)                  { return s.r.ListSites() }
func (s *Service) ListRacks() ([]store.Rack, error)                  { return s.r.ListRacks() }
func (s *Service) ListImages() ([]store.Image, error)                { return s.r.ListImages() }
func (s *Service) GetImage(id string) (store.Image, error)           { return s.r.GetImage(id) }
func (s *Service) ListJobs(machine string) ([]store.Job, error)      { return s.r.ListJobs(machine) }
func (s *Service) GetJob(id string) (store.Job, error)               { return s.r.GetJob(id) }
func (s *Service) Events(after uint64, limit int) ([]store.Event, error) {
	return s.r.Events(after, limit)
}
func (s *Service) WaitEvents(ctx context.Context, after uint64) error {
	return s.r.WaitEvents(ctx, after)
}
func (s *Service) Barrier(ctx context.Context) error { return s.r.Barrier(ctx) }
func (s *Service) VerifyAgentToken(machineID, token string) bool {
	return s.c.VerifyAgentToken(machineID, token)
}
func (s *Service) AgentTask(ctx context.Context, id string) (agentapi.Task, error) {
	return s.c.AgentTask(ctx, id)
}

// Sites and racks (Records), checked by rules.CheckSite and rules.CheckRack
// (ErrInvalid wrapping *rules.FieldError). ResourceVersion 0 creates: a
// chosen ID that names a stored record is store.ErrConflict, refused by the
// store's apply (store.Store.PutSite), so two creates of one ID never both
// succeed. ResourceVersion ≠ 0 updates with compare-and-set.

func (s *Service) PutSite(ctx context.Context, v store.Site, w store.W) (store.Site, error) {
	if err := rules.CheckSite(v); err != nil {
		return store.Site{}, invalidField(err)
	}
	return s.r.PutSite(ctx, v, w)
}

func (s *Service) PutRack(ctx context.Context, v store.Rack, w store.W) (store.Rack, error) {
	if err := rules.CheckRack(v); err != nil {
		return store.Rack{}, invalidField(err)
	}
	return s.r.PutRack(ctx, v, w)
}

// Machine writes (Controller).

func (s *Service) CreateMachine(ctx context.Context, in Intended, w store.W) (store.Machine, error) {
	return s.c.CreateMachine(ctx, in, w)
}
func (s *Service) UpdateIntended(ctx context.Context, id string, p IntendedPatch, w store.W) (store.Machine, error) {
	return s.c.UpdateIntended(ctx, id, p, w)
}
func (s *Service) Import(ctx context.Context, r io.Reader, format string, w store.W) (intake.Result, error) {
	return s.c.Import(ctx, r, format, w)
}
func (s *Service) Provision(ctx context.Context, id string, cl store.Claim, w store.W) (store.Machine, error) {
	return s.c.Provision(ctx, id, cl, w)
}
func (s *Service) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, cl store.Claim, w store.W) ([]store.Machine, error) {
	return s.c.ClaimMachines(ctx, role, labels, n, cl, w)
}
func (s *Service) Release(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.Release(ctx, id, w)
}
func (s *Service) Erase(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.Erase(ctx, id, w)
}
func (s *Service) Inspect(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.Inspect(ctx, id, w)
}
func (s *Service) EnrollBMC(ctx context.Context, machineID string, b store.BMC, password string, w store.W) (store.BMC, error) {
	return s.c.EnrollBMC(ctx, machineID, b, password, w)
}

// Images (Controller: the catalog file and the record together).

func (s *Service) UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error) {
	return s.c.UploadImage(ctx, meta, r, w)
}
func (s *Service) SetManifest(ctx context.Context, id string, layers []store.Layer, kubeadm string, w store.W) (store.Image, error) {
	return s.c.SetManifest(ctx, id, layers, kubeadm, w)
}
func (s *Service) DeleteImage(ctx context.Context, id string, w store.W) error {
	return s.c.DeleteImage(ctx, id, w)
}

// The agent protocol (Controller).

func (s *Service) AgentRegister(ctx context.Context, id string, reg agentapi.Registration) (agentapi.Task, error) {
	return s.c.AgentRegister(ctx, id, reg)
}
func (s *Service) AgentCredentials(ctx context.Context, id string) (agentapi.Credentials, error) {
	return s.c.AgentCredentials(ctx, id)
}
func (s *Service) VerifyFirstBootToken(id, token string) bool {
	return s.c.VerifyFirstBootToken(id, token)
}
func (s *Service) FirstBoot(ctx context.Context, id string, rep agentapi.FirstBootReport) (store.Machine, error) {
	return s.c.FirstBoot(ctx, id, rep)
}
func (s *Service) AgentReport(ctx context.Context, id string, rep agentapi.Report) error {
	return s.c.AgentReport(ctx, id, rep)
}
