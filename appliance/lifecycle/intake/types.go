package intake

import "fmt"

// Result is the outcome of a successful import: how many machines were
// created and their assigned IDs, in file order.
type Result struct {
	Created int
	IDs     []string
}

// RowError is one bad row of an import file: its 1-based line, the field
// (column) at fault and what is wrong with it.
type RowError struct {
	Line  int
	Field string
	Msg   string
}

// ErrRows is returned when any row of a file is bad; a file with any bad row
// imports nothing.
type ErrRows struct {
	Rows []RowError
}

// Error summarises the bad rows. Return ErrRows as a pointer (*ErrRows) so
// callers can find it with errors.As.
func (e *ErrRows) Error() string {
	if len(e.Rows) == 0 {
		return "intake: bad rows"
	}
	r := e.Rows[0]
	if len(e.Rows) == 1 {
		return fmt.Sprintf("intake: line %d field %s: %s", r.Line, r.Field, r.Msg)
	}
	return fmt.Sprintf("intake: %d bad rows, first at line %d field %s: %s", len(e.Rows), r.Line, r.Field, r.Msg)
}
