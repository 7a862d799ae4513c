package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
)

// The backup route (admin). The backend serves it when it implements
// BackupBackend (the appliance's does, appliance/backup.go, which also
// defines the archive and restores it offline: `kiln restore`).
//
//	GET /v1/backup[?images=true]   → 200 application/x-tar (streamed)

// BackupBackend writes a backup archive of this node to w.
type BackupBackend interface {
	// Backup streams the archive to w: a consistent snapshot of the
	// store and a manifest of the images and the in-RAM environment
	// files with their SHA-256; with opt.Images the image files too.
	// Errors before the first byte is written (store.ErrNotLeader: the
	// replica could not catch up) become an error answer; a failure after
	// that cuts the stream short, and the archive then fails its check on
	// restore (the manifest, written last, is missing).
	Backup(ctx context.Context, w io.Writer, opt BackupOptions) error
}

// BackupOptions are the query parameters of GET /v1/backup.
type BackupOptions struct {
	// Images includes the image files in the archive; without it they
	// are listed in the manifest by name, size and SHA-256 only.
	Images bool
}

// BackupMediaType is the media type of a backup archive (an uncompressed
// POSIX tar; appliance/backup.go has its members).
const BackupMediaType = "application/x-tar"

func (s *Server) backupRoutes(admin echo.MiddlewareFunc) {
	s.e.GET("/v1/backup", s.backup, admin)
}

// backupDocOps documents the backup route (appended to docOps).
func backupDocOps() []docOp {
	return []docOp{{Method: "GET", Path: "/v1/backup",
		Summary: "A backup archive (tar): a consistent snapshot of the store, and a manifest of images and in-RAM environment files with their SHA-256; the image files too with images=true. Restore it offline with `kiln restore`.",
		Role:    RoleAdmin, Query: []docParam{{Name: "images", Type: "boolean", Desc: "include the image files (default: listed by digest only)"}},
		Status: 200, RespType: BackupMediaType}}
}

// countingWriter records whether anything was written yet.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (s *Server) backup(c echo.Context) error {
	bb, ok := s.b.(BackupBackend)
	if !ok {
		return errNoBackup
	}
	var opt BackupOptions
	if v := c.QueryParam("images"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return invalid("images", "want true or false")
		}
		opt.Images = b
	}
	res := c.Response()
	res.Header().Set(echo.HeaderContentType, BackupMediaType)
	res.Header().Set("Content-Disposition", `attachment; filename="kiln-backup.tar"`)
	cw := &countingWriter{w: res}
	err := bb.Backup(c.Request().Context(), cw, opt)
	if err != nil && cw.n == 0 {
		res.Header().Del("Content-Disposition")
		return err // nothing sent yet: an ordinary error answer
	}
	if err != nil {
		s.log.Error("backup cut short", "bytes", cw.n, "err", err)
		panic(http.ErrAbortHandler) // the client sees a broken stream, not a complete archive
	}
	return nil
}

// errNoBackup: the backend has no backup operation.
var errNoBackup = fmt.Errorf("%w: this server's backend has no backup operation", ErrInvalid)
