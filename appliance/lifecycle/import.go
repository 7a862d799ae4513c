// Import of purchase records and rack plans (package intake parses, the
// store creates all rows in one create-only command, and a conflict is
// mapped back to its file line). No per-node state.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"

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
