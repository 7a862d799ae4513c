package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"kiln/api"
)

// ImageMeta describes an upload (the query of POST /v1/images and PUT
// /v1/images/{id}).
type ImageMeta struct {
	Name    string // required
	Version string // required
	// SHA256 is the hex SHA-256 of the raw content (for gzip and zstd: of
	// the decompressed bytes, which the agent writes and verifies). Required.
	SHA256 string
	Format string // raw (default), gzip or zstd
	// Size is the raw content's length in bytes (1..store.MaxImageSize);
	// required for gzip and zstd, optional for raw (0: not sent).
	Size   uint64
	Source string // free text, e.g. the file name ("upload" when empty)
}

func (m ImageMeta) values() url.Values {
	v := url.Values{"name": {m.Name}, "version": {m.Version}, "sha256": {m.SHA256}}
	if m.Format != "" {
		v.Set("format", m.Format)
	}
	if m.Size != 0 {
		v.Set("size", strconv.FormatUint(m.Size, 10))
	}
	if m.Source != "" {
		v.Set("source", m.Source)
	}
	return v
}

// UploadImage streams body (length bytes as sent, i.e. compressed for gzip
// and zstd; < 0 when unknown: chunked) as a new image whose ID the store
// picks (POST /v1/images, 201). The server hashes as it stores: a digest or
// size that does not match is 400 and nothing is kept. The context bounds
// the whole upload. Role admin.
func (c *Client) UploadImage(ctx context.Context, meta ImageMeta, body io.Reader, length int64) (api.Image, error) {
	var out api.Image
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/images", query: meta.values(),
		body: body, ctype: "application/octet-stream", length: length, expect: true}, &out)
	return out, err
}

// PutImage uploads under id (PUT /v1/images/{id}): created is true (201)
// for a new image; when the same image (name, version, format, sha256) is
// there already the answer is 200 with it, created false, and the body is
// not read; any other image under id is 409. Otherwise as UploadImage.
func (c *Client) PutImage(ctx context.Context, id string, meta ImageMeta, body io.Reader, length int64) (im api.Image, created bool, err error) {
	status, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/images/" + seg(id), query: meta.values(),
		body: body, ctype: "application/octet-stream", length: length, expect: true}, &im)
	return im, status == http.StatusCreated, err
}

// ListImages is GET /v1/images (all of them). Role viewer.
func (c *Client) ListImages(ctx context.Context) ([]api.Image, error) {
	var out api.ImageList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/images"}, &out)
	return out.Items, err
}

// GetImage is GET /v1/images/{id}. Role viewer; 404 not_found.
func (c *Client) GetImage(ctx context.Context, id string) (api.Image, error) {
	var out api.Image
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/images/" + seg(id)}, &out)
	return out, err
}

// DeleteImage is DELETE /v1/images/{id} (204); 409 image_in_use while a
// machine's claim names it. Role admin.
func (c *Client) DeleteImage(ctx context.Context, id string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/images/" + seg(id)}, nil)
	return err
}

// SetManifest makes image id a release (PUT /v1/images/{id}/manifest,
// issue 15): layers pinned by SHA-256, base first, and the kubeadm version
// it carries. The same manifest again is 200 unchanged; another is 409.
// Role admin.
func (c *Client) SetManifest(ctx context.Context, id string, req api.ManifestRequest) (api.Image, error) {
	var out api.Image
	_, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/images/" + seg(id) + "/manifest", json: req}, &out)
	return out, err
}
