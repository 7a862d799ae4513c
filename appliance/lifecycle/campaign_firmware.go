package lifecycle

import (
	"context"
	"fmt"

	"kiln/store"
)

// baselineApplier is the campaigns' FirmwareApplier when Config.Firmware is
// nil and the controller has a BMC: the controller's own baseline apply
// (firmware.go ApplyBaselinePart), so a firmware or bios campaign rolls the
// machine's hardware-model baseline (store command 35) through Redfish
// UpdateService and the Bios settings resource, wave by wave.
//
//   - ApplyFirmware: baseline names the machine's model baseline (its
//     store.BaselineID, or "" for whatever the model's is); its firmware part
//     is applied. Another name is an error: one model has one baseline.
//   - ApplyBIOS: attrs must be part of the model baseline's BIOS attributes
//     (same values; `kiln baseline set --bios`), and the baseline's BIOS part
//     is applied: the baseline stays the one home of a model's settings.
//
// A run that ends other than succeeded is an error (ErrFirmwareUnsupported
// for an IPMI-only BMC), which fails the machine's wave.
type baselineApplier struct{ c *Controller }

func (a baselineApplier) ApplyFirmware(ctx context.Context, id, baseline string) error {
	bl, err := a.baseline(id)
	if err != nil {
		return err
	}
	if baseline != "" && baseline != bl.ID {
		return fmt.Errorf("%w: campaign baseline %q is not machine %s's model baseline %q", ErrInvalid, baseline, id, bl.ID)
	}
	return a.run(ctx, id, BaselineFirmware)
}

func (a baselineApplier) ApplyBIOS(ctx context.Context, id string, attrs map[string]string) error {
	bl, err := a.baseline(id)
	if err != nil {
		return err
	}
	for k, v := range attrs {
		if got, ok := bl.BIOS[k]; !ok || fmt.Sprint(got) != v {
			return fmt.Errorf("%w: BIOS attribute %s=%s is not in machine %s's model baseline %s (kiln baseline set --bios)", ErrInvalid, k, v, id, bl.ID)
		}
	}
	return a.run(ctx, id, BaselineBIOS)
}

func (a baselineApplier) baseline(id string) (store.Baseline, error) {
	m, err := a.c.st.GetMachine(id)
	if err != nil {
		return store.Baseline{}, err
	}
	vendor, model := hardwareModel(m)
	bl, err := a.c.st.BaselineFor(vendor, model)
	if err != nil {
		return store.Baseline{}, fmt.Errorf("%w: %q %q: %v", ErrNoBaseline, vendor, model, err)
	}
	return bl, nil
}

func (a baselineApplier) run(ctx context.Context, id, part string) error {
	res, err := a.c.ApplyBaselinePart(ctx, id, part, store.W{Actor: ActorCampaign, Reason: ReasonCampaignMachine}, nil)
	if err != nil {
		return err
	}
	if res.State != FWSucceeded {
		return fmt.Errorf("lifecycle: baseline %s (%s) on %s ended %s", res.Baseline, part, id, res.State)
	}
	return nil
}

// firmwareApplier is the campaigns' applier: Config.Firmware, else the
// controller's own baseline apply when it has a BMC, else nil.
func (c *Controller) firmwareApplier() FirmwareApplier {
	if c.cfg.Firmware != nil {
		return c.cfg.Firmware
	}
	if c.bmc != nil {
		return baselineApplier{c}
	}
	return nil
}
