package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"kiln/api"
)

// Backup is GET /v1/backup: it streams this node's backup archive (a tar:
// a consistent snapshot of the store and a manifest of images and
// environment files with their SHA-256; the image files too with
// opt.Images) into w and returns the bytes written. An error answer is an
// *Error; a stream cut short (the server failed midway) is an I/O error
// and what reached w is not a complete archive (`kiln restore` refuses
// it: its manifest, the last member, is missing). Role admin.
func (c *Client) Backup(ctx context.Context, w io.Writer, opt api.BackupOptions) (int64, error) {
	path := "/v1/backup"
	u := c.base + path
	if opt.Images {
		u += "?images=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", u, err)
	}
	req.Header.Set("Accept", api.BackupMediaType+", application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, readError(http.MethodGet, path, res)
	}
	n, err := io.Copy(w, res.Body)
	if err != nil {
		return n, fmt.Errorf("GET %s: the archive was cut off after %d bytes: %w", path, n, err)
	}
	return n, nil
}
