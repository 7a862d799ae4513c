// Part of the image catalog (catalog.go): the upload-time check of a
// compressed image's decompressed size and digest.

package lifecycle

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// Upload-time check of a compressed image (format gzip or zstd).
//
// The catalog stores a compressed image as it was sent and the agent
// decompresses it while writing the disk. An image whose body does not
// decode, or whose decompressed content is not the declared size and
// SHA-256, used to be accepted and to fail only on a machine. contentCheck
// decodes a copy of the body while the catalog stores it, and answers the
// catalog's last read with the verdict instead of io.EOF when the content
// is not what was declared, so the catalog keeps nothing.

// zstdMaxWindow bounds the memory a zstd frame may ask of the decoder
// (its window; 128 MiB is zstd --long=27, more than any image needs).
const zstdMaxWindow = 128 << 20

// contentCheck is an io.Reader over the compressed body r that feeds what
// it reads to a decoder running in a goroutine.
type contentCheck struct {
	r       io.Reader
	pw      *io.PipeWriter
	done    chan error // the decoder's verdict, sent once
	ended   bool
	verdict error
}

// newContentCheck starts decoding format ("gzip" or "zstd") content that
// must be size bytes with SHA-256 sha256Hex. The caller reads the
// compressed bytes through it and calls stop when done with it.
func newContentCheck(format string, r io.Reader, size uint64, sha256Hex string) *contentCheck {
	pr, pw := io.Pipe()
	cc := &contentCheck{r: r, pw: pw, done: make(chan error, 1)}
	go func() {
		err := checkContent(format, pr, size, sha256Hex)
		if err == nil {
			// Whatever follows the compressed stream is not content. (The
			// decoder thus reads until the body ends, unless it fails.)
			if n, _ := io.Copy(io.Discard, pr); n > 0 {
				err = fmt.Errorf("%w: %d bytes after the end of the %s stream", ErrImageFormat, n, format)
			}
		}
		pr.CloseWithError(errOr(err, errStopped)) // a blocked Write returns
		cc.done <- err
	}()
	return cc
}

// errStopped ends the decoder's input when the body's reader stops early.
var errStopped = errors.New("lifecycle: image upload stopped")

func errOr(err, or error) error {
	if err != nil {
		return err
	}
	return or
}

// checkContent decodes r and compares the decompressed length and SHA-256
// with the declared ones. It reads at most size+1 decompressed bytes, so a
// stream that expands beyond its declared size stops there.
func checkContent(format string, r io.Reader, size uint64, sha256Hex string) error {
	var dec io.Reader
	switch format {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("%w: not a gzip stream: %v", ErrImageFormat, err)
		}
		defer zr.Close()
		dec = zr
	case "zstd":
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return fmt.Errorf("%w: zstd: %v", ErrImageFormat, err)
		}
		defer zr.Close()
		dec = zr
	default:
		return fmt.Errorf("%w: format %q is not a compressed format", ErrInvalid, format)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(dec, int64(size)+1))
	if err != nil {
		return fmt.Errorf("%w: the body is not a valid %s stream: %v", ErrImageFormat, format, err)
	}
	switch {
	case uint64(n) > size:
		return fmt.Errorf("%w: the decompressed content is longer than the declared size, %d bytes", ErrImageSize, size)
	case uint64(n) < size:
		return fmt.Errorf("%w: the decompressed content is %d bytes, the declared size %d", ErrImageSize, n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha256Hex {
		return fmt.Errorf("%w: the decompressed content has sha256 %s, declared %s", ErrDigest, got, sha256Hex)
	}
	return nil
}

// Read passes the compressed bytes through, feeding each to the decoder.
// At the end of the body it waits for the decoder and returns its verdict
// (ErrImageFormat, ErrImageSize, ErrDigest) in place of io.EOF when the
// content is not as declared; a decoder that fails earlier fails the next
// Read. A read error of the body itself is returned as it is.
func (cc *contentCheck) Read(p []byte) (int, error) {
	if cc.ended {
		return 0, errOr(cc.verdict, io.EOF)
	}
	n, err := cc.r.Read(p)
	if n > 0 {
		if _, werr := cc.pw.Write(p[:n]); werr != nil {
			// The decoder stopped before the body ended: it failed.
			return 0, errOr(cc.finish(nil), fmt.Errorf("%w: the compressed stream ended before the body", ErrImageFormat))
		}
	}
	switch {
	case err == io.EOF:
		if v := cc.finish(nil); v != nil {
			return n, v
		}
	case err != nil:
		cc.finish(err)
	}
	return n, err
}

// finish ends the decoder's input, cleanly (cause nil) or with cause, and
// returns the verdict: the decoder's, or cause when the body failed.
func (cc *contentCheck) finish(cause error) error {
	if cc.ended {
		return cc.verdict
	}
	cc.ended = true
	if cause != nil {
		cc.pw.CloseWithError(cause)
	} else {
		cc.pw.Close()
	}
	cc.verdict = <-cc.done
	if cause != nil {
		cc.verdict = cause
	}
	return cc.verdict
}

// stop ends the check when the caller stopped reading early (the catalog
// failed, the context ended), so that the decoder goroutine exits.
func (cc *contentCheck) stop() { cc.finish(errStopped) }
