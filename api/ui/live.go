package ui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"kiln/api"
	"kiln/api/client"
)

// Live updates: GET /ui/events is a server-sent event stream of the REST
// API's event feed (GET /v1/events, long-polled with the session's token)
// after the page's cursor. Each event is one SSE message (id: the event's
// index, data: the api.Event as JSON), so the browser's EventSource
// resumes after the last one it saw (Last-Event-ID) when the stream is cut.
// The stream ends with an "expired" event when the session ends, and a
// "resync" event when the cursor fell out of the retained log (the page
// reloads itself).

// liveWait is each long-poll of the feed; streamLimit bounds one stream's
// life (the browser reconnects at once, re-checking the session).
const (
	liveWait    = 25 * time.Second
	streamLimit = 10 * time.Minute
	livePage    = 500
)

func (u *UI) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	p, err := u.who(r)
	if err != nil {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "event: expired\ndata: {}\n\n")
		fl.Flush()
		return
	}
	var after uint64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		after, _ = strconv.ParseUint(v, 10, 64)
	} else if v := r.URL.Query().Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			http.Error(w, "after: want an event index", http.StatusBadRequest)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n: kiln live\n\n")
	fl.Flush()
	cl := u.client(p.Token)
	ctx := r.Context()
	end := time.Now().Add(streamLimit)
	for time.Now().Before(end) {
		if !u.cfg.Now().Before(time.Unix(p.Expires, 0)) {
			fmt.Fprint(w, "event: expired\ndata: {}\n\n")
			fl.Flush()
			return
		}
		el, err := cl.Events(ctx, client.EventQuery{After: after, Limit: livePage, Wait: liveWait})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ce *client.Error
			switch {
			case errors.As(err, &ce) && ce.Code() == api.CodeCursorExpired:
				fmt.Fprint(w, "event: resync\ndata: {}\n\n")
			case errors.As(err, &ce) && ce.Status == http.StatusUnauthorized:
				fmt.Fprint(w, "event: expired\ndata: {}\n\n")
			default:
				u.log.Info("live feed", "err", err)
				fmt.Fprint(w, "event: error\ndata: {}\n\n")
			}
			fl.Flush()
			return
		}
		if len(el.Events) == 0 {
			fmt.Fprint(w, ": ping\n\n")
		}
		for _, ev := range el.Events {
			js, _ := json.Marshal(ev)
			fmt.Fprintf(w, "id: %d\ndata: %s\n\n", ev.Index, js)
		}
		fl.Flush()
		after = el.Next
	}
}
