package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"kiln/api"
)

// Client-side defaults.
const (
	defaultServer    = "http://127.0.0.1:7480"
	defaultTokenFile = "/var/lib/kiln/admin.token"
	// requestTimeout bounds ordinary requests; uploads and long-polls set their own.
	requestTimeout = 60 * time.Second
)

// client speaks the REST API of package api.
type client struct {
	base     string
	token    string
	tokenSrc string // where token came from, for error hints
	hc       *http.Client
}

// resolveToken returns the token from the flag, KILN_TOKEN, KILN_TOKEN_FILE
// or the default admin token file, and where it came from.
func resolveToken(flag string) (string, string) {
	if flag != "" {
		return flag, "--token"
	}
	if t := os.Getenv("KILN_TOKEN"); t != "" {
		return t, "KILN_TOKEN"
	}
	path := os.Getenv("KILN_TOKEN_FILE")
	if path == "" {
		path = defaultTokenFile
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	return strings.TrimSpace(string(b)), path
}

// apiError is a non-2xx answer with the server's error body.
type apiError struct {
	Status int
	Detail api.ErrorDetail
	hint   string
}

func (e *apiError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", e.Status, termSafe(e.Detail.Code))
	if msg := strings.TrimPrefix(e.Detail.Message, e.Detail.Code+": "); msg != "" {
		fmt.Fprintf(&b, ": %s", termSafe(msg))
	}
	for _, r := range e.Detail.Rows {
		fmt.Fprintf(&b, "\n  line %d, field %s: %s", r.Line, termSafe(r.Field), termSafe(r.Msg))
	}
	if e.hint != "" {
		fmt.Fprintf(&b, " — %s", e.hint)
	}
	return b.String()
}

// hint says what to do next for a given error answer.
func (c *client) hint(status int, d api.ErrorDetail) string {
	switch {
	case status == http.StatusUnauthorized:
		if c.token == "" {
			return "no token: set KILN_TOKEN or --token (the admin token is in " + defaultTokenFile + ")"
		}
		return "set KILN_TOKEN or --token (the rejected token came from " + c.tokenSrc + ")"
	case status == http.StatusForbidden:
		return "this token's role may not do that; use an operator or admin token"
	case d.Code == api.CodeIllegalTransition:
		return fmt.Sprintf("the machine is %s; see `kiln machines get` for its state and reason", d.From)
	case d.Code == api.CodeConflict:
		return "someone changed it first: fetch it again and retry"
	case status == http.StatusConflict:
		return "see `kiln machines get ID` for its state and reason"
	case d.Code == api.CodeNotLeader && d.Leader != "":
		return "retry against the leader: --server http://" + d.Leader
	case d.Code == api.CodeNotLeader:
		return "no leader yet; retry in a few seconds"
	case status == http.StatusNotFound:
		return "check the ID with `kiln machines list` / `kiln images list`"
	case d.Code == api.CodeImportRejected:
		return "fix the rows above; nothing was imported"
	case d.Field != "":
		return "fix " + d.Field
	}
	return ""
}

// do sends one request. body may be nil, an io.Reader (sent as is with
// ctype) or a value encoded as JSON. out, when non-nil, receives the JSON answer.
func (c *client) do(ctx context.Context, method, path string, q url.Values, body any, ctype string, out any) error {
	u := strings.TrimRight(c.base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd = b
	default:
		js, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(js)
		ctype = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("bad --server %q: %w", c.base, err)
	}
	if sr, ok := body.(*sizedReader); ok {
		req.ContentLength = sr.n
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			return fmt.Errorf("cannot reach kiln at %s: %v — is `kiln serve` running? set --server or KILN_SERVER", c.base, oe.Err)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		var eb api.ErrorBody
		raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			eb.Error = api.ErrorDetail{Code: strings.ToLower(strings.ReplaceAll(http.StatusText(res.StatusCode), " ", "_")),
				Message: strings.TrimSpace(string(raw))}
		}
		return &apiError{Status: res.StatusCode, Detail: eb.Error, hint: c.hint(res.StatusCode, eb.Error)}
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, res.Body)
		return nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: bad answer: %w", method, path, err)
	}
	return nil
}
