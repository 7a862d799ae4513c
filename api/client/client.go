package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"kiln/api"
)

// DefaultServer is the API's default address (api.DefaultAddr) as a URL.
const DefaultServer = "http://" + api.DefaultAddr

// maxErrorBody bounds how much of an error answer is read (bytes).
const maxErrorBody = 1 << 20

// Config of a Client.
type Config struct {
	// Server is the API's base URL: http://HOST:PORT or https://HOST:PORT,
	// optionally with a path prefix (routes are appended to it). Required.
	Server string
	// Token is the bearer token sent on every request ("" sends none: only
	// /healthz, /readyz and /v1/openapi.json answer without one).
	Token string
	// HTTPClient sends the requests. Nil: a client over a clone of
	// http.DefaultTransport (proxy from the environment, 1 s
	// ExpectContinueTimeout) with no overall timeout, since the caller's
	// context bounds each call. A client given here should set
	// Transport.ExpectContinueTimeout for uploads to wait for the
	// server's early refusal (see package doc).
	HTTPClient *http.Client
}

// Client calls Kiln's REST API. Build it with New.
type Client struct {
	base  string // scheme://host[:port][/prefix], no trailing slash
	token string
	hc    *http.Client
}

// ErrBadServer is returned by New for a Server that is not an http(s) URL
// with a host.
var ErrBadServer = errors.New("client: bad server URL")

// New returns a Client for cfg. It fails (ErrBadServer) when cfg.Server is
// not http://HOST[:PORT][/prefix] or https://…; nothing is sent.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w %q: want http://HOST:PORT or https://HOST:PORT", ErrBadServer, cfg.Server)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if tr.ExpectContinueTimeout == 0 {
			tr.ExpectContinueTimeout = time.Second
		}
		hc = &http.Client{Transport: tr}
	}
	return &Client{base: strings.TrimRight(u.String(), "/"), token: cfg.Token, hc: hc}, nil
}

// Server returns the base URL the Client sends to.
func (c *Client) Server() string { return c.base }

// HasToken reports whether the Client sends a bearer token.
func (c *Client) HasToken() bool { return c.token != "" }

// request is one call: a route and what to send and receive.
type request struct {
	method string
	path   string // "/v1/…", each ID already escaped with seg
	query  url.Values
	json   any       // request body encoded as JSON (nil: none)
	body   io.Reader // request body sent as is (with ctype), when json is nil
	ctype  string
	length int64 // of body in bytes; < 0 unknown (chunked unless net/http knows the reader's length)
	expect bool  // send Expect: 100-continue
	// ok lists the statuses that are a success besides 200..299 (e.g. the
	// 503 of /readyz that carries a Status body); out decodes those too.
	ok []int
}

// seg escapes one path segment (an ID).
func seg(s string) string { return url.PathEscape(s) }

// do sends r and decodes a 2xx answer into out (when non-nil). It returns
// the status. A non-2xx answer is an *Error.
func (c *Client) do(ctx context.Context, r request, out any) (int, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var rd io.Reader
	length := int64(0)
	switch {
	case r.json != nil:
		js, err := json.Marshal(r.json)
		if err != nil {
			return 0, fmt.Errorf("%s %s: encode body: %w", r.method, r.path, err)
		}
		rd, length, r.ctype = bytes.NewReader(js), int64(len(js)), "application/json"
	case r.body != nil:
		rd, length = r.body, r.length
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, rd)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", r.method, u, err)
	}
	if r.json == nil && r.body != nil {
		switch {
		case length > 0:
			req.ContentLength = length
		case length == 0:
			req.Body, req.ContentLength = http.NoBody, 0
		} // < 0: as net/http sees it (known for bytes and strings readers, else chunked)
	}
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	req.Header.Set("Accept", "application/json")
	if r.expect {
		req.Header.Set("Expect", "100-continue")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, err // *url.Error: method, URL and the transport's cause
	}
	defer res.Body.Close()
	success := res.StatusCode >= 200 && res.StatusCode < 300
	for _, s := range r.ok {
		success = success || res.StatusCode == s
	}
	if !success {
		return res.StatusCode, readError(r.method, r.path, res)
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxErrorBody))
		return res.StatusCode, nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return res.StatusCode, fmt.Errorf("%s %s: %d answer does not decode: %w", r.method, r.path, res.StatusCode, err)
	}
	return res.StatusCode, nil
}

// readError builds the *Error of a non-2xx answer: the API's error body, or
// for any other body (a proxy's page) a code from the status text and the
// body's text as the message.
func readError(method, path string, res *http.Response) *Error {
	raw, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	var eb api.ErrorBody
	if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
		eb.Error = api.ErrorDetail{Code: statusCode(res.StatusCode), Message: strings.TrimSpace(string(raw))}
	}
	return &Error{Method: method, Path: path, Status: res.StatusCode, Detail: eb.Error}
}

// statusCode is the code of an answer without an API error body: its status
// text in snake case ("bad_gateway"), as the API names echo's own errors.
func statusCode(status int) string {
	t := http.StatusText(status)
	if t == "" {
		return fmt.Sprintf("http_%d", status)
	}
	return strings.ToLower(strings.ReplaceAll(t, " ", "_"))
}
