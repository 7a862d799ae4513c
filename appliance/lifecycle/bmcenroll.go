// BMC enrollment and inventory: EnrollBMC seals the password (Config.Sealer)
// and records the BMC; readInventory merges what the BMC knows of its
// machine (BMCInventory) into the discovered fields. No per-node state.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Sealer encrypts a secret (a BMC password) for storage.
type Sealer interface {
	Seal(plain []byte) ([]byte, error)
}

// EnrollBMC records b for machine machineID: password is sealed with
// Config.Sealer and stored with PutSecret under "bmc/<machineID>"
// (b.CredentialRef), the BMC record is created or updated, and the machine
// points at it. The password is never stored or returned in clear. Then,
// when the BMC offers an inventory (BMCInventory), it is read into the
// machine's discovered fields (readInventory; a failed read is an event,
// not an error). Errors: ErrNoSealer, ErrInvalid wrapping the
// *rules.FieldError of rules.CheckBMC (address, driver, username, password),
// store errors.
func (c *Controller) EnrollBMC(ctx context.Context, machineID string, b store.BMC, password string, w store.W) (store.BMC, error) {
	if c.cfg.Sealer == nil {
		return store.BMC{}, ErrNoSealer
	}
	if err := rules.CheckBMC(&b, password); err != nil {
		return store.BMC{}, invalidField(err)
	}
	m, err := c.st.GetMachine(machineID)
	if err != nil {
		return store.BMC{}, fmt.Errorf("lifecycle: enroll BMC for %s: %w", machineID, err)
	}
	w = withDefaults(w, "bmc_enrolled")
	b.ID, b.ResourceVersion = "", 0
	if m.BMC != "" {
		old, err := c.st.GetBMC(m.BMC)
		if err == nil {
			b.ID, b.ResourceVersion = old.ID, old.ResourceVersion
		} else if !errors.Is(err, store.ErrNotFound) {
			return store.BMC{}, err
		}
	}
	pw := []byte(password)
	sealed, err := c.cfg.Sealer.Seal(pw)
	clear(pw)
	if err != nil {
		return store.BMC{}, fmt.Errorf("lifecycle: seal BMC credential: %w", err)
	}
	key := "bmc/" + machineID
	if err := c.st.PutSecret(ctx, key, sealed, w); err != nil {
		return store.BMC{}, fmt.Errorf("lifecycle: store BMC credential: %w", err)
	}
	b.CredentialRef = key
	out, err := c.st.PutBMC(ctx, b, w)
	if err != nil {
		return store.BMC{}, fmt.Errorf("lifecycle: store BMC: %w", err)
	}
	if m.BMC != out.ID {
		if _, err := c.update(ctx, machineID, w, func(m *store.Machine) error {
			m.BMC = out.ID
			return nil
		}); err != nil {
			return out, err
		}
	}
	c.readInventory(ctx, machineID, w)
	c.readFirmwareQuiet(ctx, machineID)
	return out, nil
}

// BMCInventory is optionally implemented by the Config's BMC: what the BMC
// knows of its machine (Redfish ComputerSystem and EthernetInterfaces).
// ErrNoInventory (wrapped) when the BMC offers none (IPMI); other errors
// are the BMC's.
type BMCInventory interface {
	Inventory(ctx context.Context, machineID string) (Inventory, error)
}

// Inventory is a BMC's description of its machine; "" or nil where the BMC
// gave nothing. NICMACs are MACs in any case or separator form.
type Inventory struct {
	Serial       string
	Manufacturer string
	Model        string
	UUID         string
	NICMACs      []string
}

// ErrNoInventory: the machine's BMC offers no inventory (not a failure).
var ErrNoInventory = errors.New("lifecycle: the BMC offers no inventory")

// bmcInventoryTimeout bounds the inventory read that follows an enrollment.
const bmcInventoryTimeout = 15 * time.Second

// readInventory reads the BMC's inventory of machine id into its
// discovered fields (mergeInventory), so the site team sees what stands in
// the slot before it ever boots; the agent's inspection later replaces
// them with its fuller report. A failed read is recorded as an event
// (kind bmc_inventory, to failed, reason bmc_failed) and not returned: the
// enrollment stands either way.
func (c *Controller) readInventory(ctx context.Context, id string, w store.W) {
	bi, ok := c.bmc.(BMCInventory)
	if !ok || c.bmc == nil {
		return
	}
	ictx, cancel := context.WithTimeout(ctx, bmcInventoryTimeout)
	defer cancel()
	inv, err := bi.Inventory(ictx, id)
	switch {
	case errors.Is(err, ErrNoInventory):
		return
	case err != nil:
		if aerr := c.st.AppendEvents(ctx, []store.Event{{Subject: "machine/" + id, Kind: "bmc_inventory", To: "failed",
			Actor: w.Actor, Reason: ReasonBMCFailed, Message: truncate(sanitize(err.Error()), rules.MaxDescriptionLen)}}); aerr != nil {
			c.logger().Warn("bmc inventory failed; recording it failed too", "machine", id, "err", err, "record_err", aerr)
		}
		return
	}
	if _, err := c.update(ctx, id, store.W{Actor: "bmc", Reason: "bmc_inventory"}, func(m *store.Machine) error {
		mergeInventory(m, inv)
		return nil
	}); err != nil {
		c.logger().Warn("record bmc inventory", "machine", id, "err", err)
	}
}

// mergeInventory fills m.Discovered from a BMC's inventory where the BMC
// offered a value (free text sanitised and cut to rules.MaxTextLen); NICs
// it lists are added, in lower-case colon form, if not already known. MACs
// store.ParseMachineMAC refuses are skipped.
func mergeInventory(m *store.Machine, inv Inventory) {
	if m.Discovered == nil {
		m.Discovered = &store.Hardware{}
	}
	d := m.Discovered
	set := func(dst *string, v string) {
		if v = truncate(sanitize(v), rules.MaxTextLen); v != "" {
			*dst = v
		}
	}
	set(&d.Serial, inv.Serial)
	set(&d.Vendor, inv.Manufacturer)
	set(&d.Model, inv.Model)
	set(&d.UUID, inv.UUID)
	for _, s := range inv.NICMACs {
		mac, err := store.ParseMachineMAC(s)
		if err != nil {
			continue
		}
		known := false
		for _, n := range d.NICs {
			if strings.EqualFold(n.MAC, mac) {
				known = true
				break
			}
		}
		if !known {
			d.NICs = append(d.NICs, store.NIC{MAC: mac})
		}
	}
}
