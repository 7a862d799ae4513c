package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle/intake"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Sentinel errors of package api. Handlers return them wrapped with %w; the
// one HTTP error handler (Server.errorHandler) maps them to a status and a
// stable code.
var (
	// ErrUnauthorized: no bearer token, or a token no TokenSpec knows (401 "unauthorized").
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: the token's role may not use this route, or an agent token
	// was presented for another machine (403 "forbidden").
	ErrForbidden = errors.New("forbidden")
	// ErrInvalid: a request failed validation; see *ValidationError for the field (400 "invalid").
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownField: a JSON body carried a field the schema does not have (400 "unknown_field").
	ErrUnknownField = errors.New("unknown field")
	// ErrBadJSON: a JSON body did not parse (400 "bad_json").
	ErrBadJSON = errors.New("malformed JSON body")
	// ErrTrailingData: a JSON body holds something after its one value: a
	// second value or any other non-whitespace bytes (400 "trailing_data").
	ErrTrailingData = errors.New("data after the JSON value")
	// ErrTooLarge: a body exceeded its size limit (413 "too_large").
	ErrTooLarge = errors.New("request body too large")
	// ErrBodyTimeout: the client sent a body too slowly: no bytes for
	// Config.BodyIdleTimeout, or a JSON body not whole within
	// Config.JSONBodyTimeout (408 "body_timeout").
	ErrBodyTimeout = errors.New("request body timed out")
	// ErrBodyIncomplete: the client ended the body before its declared end
	// (closed the connection before Content-Length bytes, a broken chunked
	// encoding) or the connection failed while it was read: an upload cut
	// off by the client. Nothing of it is kept (400 "body_incomplete").
	ErrBodyIncomplete = errors.New("request body incomplete")
	// ErrBadConfig: Config.Validate rejected the configuration.
	ErrBadConfig = errors.New("api: bad config")
)

// Stable error codes carried in the "code" field of every error body.
const (
	CodeInvalid           = "invalid"
	CodeUnknownField      = "unknown_field"
	CodeBadJSON           = "bad_json"
	CodeTrailingData      = "trailing_data"
	CodeUnauthorized      = "unauthorized"
	CodeForbidden         = "forbidden"
	CodeNotFound          = "not_found"
	CodeConflict          = "conflict"
	CodeIllegalTransition = "illegal_transition"
	CodeImageInUse        = "image_in_use"
	// CodeUnsupportedByCluster (409): the write needs a store command type
	// that a node of the cluster (an older binary) does not understand yet;
	// the message names the nodes to upgrade.
	CodeUnsupportedByCluster = "unsupported_by_cluster"
	// CodeCursorExpired (410): GET /v1/events?after=CURSOR with a cursor
	// older than the retained log (store.events retention trimmed events
	// after it). oldest_cursor in the body is the oldest cursor served:
	// resync from GET /v1/site/status and the machine list, then follow
	// the feed with after=oldest_cursor.
	CodeCursorExpired    = "cursor_expired"
	CodeImportRejected   = "import_rejected"
	CodeNotLeader        = "not_leader"
	CodeTooLarge         = "too_large"
	CodeBodyTimeout      = "body_timeout"
	CodeBodyIncomplete   = "body_incomplete"
	CodeUnavailable      = "unavailable"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal"
)

// ValidationError names the request field (JSON name, dotted for nested
// fields, or the query parameter) that failed validation. It unwraps to
// ErrInvalid (or ErrUnknownField / ErrBadJSON). Backends may return it too.
type ValidationError struct {
	Field string
	Msg   string
	Kind  error // ErrInvalid when nil
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Unwrap returns the sentinel the error belongs to.
func (e *ValidationError) Unwrap() error {
	if e.Kind == nil {
		return ErrInvalid
	}
	return e.Kind
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ErrorBody is the JSON shape of every error response:
// {"error":{"code":"not_found","message":"...","field":"..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody. Field names the offending request
// field for 400s; From/To name the states of an illegal transition; Leader
// is the raft leader's address on not_leader; Rows lists the bad rows of a
// rejected import; OldestCursor is the oldest event cursor served, on
// cursor_expired.
type ErrorDetail struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Field   string            `json:"field,omitempty"`
	From    string            `json:"from,omitempty"`
	To      string            `json:"to,omitempty"`
	Leader  string            `json:"leader,omitempty"`
	Rows    []intake.RowError `json:"rows,omitempty"`

	OldestCursor *uint64 `json:"oldest_cursor,omitempty"`
}

// ErrorClass maps a sentinel error of another package (one the api does not
// import, e.g. lifecycle.ErrWrongState) to an HTTP status and stable code.
// Config.ErrorClasses is checked in order after the api's own structured
// errors (validation, illegal transition, import rows) and before the store
// sentinels.
type ErrorClass struct {
	Err    error
	Status int
	Code   string
}

func (s *Server) customClass(err error) *ErrorClass {
	for i := range s.cfg.ErrorClasses {
		if errors.Is(err, s.cfg.ErrorClasses[i].Err) {
			return &s.cfg.ErrorClasses[i]
		}
	}
	return nil
}

// classify maps an error to its HTTP status and body. It is the only place
// where errors become statuses.
func (s *Server) classify(err error) (int, ErrorDetail) {
	var (
		ve   *ValidationError
		fe   *rules.FieldError
		ite  *store.IllegalTransitionError
		rows *intake.ErrRows
		he   *echo.HTTPError
		mbe  *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ite):
		return http.StatusConflict, ErrorDetail{Code: CodeIllegalTransition, Message: ite.Error(),
			From: string(ite.From), To: string(ite.To)}
	case errors.As(err, &rows):
		d := ErrorDetail{Code: CodeImportRejected, Rows: rows.Rows,
			Message: fmt.Sprintf("%d bad row(s); nothing was imported", len(rows.Rows))}
		if len(rows.Rows) > 0 {
			d.Field = rows.Rows[0].Field
		}
		return http.StatusBadRequest, d
	case errors.As(err, &mbe), errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge, ErrorDetail{Code: CodeTooLarge, Message: err.Error()}
	case errors.Is(err, ErrBodyTimeout):
		return http.StatusRequestTimeout, ErrorDetail{Code: CodeBodyTimeout, Message: err.Error()}
	case errors.Is(err, ErrBodyIncomplete):
		return http.StatusBadRequest, ErrorDetail{Code: CodeBodyIncomplete, Message: err.Error()}
	case errors.As(err, &ve):
		code := CodeInvalid
		switch {
		case errors.Is(ve, ErrUnknownField):
			code = CodeUnknownField
		case errors.Is(ve, ErrBadJSON):
			code = CodeBadJSON
		case errors.Is(ve, ErrTrailingData):
			code = CodeTrailingData
		}
		return http.StatusBadRequest, ErrorDetail{Code: code, Message: ve.Error(), Field: ve.Field}
	case errors.As(err, &fe):
		return http.StatusBadRequest, ErrorDetail{Code: CodeInvalid, Message: fe.Error(), Field: fe.Field}
	case errors.Is(err, ErrInvalid), errors.Is(err, intake.ErrFormat), errors.Is(err, intake.ErrEmpty),
		errors.Is(err, intake.ErrTooManyRows):
		return http.StatusBadRequest, ErrorDetail{Code: CodeInvalid, Message: err.Error()}
	case s.customClass(err) != nil:
		ec := s.customClass(err)
		return ec.Status, ErrorDetail{Code: ec.Code, Message: err.Error()}
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, ErrorDetail{Code: CodeUnauthorized, Message: err.Error()}
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden, ErrorDetail{Code: CodeForbidden, Message: err.Error()}
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, ErrorDetail{Code: CodeNotFound, Message: err.Error()}
	case errors.Is(err, store.ErrCursorExpired):
		d := ErrorDetail{Code: CodeCursorExpired, Message: err.Error()}
		if ce := (*store.CursorExpiredError)(nil); errors.As(err, &ce) {
			d.OldestCursor = &ce.Oldest
		}
		return http.StatusGone, d
	case errors.Is(err, store.ErrUnsupportedByCluster):
		return http.StatusConflict, ErrorDetail{Code: CodeUnsupportedByCluster, Message: err.Error()}
	case errors.Is(err, store.ErrImageInUse):
		return http.StatusConflict, ErrorDetail{Code: CodeImageInUse, Message: err.Error()}
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrDuplicateMAC):
		return http.StatusConflict, ErrorDetail{Code: CodeConflict, Message: err.Error()}
	case errors.Is(err, store.ErrNotLeader):
		leader := s.b.Health().Leader
		var nle *store.NotLeaderError
		if leader == "" && errors.As(err, &nle) {
			leader = nle.LeaderID
		}
		return http.StatusServiceUnavailable, ErrorDetail{Code: CodeNotLeader, Message: err.Error(), Leader: leader}
	case errors.Is(err, store.ErrInvalid):
		return http.StatusBadRequest, ErrorDetail{Code: CodeInvalid, Message: err.Error()}
	case errors.Is(err, store.ErrTimeout), errors.Is(err, store.ErrClosed):
		return http.StatusServiceUnavailable, ErrorDetail{Code: CodeUnavailable, Message: err.Error()}
	case errors.Is(err, context.Canceled):
		// The request's context ended before the answer: the client went
		// away, or this node is shutting down (a long poll at its stop).
		// Nothing failed here; a client that is still there retries.
		return http.StatusServiceUnavailable, ErrorDetail{Code: CodeUnavailable,
			Message: "request canceled (the client went away or this node is shutting down); retry: " + err.Error()}
	case errors.As(err, &he):
		d := ErrorDetail{Code: strings.ToLower(strings.ReplaceAll(http.StatusText(he.Code), " ", "_")),
			Message: fmt.Sprint(he.Message)}
		switch he.Code {
		case http.StatusNotFound:
			d.Code = CodeNotFound
		case http.StatusMethodNotAllowed:
			d.Code = CodeMethodNotAllowed
		case http.StatusRequestEntityTooLarge:
			d.Code = CodeTooLarge
		}
		return he.Code, d
	default:
		return http.StatusInternalServerError, ErrorDetail{Code: CodeInternal, Message: err.Error()}
	}
}

// errorHandler is the echo HTTPErrorHandler: the one place that turns a
// handler's error into a JSON error body.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, d := s.classify(err)
	switch {
	case status >= 500 && !errors.Is(err, context.Canceled):
		s.log.Error("request failed", "method", c.Request().Method, "route", c.Path(), "err", err)
	case d.Code == CodeBodyTimeout || d.Code == CodeBodyIncomplete:
		// The client's doing (a cut-off upload, a stalled sender), worth a
		// line for the operator but not an error of ours.
		s.log.Info("request body not received", "method", c.Request().Method, "route", c.Path(),
			"remote", c.Request().RemoteAddr, "err", err)
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	if err := c.JSON(status, ErrorBody{Error: d}); err != nil {
		s.log.Debug("write error body", "err", err)
	}
}

// decodeJSON is the one decoder of JSON request bodies. It reads exactly one
// JSON value from the body into v, limited to max bytes, and then the rest
// of the body, which may hold only whitespace (RFC 8259 section 2): a second
// value or any other bytes after the first are ErrTrailingData. Unknown
// fields are rejected naming the field; type errors name the field. An
// empty body is allowed when allowEmpty. The whole body must arrive within
// Config.JSONBodyTimeout (ErrBodyTimeout; see body.go).
func decodeJSON(c echo.Context, max int64, v any, allowEmpty bool) error {
	r := c.Request()
	if g, ok := r.Body.(*guardedBody); ok {
		g.limitTotal()
	}
	body := http.MaxBytesReader(c.Response(), r.Body, max)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, allowEmpty)
	}
	return onlyWhitespace(io.MultiReader(dec.Buffered(), body), dec.InputOffset())
}

// onlyWhitespace reads r to its end and fails at the first byte that is not
// JSON whitespace (space, tab, line feed, carriage return). off is the body
// offset of r's first byte, for the message.
func onlyWhitespace(r io.Reader, off int64) error {
	buf := make([]byte, 512)
	for {
		n, err := r.Read(buf)
		for i, b := range buf[:n] {
			switch b {
			case ' ', '\t', '\n', '\r':
			default:
				return &ValidationError{Kind: ErrTrailingData,
					Msg: fmt.Sprintf("data after the JSON value at byte %d; send exactly one JSON value", off+int64(i))}
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return jsonError(err, false)
		}
	}
}

// jsonError turns an encoding/json error into a *ValidationError naming the field.
func jsonError(err error, allowEmpty bool) error {
	var (
		te  *json.UnmarshalTypeError
		se  *json.SyntaxError
		mbe *http.MaxBytesError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, ErrBodyTimeout), errors.Is(err, ErrBodyIncomplete):
		return err // the transport's, not the JSON's
	case errors.Is(err, io.EOF):
		if allowEmpty {
			return nil
		}
		return &ValidationError{Msg: "empty body; a JSON object is required", Kind: ErrBadJSON}
	case errors.As(err, &mbe):
		return fmt.Errorf("%w: limit %d bytes", ErrTooLarge, mbe.Limit)
	case errors.As(err, &te):
		return &ValidationError{Field: te.Field, Msg: fmt.Sprintf("must be %s, not JSON %s", te.Type, te.Value)}
	case errors.As(err, &se):
		return &ValidationError{Msg: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se), Kind: ErrBadJSON}
	case strings.HasPrefix(msg, "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`)
		if f == "" {
			f = `""` // the empty key, named visibly
		}
		return &ValidationError{Field: f, Msg: "unknown field", Kind: ErrUnknownField}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &ValidationError{Msg: "truncated JSON body", Kind: ErrBadJSON}
	}
	return &ValidationError{Msg: msg, Kind: ErrBadJSON}
}
