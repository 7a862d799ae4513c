package lifecycle

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/intake"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Import parses r (format csv|json|netbox, see package intake), checks
// every row's machine by the record rule (rules.CheckIntended, as
// CreateMachine and UpdateIntended do) and creates every row as a
// registered machine in one all-or-nothing store command
// (store.ImportMachines, create only). A row whose name, serial, BMC MAC or
// NIC MAC is held by a stored machine or by an earlier row is a bad row,
// decided inside the store's raft apply so that concurrent imports cannot
// both take a value. Errors: *intake.ErrRows (line and field of every bad
// row; nothing imported), intake.ErrFormat, intake.ErrEmpty, store errors.
func (c *Controller) Import(ctx context.Context, r io.Reader, format string, w store.W) (intake.Result, error) {
	rows, err := intake.ParseRows(r, format)
	if err != nil {
		return intake.Result{}, err
	}
	ms := make([]store.Machine, len(rows))
	var bad []intake.RowError
	for i, row := range rows {
		ms[i] = row.Machine
		// The record rule every other path applies (CreateMachine,
		// UpdateIntended): what an import accepts, a later PATCH accepts.
		var fe *rules.FieldError
		if err := rules.CheckIntended(&ms[i], true); errors.As(err, &fe) {
			bad = append(bad, intake.RowError{Line: row.Line, Field: fe.Field, Msg: fe.Msg})
		} else if err != nil {
			return intake.Result{}, err
		}
	}
	if len(bad) > 0 {
		return intake.Result{}, &intake.ErrRows{Rows: bad}
	}
	out, err := c.st.ImportMachines(ctx, ms, withDefaults(w, "imported"))
	var ice *store.ImportConflictError
	if errors.As(err, &ice) {
		return intake.Result{}, conflictRows(rows, ice.Conflicts)
	}
	if err != nil {
		return intake.Result{}, fmt.Errorf("lifecycle: import %d machines: %w", len(ms), err)
	}
	res := intake.Result{Created: len(out), IDs: make([]string, len(out))}
	for i, m := range out {
		res.IDs[i] = m.ID
	}
	return res, nil
}

// conflictRows turns the store's import conflicts into bad rows with the
// file's lines and columns.
func conflictRows(rows []intake.Row, cs []store.Conflict) *intake.ErrRows {
	bad := make([]intake.RowError, 0, len(cs))
	for _, cf := range cs {
		line := 0
		if cf.Index >= 0 && cf.Index < len(rows) {
			line = rows[cf.Index].Line
		}
		what := fmt.Sprintf("%s %q", cf.Field, cf.Value)
		if cf.Field == "macs" || cf.Field == "bmc_mac" {
			what = "mac " + cf.Value
		}
		msg := what + " already belongs to machine " + cf.Holder
		if cf.HolderName != "" {
			msg += " (" + cf.HolderName + ")"
		}
		if cf.Holder == "" && cf.HolderIndex >= 0 && cf.HolderIndex < len(rows) {
			msg = fmt.Sprintf("%s already used on line %d", what, rows[cf.HolderIndex].Line)
		}
		bad = append(bad, intake.RowError{Line: line, Field: cf.Field, Msg: msg})
	}
	return &intake.ErrRows{Rows: bad}
}

// checkClaim applies the claim rule (rules.CheckClaim). That its image
// exists is the store's rule, checked when the claim is written
// (store.PutMachine), so that a concurrent DeleteImage cannot slip in
// between.
func (c *Controller) checkClaim(cl store.Claim) error {
	return invalidField(rules.CheckClaim("claim", cl))
}

// Provision places claim c on available machine id (its agent then starts
// the gated build, see AgentTask). When the machine's agent has not been
// heard from recently and the machine has a BMC, it is PXE-booted
// (boot_pxe, power_cycle jobs). Errors: ErrInvalid (claim), *StateError
// (not available, or already claimed), store.ErrInvalid (claim.image names
// no stored image), store errors.
func (c *Controller) Provision(ctx context.Context, id string, cl store.Claim, w store.W) (store.Machine, error) {
	if err := c.checkClaim(cl); err != nil {
		return store.Machine{}, err
	}
	w = withDefaults(w, ReasonClaimed)
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if m.State != store.StateAvailable {
			return &StateError{Op: "provision", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable}}
		}
		if m.Claim != nil {
			return &StateError{Op: "provision", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable},
				Claimed: true, ClaimedImage: m.Claim.Image}
		}
		claim := cl
		m.Claim = &claim
		return nil
	})
	if err != nil {
		return m, err
	}
	c.wakeForClaim(ctx, m)
	return m, nil
}

// wakeForClaim PXE-boots a claimed machine whose agent is not running.
func (c *Controller) wakeForClaim(ctx context.Context, m store.Machine) {
	if m.BMC == "" || c.bmc == nil || c.agentAlive(m.ID) {
		return
	}
	id := m.ID
	if _, err := c.enqueuePXEBoot(ctx, m, func(ctx context.Context, err error) {
		if err != nil {
			c.logger().Warn("power claimed machine", "machine", id, "err", err)
		}
	}); err != nil {
		c.logger().Warn("queue power for claimed machine", "machine", id, "err", err)
	}
}

// maxClaim bounds ClaimMachines' n.
const maxClaim = 1000

// ClaimMachines claims n available, unclaimed machines whose labels match
// labels (all-or-nothing, one store command), each with claim cl and Role
// role. Machines are picked across racks round-robin (fewest per rack),
// then by ID. Errors: ErrInvalid, ErrNotEnough, store errors.
func (c *Controller) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, cl store.Claim, w store.W) ([]store.Machine, error) {
	if n < 1 || n > maxClaim {
		return nil, fmt.Errorf("%w: n %d: want 1..%d", ErrInvalid, n, maxClaim)
	}
	if err := c.checkClaim(cl); err != nil {
		return nil, err
	}
	w = withDefaults(w, ReasonClaimed)
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		avail, err := c.listAll(store.ListOptions{State: store.StateAvailable, Labels: labels})
		if err != nil {
			return nil, err
		}
		var free []store.Machine
		for _, m := range avail {
			if m.Claim == nil && m.State == store.StateAvailable && matchLabels(m.Labels, labels) {
				free = append(free, m)
			}
		}
		if len(free) < n {
			return nil, fmt.Errorf("%w: want %d with labels %v, %d free", ErrNotEnough, n, labels, len(free))
		}
		picked := spreadPick(free, n)
		for i := range picked {
			claim := cl
			claim.Role = role
			picked[i].Claim = &claim
		}
		out, err := c.st.PutMachines(ctx, picked, w)
		if errors.Is(err, store.ErrConflict) {
			last = err
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lifecycle: claim %d machines: %w", n, err)
		}
		for _, m := range out {
			c.wakeForClaim(ctx, m)
		}
		return out, nil
	}
	return nil, fmt.Errorf("lifecycle: claim %d machines: %w", n, last)
}

func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// spreadPick takes n machines round-robin over racks (racks in name order,
// machines by ID), so a claim does not concentrate on one rack.
func spreadPick(ms []store.Machine, n int) []store.Machine {
	byRack := map[string][]store.Machine{}
	var racks []string
	for _, m := range ms {
		if _, ok := byRack[m.Rack]; !ok {
			racks = append(racks, m.Rack)
		}
		byRack[m.Rack] = append(byRack[m.Rack], m)
	}
	sort.Strings(racks)
	for _, r := range racks {
		l := byRack[r]
		sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
	}
	out := make([]store.Machine, 0, n)
	for i := 0; len(out) < n; i++ {
		for _, r := range racks {
			if i < len(byRack[r]) && len(out) < n {
				out = append(out, byRack[r][i])
			}
		}
	}
	return out
}

// Release gives a machine back: provisioned or failed → erasing (reason
// released; the claim is dropped, the agent erases the disks, then the
// machine is available again). An available machine whose build has not
// started just loses its claim. With a BMC the machine is PXE-booted.
// Errors: *StateError, store errors.
func (c *Controller) Release(ctx context.Context, id string, w store.W) (store.Machine, error) {
	w = withDefaults(w, ReasonReleased)
	cur, err := c.st.GetMachine(id)
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: release %s: %w", id, err)
	}
	if cur.State == store.StateAvailable && cur.Claim != nil {
		return c.update(ctx, id, w, func(m *store.Machine) error {
			if m.State != store.StateAvailable {
				return &StateError{Op: "release", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable}}
			}
			m.Claim = nil
			return nil
		})
	}
	return c.startErase(ctx, "release", id, []store.MachineState{store.StateProvisioned, store.StateFailed}, w)
}

// Erase moves an available, failed, quarantined or provisioned machine to
// erasing (reason erase_requested); the agent wipes its disks, then it is
// available, or inspecting when it must be inspected again first (see
// AgentReport). A quarantined machine's hardware is not trusted: it is
// erasing with reason erase_quarantined (whatever reason w gives; w's
// reason and message still go to the transition event), and that reason
// is the durable marker that sends it to inspection after the erase.
// Errors: *StateError, store errors.
func (c *Controller) Erase(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return c.startErase(ctx, "erase", id, []store.MachineState{store.StateAvailable, store.StateFailed,
		store.StateQuarantined, store.StateProvisioned}, withDefaults(w, ReasonEraseRequested))
}

func (c *Controller) startErase(ctx context.Context, op, id string, from []store.MachineState, w store.W) (store.Machine, error) {
	now := c.now()
	wasAvailable := false
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(from, m.State) {
			return &StateError{Op: op, Machine: id, State: m.State, Want: from}
		}
		wasAvailable = m.State == store.StateAvailable
		m.Reason, m.Message = w.Reason, w.Message
		if m.State == store.StateQuarantined {
			m.Reason = ReasonEraseQuarantined
		}
		m.State = store.StateErasing
		m.Claim = nil
		m.Step = pendingStep(agentapi.StepErase, now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		return m, err
	}
	if !(wasAvailable && c.agentAlive(id)) {
		c.powerIntoAgent(ctx, m, store.StateErasing)
	}
	return m, nil
}

// reinspectAfterErase says why a machine whose erase just succeeded must be
// inspected again before it may be available ("" = it need not): it was
// erased from quarantine (reason erase_quarantined), or the hardware on
// record (the last registration, the erase boot's included) is missing or
// has a blocking difference from the intended fields.
func reinspectAfterErase(m store.Machine) string {
	switch {
	case m.Reason == ReasonEraseQuarantined:
		return "it was quarantined"
	case m.Discovered == nil:
		return "no inspection on record"
	case len(blocking(m.Diff)) > 0:
		return "blocking difference in " + strings.Join(blocking(m.Diff), ", ")
	}
	return ""
}

// Inspect (re)inspects a machine: registered, discovered, available
// (unclaimed), failed or quarantined → inspecting (reason
// inspection_requested). An agent heard within AgentStaleAfter gets the
// inspect task at its next poll (AgentTask) and registers again with its
// inventory; otherwise, with a BMC, the machine is PXE-booted (boot_pxe,
// power_cycle jobs). Errors: *StateError, store errors.
func (c *Controller) Inspect(ctx context.Context, id string, w store.W) (store.Machine, error) {
	w = withDefaults(w, ReasonInspectionRequested)
	now := c.now()
	from := []store.MachineState{store.StateRegistered, store.StateDiscovered, store.StateAvailable, store.StateFailed, store.StateQuarantined}
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(from, m.State) {
			return &StateError{Op: "inspect", Machine: id, State: m.State, Want: from}
		}
		if m.Claim != nil && m.State == store.StateAvailable {
			return &StateError{Op: "inspect", Machine: id, State: m.State, Want: from, Claimed: true, ClaimedImage: m.Claim.Image}
		}
		m.State = store.StateInspecting
		m.Reason, m.Message = w.Reason, w.Message
		m.Step = pendingStep("inspect", now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		return m, err
	}
	if !c.agentAlive(id) {
		c.powerIntoAgent(ctx, m, store.StateInspecting)
	}
	return m, nil
}

// powerIntoAgent PXE-boots m through its BMC (if any); a BMC failure fails
// the machine if it is still waiting in state.
func (c *Controller) powerIntoAgent(ctx context.Context, m store.Machine, state store.MachineState) {
	if m.BMC == "" || c.bmc == nil {
		return
	}
	if _, err := c.enqueuePXEBoot(ctx, m, c.powerDone(m.ID, state)); err != nil {
		c.logger().Warn("queue power", "machine", m.ID, "err", err)
	}
}

// EnrollBMC records b for machine machineID: password is sealed with
// Config.Sealer and stored with PutSecret under "bmc/<machineID>"
// (b.CredentialRef), the BMC record is created or updated, and the machine
// points at it. The password is never stored or returned in clear. Then,
// when the BMC offers an inventory (BMCInventory), it is read into the
// machine's discovered fields (readInventory; a failed read is an event,
// not an error). Errors: ErrNoSealer, ErrInvalid (address, driver, username, password),
// store errors.
func (c *Controller) EnrollBMC(ctx context.Context, machineID string, b store.BMC, password string, w store.W) (store.BMC, error) {
	if c.cfg.Sealer == nil {
		return store.BMC{}, ErrNoSealer
	}
	if b.Driver == "" {
		b.Driver = "auto"
	}
	if err := rules.CheckBMCDriver(b.Driver); err != nil {
		return store.BMC{}, fmt.Errorf("%w: driver %v", ErrInvalid, err)
	}
	if err := rules.CheckHostPort(b.Address); err != nil {
		return store.BMC{}, fmt.Errorf("%w: address: %v", ErrInvalid, err)
	}
	if b.Username == "" {
		return store.BMC{}, fmt.Errorf("%w: username is required", ErrInvalid)
	}
	if err := rules.CheckText(b.Username, rules.MaxTextLen); err != nil {
		return store.BMC{}, fmt.Errorf("%w: username %v", ErrInvalid, err)
	}
	if password == "" {
		return store.BMC{}, fmt.Errorf("%w: password is required", ErrInvalid)
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
	return out, nil
}

var imageNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// UploadImage streams r into the catalog under meta.Name and records the
// image. Images are immutable content pinned by digest:
//
//   - meta.ID "" lets the store choose the ID (POST /v1/images). A chosen ID
//     (PUT /v1/images/{id}) must not name another image: when an image with
//     that ID exists and has the same name, version, format and SHA-256 (and
//     size, when meta.Size is given), it is returned as it is and r is not
//     read (a repeated upload is idempotent); any other image there is
//     store.ErrConflict.
//   - A name already in the catalog is store.ErrConflict (upload a new name).
//   - meta.Size, when given, is 1..store.MaxImageSize bytes.
//   - Format raw (default): meta.SHA256 and meta.Size, when given, must be
//     the stored bytes' digest and length (the catalog checks them); both are
//     then taken from what was stored.
//   - Format gzip|zstd: meta.SHA256 and meta.Size are required and state the
//     raw (decompressed) content the agent writes. The body is decoded while
//     it is stored (contentCheck): a body that does not decode is
//     ErrImageFormat, decompressed content of another length ErrImageSize, of
//     another digest ErrDigest.
//
// On any error nothing is recorded and the catalog keeps nothing. Errors:
// ErrNoCatalog, ErrInvalid, ErrDigest, ErrImageFormat, ErrImageSize,
// store.ErrConflict, the catalog's error (a read error of r among them).
func (c *Controller) UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error) {
	if c.cfg.Catalog == nil {
		return store.Image{}, ErrNoCatalog
	}
	if !imageNameRe.MatchString(meta.Name) {
		return store.Image{}, fmt.Errorf("%w: name %q: letters, digits, '.', '_', '-' (max 128)", ErrInvalid, meta.Name)
	}
	meta.SHA256 = strings.ToLower(strings.TrimSpace(meta.SHA256))
	if meta.SHA256 != "" {
		if b, err := hex.DecodeString(meta.SHA256); err != nil || len(b) != 32 {
			return store.Image{}, fmt.Errorf("%w: sha256 %q: want 64 hex digits", ErrInvalid, meta.SHA256)
		}
	}
	if meta.Size > store.MaxImageSize {
		return store.Image{}, fmt.Errorf("%w: size_bytes %d: more than the largest image, %d bytes (16 TiB)", ErrInvalid, meta.Size, uint64(store.MaxImageSize))
	}
	if meta.Format == "" {
		meta.Format = "raw"
	}
	if err := rules.CheckImageFormat(meta.Format); err != nil {
		return store.Image{}, fmt.Errorf("%w: format %v", ErrInvalid, err)
	}
	if meta.Format != "raw" && (meta.SHA256 == "" || meta.Size == 0) {
		return store.Image{}, fmt.Errorf("%w: a %s image needs sha256 and size_bytes of its raw content", ErrInvalid, meta.Format)
	}
	// One upload per name and per chosen ID at a time: the checks below and
	// the catalog's atomic replace would otherwise let two concurrent uploads
	// both pass, one file replace the other and both be recorded, one of
	// them with a digest the served file does not have.
	keys := []string{"name:" + meta.Name}
	if meta.ID != "" {
		keys = append(keys, "id:"+meta.ID)
	}
	release, ok := c.claimUpload(keys)
	if !ok {
		return store.Image{}, fmt.Errorf("lifecycle: image %q (id %q) is being uploaded: %w", meta.Name, meta.ID, store.ErrConflict)
	}
	defer release()
	if meta.ID != "" {
		cur, err := c.st.GetImage(meta.ID)
		switch {
		case err == nil:
			if sameImage(cur, meta) {
				return cur, nil
			}
			return store.Image{}, fmt.Errorf("lifecycle: image %s exists with other content (name %q, version %q, %s, sha256 %s); images are immutable, upload under a new ID: %w",
				cur.ID, cur.Name, cur.Version, cur.Format, cur.SHA256, store.ErrConflict)
		case !errors.Is(err, store.ErrNotFound):
			return store.Image{}, err
		}
	}
	imgs, err := c.st.ListImages()
	if err != nil {
		return store.Image{}, err
	}
	for _, im := range imgs {
		if im.Name == meta.Name {
			return store.Image{}, fmt.Errorf("lifecycle: image name %q is image %s: %w", meta.Name, im.ID, store.ErrConflict)
		}
	}
	want, size, body := "", int64(-1), r
	if meta.Format == "raw" {
		want = meta.SHA256
		if meta.Size > 0 {
			size = int64(meta.Size)
		}
	} else {
		cc := newContentCheck(meta.Format, r, meta.Size, meta.SHA256)
		defer cc.stop()
		body = cc
	}
	ent, err := c.cfg.Catalog.Upload(ctx, meta.Name, body, want, size)
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: upload image %s: %w", meta.Name, err)
	}
	if meta.Format == "raw" {
		if want != "" && !strings.EqualFold(ent.SHA256, want) {
			return store.Image{}, fmt.Errorf("%w: declared %s, stored %s", ErrDigest, want, ent.SHA256)
		}
		meta.SHA256, meta.Size = strings.ToLower(ent.SHA256), uint64(ent.Size)
	}
	if meta.Source == "" {
		meta.Source = "upload"
	}
	meta.ResourceVersion = 0
	out, err := c.st.PutImage(ctx, meta, withDefaults(w, "image_uploaded"))
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: record image %s: %w", meta.Name, err)
	}
	return out, nil
}

// sameImage reports whether upload meta describes image cur: same name,
// version, format and SHA-256, and the same size when meta gives one.
func sameImage(cur, meta store.Image) bool {
	return cur.Name == meta.Name && cur.Version == meta.Version && cur.Format == meta.Format &&
		cur.SHA256 == meta.SHA256 && (meta.Size == 0 || cur.Size == meta.Size)
}

// claimUpload marks keys as being uploaded; ok is false (and nothing is
// marked) when one of them already is. release unmarks them.
func (c *Controller) claimUpload(keys []string) (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.uploading == nil {
		c.uploading = map[string]bool{}
	}
	for _, k := range keys {
		if c.uploading[k] {
			return nil, false
		}
	}
	for _, k := range keys {
		c.uploading[k] = true
	}
	return func() {
		c.mu.Lock()
		for _, k := range keys {
			delete(c.uploading, k)
		}
		c.mu.Unlock()
	}, true
}

// DeleteImage deletes image id unless a machine's claim names it
// (store.ErrImageInUse, decided inside the store's raft apply, so a
// concurrent Provision or ClaimMachines of that image cannot both succeed
// with it); the catalog file is removed when the Catalog supports Delete.
// Errors: store.ErrImageInUse, store.ErrNotFound, store errors.
func (c *Controller) DeleteImage(ctx context.Context, id string, w store.W) error {
	img, err := c.st.GetImage(id)
	if err != nil {
		return fmt.Errorf("lifecycle: delete image %s: %w", id, err)
	}
	if err := c.st.DeleteImage(ctx, id, withDefaults(w, "image_deleted")); err != nil {
		return fmt.Errorf("lifecycle: delete image %s: %w", id, err)
	}
	if d, ok := c.cfg.Catalog.(CatalogDeleter); ok {
		if err := d.Delete(img.Name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("lifecycle: image %s deleted, catalog file %s kept: %w", id, img.Name, err)
		}
	}
	return nil
}
