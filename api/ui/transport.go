package ui

import (
	"net/http"
	"net/http/httptest"
)

// localTransport sends a client request to the API's handler in process:
// the same routes, middleware (role checks, metrics) and error mapping as
// a request over the network, without a socket. The request's context is
// the caller's, so a page whose browser goes away ends its API calls.
type localTransport struct{ h http.Handler }

func (t localTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r.RequestURI = r.URL.RequestURI()
	if r.RemoteAddr == "" {
		r.RemoteAddr = "127.0.0.1:0" // in process
	}
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	res := rec.Result()
	res.Request = r
	return res, nil
}
