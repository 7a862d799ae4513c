package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Request bodies are bounded in time as well as in size.
//
// Every route checks its credentials before it reads a byte of the body
// (requireRole for static tokens; authAgent checks an agent token against
// the X-Kiln-Machine header), so a refused request is answered at once. The
// http.Server sets no ReadTimeout: net/http applies it to the whole request,
// and a deadline that passes while a handler runs cancels the request's
// context, which would end long-polls (GET /v1/events?wait=) and long image
// uploads. Instead guardBodies bounds each read of a body: no read waits
// more than Config.BodyIdleTimeout for the next bytes (uploads of any size
// go on as long as bytes keep coming), and a JSON body must arrive whole
// within Config.JSONBodyTimeout (decodeJSON). When a handler answers
// without reading its body to the end, the server stops reading it at once
// and closes the connection after the answer: net/http would otherwise
// read up to 256 KiB of the unread body before it sends the answer, which a
// client trickling a body holds for as long as it likes.

// guardBodies wraps h so that every request body is read through a
// guardedBody. Requests without a body pass untouched.
func (s *Server) guardBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		g := &guardedBody{rc: http.NewResponseController(w), body: r.Body,
			idle: s.cfg.BodyIdleTimeout, jsonTotal: s.cfg.JSONBodyTimeout}
		// Until the handler reads, the body gets one idle period: a handler
		// that never reads (a refusal) is answered without waiting for it.
		g.setDeadline(time.Now().Add(g.idle))
		r2 := r.Clone(r.Context())
		r2.Body = g
		h.ServeHTTP(&guardedWriter{ResponseWriter: w, g: g}, r2)
		g.stopWaiting()
	})
}

// guardedBody is a request body whose every Read has a deadline.
type guardedBody struct {
	rc        *http.ResponseController
	body      io.ReadCloser
	idle      time.Duration // longest wait for the next bytes
	jsonTotal time.Duration // whole-body bound once limitTotal is called
	total     time.Time     // zero: no whole-body bound
	eof       bool
	err       error // sticky: the first read error, classified
}

func (g *guardedBody) setDeadline(t time.Time) {
	// http.ErrNotSupported (a ResponseWriter without a connection, e.g.
	// httptest.ResponseRecorder) leaves reads unbounded, as before.
	_ = g.rc.SetReadDeadline(t)
}

// limitTotal bounds the rest of the body to Config.JSONBodyTimeout from now
// (JSON bodies are small; uploads and imports are not, and keep only the
// idle bound).
func (g *guardedBody) limitTotal() {
	if g.total.IsZero() && g.jsonTotal > 0 {
		g.total = time.Now().Add(g.jsonTotal)
	}
}

// Read reads with a deadline of the idle timeout from now (or the total
// bound, if sooner). Errors: io.EOF at the end; ErrBodyTimeout when the
// deadline passed; ErrBodyIncomplete when the client ended the body early
// (closed the connection before Content-Length, a broken chunk) or the
// connection failed.
func (g *guardedBody) Read(p []byte) (int, error) {
	if g.eof {
		return 0, io.EOF
	}
	if g.err != nil {
		return 0, g.err
	}
	d := time.Now().Add(g.idle)
	if !g.total.IsZero() && g.total.Before(d) {
		d = g.total
	}
	g.setDeadline(d)
	n, err := g.body.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		g.eof = true
		// The whole body is in: clear the deadline, or net/http's read that
		// watches for the client going away would hit it and cancel the
		// request's context (a long-poll, an answer being computed).
		g.setDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		if !g.total.IsZero() && !time.Now().Before(g.total) {
			g.err = fmt.Errorf("%w: the JSON body did not arrive within %s", ErrBodyTimeout, g.jsonTotal)
		} else {
			g.err = fmt.Errorf("%w: no body bytes for %s", ErrBodyTimeout, g.idle)
		}
		err = g.err
	default:
		g.err = fmt.Errorf("%w: %v", ErrBodyIncomplete, err)
		err = g.err
	}
	return n, err
}

// Close closes the underlying body.
func (g *guardedBody) Close() error { return g.body.Close() }

// stopWaiting ends any wait for the unread rest of the body: the next read
// of it (net/http's own, before it answers) fails at once, and the
// connection is closed after the answer.
func (g *guardedBody) stopWaiting() {
	if !g.eof {
		g.setDeadline(time.Now())
	}
}

// guardedWriter stops the wait for an unread body as soon as the answer
// starts: a handler that answers has done with the body.
type guardedWriter struct {
	http.ResponseWriter
	g     *guardedBody
	wrote bool
}

func (w *guardedWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		w.g.stopWaiting()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *guardedWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.wrote = true
		w.g.stopWaiting()
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController (echo's Flush, SetReadDeadline) reach
// the connection's writer.
func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
