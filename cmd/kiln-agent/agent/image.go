package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// rangeReader is the compressed (as served) image stream. When the body breaks before
// the server's Content-Length (or with a transport error, or when no byte arrives for
// stall) it re-requests the rest with "Range: bytes=OFF-" (RFC 9110 §14.2) and "If-Range"
// (the ETag or Last-Modified of the first response, §13.1.5), accepting only a 206 whose
// Content-Range starts at OFF. At most maxResumes resumptions per stream; the first request
// is tried up to openTries times with exponential backoff. While the appliance does not
// answer (a restart, a failover) a resumption keeps being tried, with backoff up to
// backoffMax and in turn at every URL of urls (the same image on each node of the site
// cluster: the ETag is its SHA-256, so If-Range holds across nodes), until resumeFor has
// passed since the stream broke.
type rangeReader struct {
	ctx        context.Context
	client     *http.Client
	url, token string
	urls       []string // alternatives to url (other nodes); url is tried first
	backoffMax time.Duration
	resumeFor  time.Duration
	brokeAt    time.Time // when the current outage began; zero while bytes flow
	body       io.ReadCloser
	cancel     context.CancelFunc // of the current request
	watchdog   *time.Timer
	stall      time.Duration
	off, total int64
	validator  string
	resumes    int
	maxResumes int
	openTries  int
	backoff    time.Duration
	// Resumed counts successful resumptions (for the report).
	Resumed int
}

// openFirst opens the stream at offset 0, retrying transient failures (openTries
// attempts, then until resumeFor has passed), each at the next URL.
func (r *rangeReader) openFirst() error {
	delay := r.backoff
	start := time.Now()
	var err error
	for i := 0; i < max(1, r.openTries) || time.Since(start) < r.resumeFor; i++ {
		if i > 0 {
			select {
			case <-r.ctx.Done():
				return r.ctx.Err()
			case <-time.After(delay):
			}
			delay = r.nextDelay(delay)
		}
		if err = r.open(); err == nil {
			return nil
		}
		if !retryableFetch(err) {
			return err
		}
		r.rotate()
	}
	return err
}

// nextDelay doubles d, capped at backoffMax when set.
func (r *rangeReader) nextDelay(d time.Duration) time.Duration {
	d *= 2
	if r.backoffMax > 0 && d > r.backoffMax {
		d = r.backoffMax
	}
	return d
}

// rotate moves r.url on to the next alternative URL (no-op with none).
func (r *rangeReader) rotate() {
	for i, u := range r.urls {
		if u == r.url {
			r.url = r.urls[(i+1)%len(r.urls)]
			return
		}
	}
}

// fetchStatusError is an image request answered with a status other than the one wanted.
type fetchStatusError struct{ code int }

func (e fetchStatusError) Error() string { return "HTTP " + strconv.Itoa(e.code) }

// retryableFetch: a transport error, a 5xx, 408 or 429 may pass (another node, a
// restarted one); any other refusal is final.
func retryableFetch(err error) bool {
	var se fetchStatusError
	if errors.As(err, &se) {
		return se.code >= 500 || se.code == http.StatusRequestTimeout || se.code == http.StatusTooManyRequests
	}
	return true
}

func (r *rangeReader) open() error {
	rctx, cancel := context.WithCancel(r.ctx)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, r.url, nil)
	if err != nil {
		cancel()
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(r.off, 10)+"-")
		if r.validator != "" {
			req.Header.Set("If-Range", r.validator)
		}
	}
	// The watchdog cancels the request when no byte arrives for r.stall.
	if r.stall > 0 {
		r.watchdog = time.AfterFunc(r.stall, cancel)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.stop(cancel)
		return fmt.Errorf("%w: %v", ErrFetch, err)
	}
	switch {
	case r.off == 0 && resp.StatusCode == http.StatusOK:
		r.total = resp.ContentLength
		r.validator = resp.Header.Get("ETag")
		if r.validator == "" || strings.HasPrefix(r.validator, "W/") {
			r.validator = resp.Header.Get("Last-Modified")
		}
	case r.off > 0 && resp.StatusCode == http.StatusPartialContent:
		start, err := contentRangeStart(resp.Header.Get("Content-Range"))
		if err != nil || start != r.off {
			resp.Body.Close()
			r.stop(cancel)
			return fmt.Errorf("%w: resume at %d got Content-Range %q", ErrFetch, r.off, resp.Header.Get("Content-Range"))
		}
		r.Resumed++
	default:
		resp.Body.Close()
		r.stop(cancel)
		return fmt.Errorf("%w: GET %s (offset %d): %w", ErrFetch, r.url, r.off, fetchStatusError{resp.StatusCode})
	}
	r.body, r.cancel = resp.Body, cancel
	return nil
}

func (r *rangeReader) stop(cancel context.CancelFunc) {
	if r.watchdog != nil {
		r.watchdog.Stop()
		r.watchdog = nil
	}
	cancel()
}

func (r *rangeReader) drop() {
	if r.body != nil {
		r.body.Close()
		r.body = nil
	}
	if r.cancel != nil {
		r.stop(r.cancel)
		r.cancel = nil
	}
}

func (r *rangeReader) Read(p []byte) (int, error) {
	delay := r.backoff
	for {
		if r.body == nil {
			if err := r.open(); err != nil {
				if r.off > 0 && r.ctx.Err() == nil && retryableFetch(err) && time.Since(r.brokeAt) < r.resumeFor {
					// The appliance is not answering (restart, failover): keep trying,
					// backing off, at the next node.
					r.rotate()
					sleepCtx(r.ctx, delay)
					delay = r.nextDelay(delay)
					continue
				}
				if r.off > 0 && !r.brokeAt.IsZero() {
					return 0, fmt.Errorf("%w (stream broken at byte %d for %s)", err, r.off, time.Since(r.brokeAt).Round(time.Second))
				}
				return 0, err
			}
		}
		n, err := r.body.Read(p)
		r.off += int64(n)
		if n > 0 {
			r.brokeAt = time.Time{}
			if r.watchdog != nil {
				r.watchdog.Reset(r.stall)
			}
		}
		if err == nil {
			return n, nil
		}
		if errors.Is(err, io.EOF) && (r.total < 0 || r.off >= r.total) {
			return n, io.EOF
		}
		// Broken or stalled stream: drop the connection and resume on the next Read.
		r.drop()
		if r.ctx.Err() != nil {
			return n, r.ctx.Err()
		}
		if r.resumes >= r.maxResumes {
			return n, fmt.Errorf("%w: stream broke at %d after %d resumptions: %v", ErrFetch, r.off, r.resumes, err)
		}
		r.resumes++
		if r.brokeAt.IsZero() {
			r.brokeAt = time.Now()
		}
		if n > 0 {
			return n, nil
		}
		sleepCtx(r.ctx, r.backoff)
	}
}

func (r *rangeReader) Close() error {
	r.drop()
	return nil
}

func contentRangeStart(v string) (int64, error) {
	// "bytes 100-199/200"
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, errors.New("no bytes unit")
	}
	s, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, errors.New("no range")
	}
	// first-pos is 1*DIGIT (RFC 9110 §14.4): no sign.
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("first-pos %q is not decimal digits", s)
	}
	return strconv.ParseInt(s, 10, 64)
}

// decompress wraps the served stream by ImageRef.Format: "" or "raw", "gzip", "zstd".
func decompress(format string, src io.Reader) (io.Reader, func(), error) {
	switch format {
	case "", "raw":
		return src, func() {}, nil
	case "gzip", "gz":
		z, err := gzip.NewReader(src)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: gzip: %v", ErrFetch, err)
		}
		return z, func() { z.Close() }, nil
	case "zstd", "zst":
		z, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zstd: %v", ErrFetch, err)
		}
		return z, z.Close, nil
	}
	return nil, nil, fmt.Errorf("%w: unknown image format %q", ErrBadTask, format)
}
