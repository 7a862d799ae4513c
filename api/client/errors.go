package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"kiln/api"
)

// Error is a non-2xx answer of the API: the route, the HTTP status and the
// error body the API sends for every failure
// ({"error":{"code","message","field","from","to","leader","rows"}};
// api.ErrorDetail, whose Code is one of the api.Code* constants). An answer
// without such a body (a proxy's page) gets Code from the status text
// ("bad_gateway") and Message from the body's text.
//
// Error() is "STATUS CODE: MESSAGE", one "line N, field F: MSG" line per
// rejected import row, then " — " and the Hint when there is one. The text
// comes from the server: a caller printing it to a terminal escapes control
// characters itself (cmd/kiln does).
type Error struct {
	Method string // of the request, e.g. "POST"
	Path   string // of the request, e.g. "/v1/machines/m-1/release"
	Status int    // HTTP status, e.g. 409
	Detail api.ErrorDetail
}

// Code is the API's stable error code (api.Code*).
func (e *Error) Code() string { return e.Detail.Code }

// Message is the server's message without a leading "CODE: " it repeats.
func (e *Error) Message() string {
	return strings.TrimPrefix(e.Detail.Message, e.Detail.Code+": ")
}

// Hint says what to do next about e, in terms of the API (not of any one
// program's flags): "" when there is nothing better to say than the
// message. The rules, first match wins:
//
//	401                         send a valid bearer token
//	403                         use a token whose role may do this (operator or admin)
//	409 illegal_transition      the machine's state (from) does not allow it
//	409 conflict                read the object again and retry with its resource_version
//	409 image_in_use            release the machine whose claim names the image
//	any other 409               read the object again for its state and reason
//	503 not_leader with leader  retry: the leader is known (its raft address) but was not reached
//	503 not_leader              no leader yet; retry in a few seconds
//	400 import_rejected         fix the rows; nothing was imported
//	any other with a field      fix the field
func (e *Error) Hint() string {
	d := e.Detail
	switch {
	case e.Status == http.StatusUnauthorized:
		return "send a valid bearer token (the admin token is in the data directory's admin.token)"
	case e.Status == http.StatusForbidden:
		return "this token's role may not do that; use an operator or admin token"
	case d.Code == api.CodeIllegalTransition:
		return fmt.Sprintf("the machine is %s, which does not allow that", d.From)
	case d.Code == api.CodeConflict:
		return "someone changed it first: read it again and retry with its resource_version"
	case d.Code == api.CodeImageInUse:
		return "a machine's claim names this image; release that machine first"
	case e.Status == http.StatusConflict:
		return "its state does not allow that now; read it again for its state and reason"
	case d.Code == api.CodeNotLeader && d.Leader != "":
		// Leader is the raft address (api.Health.Leader), not an API URL.
		return "this node could not reach the leader (raft address " + d.Leader + "); retry in a few seconds"
	case d.Code == api.CodeNotLeader:
		return "no leader yet; retry in a few seconds"
	case d.Code == api.CodeCursorExpired && d.OldestCursor != nil:
		return fmt.Sprintf("the events after this cursor are no longer kept; resync from site status and the machines, then follow from cursor %d", *d.OldestCursor)
	case d.Code == api.CodeImportRejected:
		return "fix the rows above; nothing was imported"
	case d.Field != "":
		return "fix " + d.Field
	}
	return ""
}

// Error formats e with its rows and Hint (see the type's doc).
func (e *Error) Error() string { return e.Format(e.Hint(), func(s string) string { return s }) }

// Format is Error() with hint in place of Hint() ("" for none) and every
// piece of server text (code, message, row fields and messages) passed
// through esc, for a caller that prints to a terminal or adds its own
// advice.
func (e *Error) Format(hint string, esc func(string) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", e.Status, esc(e.Detail.Code))
	if msg := e.Message(); msg != "" {
		fmt.Fprintf(&b, ": %s", esc(msg))
	}
	for _, r := range e.Detail.Rows {
		fmt.Fprintf(&b, "\n  line %d, field %s: %s", r.Line, esc(r.Field), esc(r.Msg))
	}
	if hint != "" {
		fmt.Fprintf(&b, " — %s", hint)
	}
	return b.String()
}

// AsError returns err's *Error, or nil when err holds none.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	e := AsError(err)
	return e != nil && e.Status == http.StatusNotFound
}

// IsConflict reports whether err is a 409 answer of any code (conflict,
// illegal_transition, image_in_use, wrong_state, ...).
func IsConflict(err error) bool {
	e := AsError(err)
	return e != nil && e.Status == http.StatusConflict
}

// CursorExpired reports whether err is the API's 410 cursor_expired (GET
// /v1/events with a cursor older than the retained log) and, if so, the
// oldest cursor the server still serves: resync from current state (site
// status, machines), then call Events with After = oldest.
func CursorExpired(err error) (oldest uint64, ok bool) {
	e := AsError(err)
	if e == nil || e.Detail.Code != api.CodeCursorExpired {
		return 0, false
	}
	if e.Detail.OldestCursor != nil {
		oldest = *e.Detail.OldestCursor
	}
	return oldest, true
}

// IsNotLeader reports whether err is the API's 503 not_leader; Detail.Leader
// then names the leader's API address when one is known.
func IsNotLeader(err error) bool {
	e := AsError(err)
	return e != nil && e.Detail.Code == api.CodeNotLeader
}
