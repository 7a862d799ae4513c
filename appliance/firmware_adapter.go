package appliance

// The firmware/BIOS side of bmcAdapter (lifecycle.FirmwareBMC, issue 17):
// each call opens the machine's enrolled target and calls kiln/bmc.

import (
	"context"
	"fmt"

	"kiln/api"
	"kiln/appliance/lifecycle"
	"kiln/bmc"
)

var _ lifecycle.FirmwareBMC = (*bmcAdapter)(nil)

func wrapBMC(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bmc %s (%s): %w", what, bmc.Reason(err), err)
}

// FirmwareInventory is the BMC's UpdateService/FirmwareInventory.
func (a *bmcAdapter) FirmwareInventory(ctx context.Context, id string) ([]bmc.FirmwareComponent, error) {
	t, err := a.target(id)
	if err != nil {
		return nil, err
	}
	out, err := a.ctl.FirmwareInventory(ctx, t)
	return out, wrapBMC("firmware inventory", err)
}

// UpdateFirmware runs one update and follows its task.
func (a *bmcAdapter) UpdateFirmware(ctx context.Context, id string, u bmc.FirmwareUpdate) (bmc.TaskStatus, error) {
	t, err := a.target(id)
	if err != nil {
		return bmc.TaskStatus{}, err
	}
	st, err := a.ctl.UpdateFirmware(ctx, t, u)
	return st, wrapBMC("firmware update", err)
}

// BIOSAttributes reads the Bios resource and its settings object.
func (a *bmcAdapter) BIOSAttributes(ctx context.Context, id string) (bmc.BIOS, error) {
	t, err := a.target(id)
	if err != nil {
		return bmc.BIOS{}, err
	}
	b, err := a.ctl.BIOSAttributes(ctx, t)
	return b, wrapBMC("bios", err)
}

// ApplyBIOSAttributes stages attrs, resets the machine and reads them back.
func (a *bmcAdapter) ApplyBIOSAttributes(ctx context.Context, id string, attrs map[string]any) (bmc.BIOS, error) {
	t, err := a.target(id)
	if err != nil {
		return bmc.BIOS{}, err
	}
	b, err := a.ctl.ApplyBIOSAttributes(ctx, t, attrs, 0)
	return b, wrapBMC("bios apply", err)
}

// ResetSystem restarts the machine (powers it on when off).
func (a *bmcAdapter) ResetSystem(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	return wrapBMC("reset", a.ctl.ResetSystem(ctx, t))
}

var _ api.FirmwareBackend = (*apiBackend)(nil)
