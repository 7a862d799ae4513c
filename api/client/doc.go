// Package client is the Go client of Kiln's REST API (package kiln/api):
// the one the kiln CLI (cmd/kiln) and the end-to-end lab flow
// (deploy/lab/e2e) use. It speaks HTTP only and decodes answers into the
// API's wire types.
//
// A Client is built from a base URL (http://HOST:PORT or https://HOST:PORT,
// optionally with a path prefix) and a bearer token; every method takes a
// context.Context, which alone bounds the call: the Client sets no timeout
// of its own (a long-poll of Events or a large image upload may take long),
// so callers pass a context with a deadline. A Client is safe for
// concurrent use.
//
// Errors. A non-2xx answer is an *Error carrying the HTTP status, the API's
// stable code (api.Code* constants, e.g. "not_found", "illegal_transition",
// "not_leader"), its message, field, from/to states, leader address and
// import rows (api.ErrorDetail), and a Hint saying what to do next; use
// errors.As, or the helpers IsNotFound, IsConflict and IsNotLeader. A
// transport failure (no connection, a cut-off answer) is returned wrapped
// with %w as net/http gave it, with the method and URL. An answer that does
// not decode is an error naming the route.
//
// Retries. The Client never retries: one method call is one HTTP request
// (ListAllMachines, which follows the page cursor, is documented as several).
// A call that failed in transport may or may not have taken effect on the
// server; the caller decides whether to read back or send again. Writes that
// carry a resource_version (PatchMachine, UpdateSite, UpdateRack) are safe
// to resend: a second apply is refused with 409 conflict.
//
// Uploads (UploadImage, PutImage) stream the body and send
// "Expect: 100-continue", so a request the server refuses before reading the
// body (bad token, bad query) is answered without the body being sent.
//
// The agent's routes (/v1/agent/*) are not here: the in-RAM agent has its
// own client in cmd/kiln-agent, sharing only package kiln/api/agentapi.
package client
