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
// is tried up to openTries times with exponential backoff.
type rangeReader struct {
	ctx        context.Context
	client     *http.Client
	url, token string
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

// openFirst opens the stream at offset 0, retrying transient failures.
func (r *rangeReader) openFirst() error {
	delay := r.backoff
	var err error
	for i := 0; i < max(1, r.openTries); i++ {
		if i > 0 {
			select {
			case <-r.ctx.Done():
				return r.ctx.Err()
			case <-time.After(delay):
			}
			delay *= 2
		}
		if err = r.open(); err == nil {
			return nil
		}
	}
	return err
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
		return fmt.Errorf("%w: GET %s (offset %d): HTTP %d", ErrFetch, r.url, r.off, resp.StatusCode)
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
	for {
		if r.body == nil {
			if err := r.open(); err != nil {
				if r.off > 0 && r.resumes < r.maxResumes && r.ctx.Err() == nil {
					r.resumes++
					sleepCtx(r.ctx, r.backoff)
					continue
				}
				return 0, err
			}
		}
		n, err := r.body.Read(p)
		r.off += int64(n)
		if n > 0 && r.watchdog != nil {
			r.watchdog.Reset(r.stall)
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
