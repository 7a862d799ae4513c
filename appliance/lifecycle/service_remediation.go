// Service's day-2 methods (issue 14), each answered by the Controller
// (the only writer of machine records) or, for the status, by a store read.

package lifecycle

import (
	"context"
	"sort"
	"time"

	"kiln/store"
)

func (s *Service) ReportHealth(ctx context.Context, id, condType, status, reason, message string, w store.W) (store.Machine, error) {
	return s.c.ReportHealth(ctx, id, condType, status, reason, message, w)
}
func (s *Service) DrainAck(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.DrainAck(ctx, id, w)
}
func (s *Service) Power(ctx context.Context, id, action string, w store.W) (store.Machine, error) {
	return s.c.Power(ctx, id, action, w)
}
func (s *Service) SetMaintenance(ctx context.Context, id string, on bool, w store.W) (store.Machine, error) {
	return s.c.SetMaintenance(ctx, id, on, w)
}
func (s *Service) Retire(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.Retire(ctx, id, w)
}
func (s *Service) RMA(ctx context.Context, id string, skipErase bool, w store.W) (store.Machine, error) {
	return s.c.RMA(ctx, id, skipErase, w)
}
func (s *Service) Reprovision(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return s.c.Reprovision(ctx, id, w)
}
func (s *Service) ResumeRemediation(ctx context.Context, w store.W) (store.RepairBrake, error) {
	return s.c.ResumeRemediation(ctx, w)
}
func (s *Service) RemediationStatus() (RemediationStatus, error) { return s.c.RemediationStatus() }

// RemediationStatus is `kiln remediation status` (GET /v1/remediation):
// the mode, the brake record, the spare pool per class and every machine
// with a ladder run in progress, in maintenance, or rma.
type RemediationStatus struct {
	Mode     string
	Brake    store.RepairBrake
	Spares   []SparePool
	Machines []RemediationEntry
}

// RemediationEntry is one machine of RemediationStatus.
type RemediationEntry struct {
	ID, Name, Rack string
	State          store.MachineState
	Maintenance    *store.Maintenance
	Step           string
	Attempt        int
	Why            string
	Deadline       time.Time
	Outcome        string
	Spare          string
}

// RemediationStatus reads the status from the local replica.
func (c *Controller) RemediationStatus() (RemediationStatus, error) {
	b, err := c.brake()
	if err != nil {
		return RemediationStatus{}, err
	}
	all, err := c.listAll(store.ListOptions{})
	if err != nil {
		return RemediationStatus{}, err
	}
	out := RemediationStatus{Mode: c.cfg.Remediation.Mode, Brake: b, Spares: c.sparePools(all)}
	for _, m := range all {
		if !active(m) && m.Maintenance == nil && m.State != store.StateRMA {
			continue
		}
		e := RemediationEntry{ID: m.ID, Name: m.Name, Rack: m.Rack, State: m.State, Maintenance: m.Maintenance}
		if r := m.Remediation; r != nil {
			e.Step, e.Attempt, e.Why, e.Deadline, e.Outcome, e.Spare = r.Step, r.Attempt, r.Why, r.Deadline, r.Outcome, r.Spare
		}
		out.Machines = append(out.Machines, e)
	}
	sort.Slice(out.Machines, func(i, j int) bool { return out.Machines[i].ID < out.Machines[j].ID })
	return out, nil
}
