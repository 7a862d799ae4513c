package api

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// Images: list, get, streamed upload (POST, or PUT under a chosen ID), delete.

func (s *Server) listImages(c echo.Context) error {
	items, err := s.b.ListImages()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ImageList{Items: views(items, imageView)})
}

func (s *Server) getImage(c echo.Context) error {
	im, err := s.b.GetImage(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, imageView(im))
}

type countingReader struct {
	r io.Reader
	n func(int)
}

func (cr countingReader) Read(p []byte) (int, error) {
	n, err := cr.r.Read(p)
	cr.n(n)
	return n, err
}

// uploadImage streams the request body (the image bytes) to the backend.
// Metadata comes in the query: name, version, sha256 (hex of the raw
// bytes), format (raw|gzip|zstd, default raw), size (bytes of the raw
// content, 1..store.MaxImageSize: required for gzip and zstd, optional for
// raw), source. POST lets the store choose the ID (201). PUT
// /v1/images/{id} uploads under that ID: 201 when it is new; when an image
// with that ID exists with the same name, version, format and sha256, 200
// with that image and the body is not read (idempotent); any other image
// there is 409 (images are immutable).
func (s *Server) uploadImage(c echo.Context) error {
	q := c.QueryParams()
	meta := store.Image{Meta: store.Meta{ID: c.Param("id")}, Name: q.Get("name"), Version: q.Get("version"),
		SHA256: q.Get("sha256"), Format: q.Get("format"), Source: q.Get("source")}
	if v := q.Get("size"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return invalid("size", "must be the raw content's length in bytes: an integer 1..%d (16 TiB)", uint64(store.MaxImageSize))
		}
		meta.Size = n
	}
	// What the upload request must carry; the field rules of the metadata
	// are the domain's (rules.CheckImage, applied by UploadImage before it
	// reads the body).
	switch {
	case meta.Name == "":
		return invalid("name", "required query parameter")
	case meta.Version == "":
		return invalid("version", "required query parameter")
	case meta.SHA256 == "":
		return invalid("sha256", "required: 64 hex digits (sha256sum of the image)")
	}
	if meta.Source == "" {
		meta.Source = "upload"
	}
	status := http.StatusCreated
	if meta.ID != "" {
		if _, err := s.b.GetImage(meta.ID); err == nil {
			status = http.StatusOK // the backend returns it if it is the same image, else a conflict
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	body := countingReader{r: c.Request().Body, n: func(n int) { s.m.uploadBytes.Add(float64(n)) }}
	im, err := s.b.UploadImage(c.Request().Context(), meta, body, s.w(c, "image_uploaded", ""))
	if err != nil {
		return err
	}
	return c.JSON(status, imageView(im))
}

func (s *Server) deleteImage(c echo.Context) error {
	if err := s.b.DeleteImage(c.Request().Context(), c.Param("id"), s.w(c, "image_deleted", "")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// putManifest makes image {id} a release (ManifestRequest): the field
// rules are rules.CheckManifest's, the layer images' the lifecycle's
// (SetManifest). 200 with the image; the same manifest again is 200
// unchanged, another one 409.
func (s *Server) putManifest(c echo.Context) error {
	var req ManifestRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	im, err := s.b.SetManifest(c.Request().Context(), c.Param("id"), storeLayers(req.Layers), req.KubeadmVersion,
		s.w(c, req.Reason, ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, imageView(im))
}
