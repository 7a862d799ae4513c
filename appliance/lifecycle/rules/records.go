package rules

import (
	"regexp"
	"strings"

	"kiln/store"
)

// MaxIDLen bounds a record ID an operator chooses (sites, racks, images).
const MaxIDLen = 63

// idRe is a chosen record ID: letters, digits, '.', '_' and '-', starting
// with a letter or digit, at most MaxIDLen bytes.
var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// CheckID checks an ID an operator chooses for a site, rack or image
// (empty: the store picks one): 1 to MaxIDLen bytes of letters, digits,
// '.', '_' and '-', starting with a letter or digit. field names the value
// in the error ("id").
func CheckID(field, id string) error {
	if id != "" && !idRe.MatchString(id) {
		return bad(field, "%q: use 1 to %d letters, digits, '.', '_' and '-', starting with a letter or digit", id, MaxIDLen)
	}
	return nil
}

// CheckSite checks a site record (POST and PUT /v1/sites): Name required
// (not blank) and at most MaxTextLen bytes of text, Description text of at
// most MaxDescriptionLen bytes, a chosen ID by CheckID. Errors:
// *FieldError naming the JSON field ("name", "description", "id").
func CheckSite(s store.Site) error {
	if strings.TrimSpace(s.Name) == "" {
		return bad("name", "required")
	}
	return firstErr(CheckID("id", s.ID), text("name", s.Name, MaxTextLen),
		text("description", s.Description, MaxDescriptionLen))
}

// CheckRack checks a rack record (POST and PUT /v1/racks): Name and Site
// required (not blank), Units 0..MaxRackUnit (rack units, U; 0 unknown),
// Name, Site and Row text of at most MaxTextLen bytes, a chosen ID by
// CheckID. Errors: *FieldError naming the JSON field ("name", "site",
// "units", "id", "row").
func CheckRack(r store.Rack) error {
	switch {
	case strings.TrimSpace(r.Name) == "":
		return bad("name", "required")
	case strings.TrimSpace(r.Site) == "":
		return bad("site", "required")
	case r.Units < 0 || r.Units > MaxRackUnit:
		return bad("units", "%d: must be 0..%d (rack units)", r.Units, MaxRackUnit)
	}
	return firstErr(CheckID("id", r.ID), text("name", r.Name, MaxTextLen), text("site", r.Site, MaxTextLen),
		text("row", r.Row, MaxTextLen))
}

// CheckBMC checks a BMC enrolment (POST /v1/machines/{id}/bmc) and
// defaults Driver to "auto": Address required, host or host:port
// (CheckHostPort); Driver by CheckBMCDriver; Username required, text of at
// most MaxTextLen bytes; password required. Errors: *FieldError naming
// "address", "driver", "username" or "password".
func CheckBMC(b *store.BMC, password string) error {
	if b.Driver == "" {
		b.Driver = "auto"
	}
	switch {
	case b.Address == "":
		return bad("address", "required: host or host:port of the BMC")
	case CheckHostPort(b.Address) != nil:
		return bad("address", "%v", CheckHostPort(b.Address))
	case CheckBMCDriver(b.Driver) != nil:
		return bad("driver", "%v", CheckBMCDriver(b.Driver))
	case b.Username == "":
		return bad("username", "required")
	case CheckText(b.Username, MaxTextLen) != nil:
		return bad("username", "%v", CheckText(b.Username, MaxTextLen))
	case password == "":
		return bad("password", "required")
	}
	return nil
}

// MaxImageNameLen bounds an image's Name, which is also its catalog file
// name (served under /images/{name}).
const MaxImageNameLen = 128

// imageNameRe is an image name: a file name of letters, digits, '.', '_'
// and '-', starting with a letter or digit.
var imageNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckImage checks the metadata of an image upload and normalises it in
// place (SHA256 trimmed and lower-cased, Format defaulting to "raw"): Name
// 1 to MaxImageNameLen bytes of letters, digits, '.', '_' and '-', starting
// with a letter or digit; SHA256 empty or 64 hex digits; Size at most
// store.MaxImageSize bytes; Format by CheckImageFormat, and a gzip or zstd
// image needs SHA256 and Size (of its decompressed content); a chosen ID by
// CheckID; Version text of at most MaxTextLen bytes, Source of at most
// MaxDescriptionLen. Errors: *FieldError naming the upload's query
// parameter ("name", "sha256", "size", "format", "id", "version",
// "source").
func CheckImage(im *store.Image) error {
	im.SHA256 = strings.ToLower(strings.TrimSpace(im.SHA256))
	if im.Format == "" {
		im.Format = "raw"
	}
	switch {
	case !imageNameRe.MatchString(im.Name):
		return bad("name", "%q: use 1 to %d letters, digits, '.', '_' and '-', starting with a letter or digit",
			im.Name, MaxImageNameLen)
	case im.SHA256 != "" && !sha256Re.MatchString(im.SHA256):
		return bad("sha256", "%q: want 64 hex digits (sha256sum of the image)", im.SHA256)
	case im.Size > store.MaxImageSize:
		return bad("size", "%d: more than the largest image, %d bytes (16 TiB)", im.Size, uint64(store.MaxImageSize))
	case CheckImageFormat(im.Format) != nil:
		return bad("format", "%v", CheckImageFormat(im.Format))
	case im.Format != "raw" && im.SHA256 == "":
		return bad("sha256", "required for a %s image: the SHA-256 of its decompressed content", im.Format)
	case im.Format != "raw" && im.Size == 0:
		return bad("size", "required for a %s image: the length in bytes of its decompressed content", im.Format)
	}
	return firstErr(CheckID("id", im.ID), text("version", im.Version, MaxTextLen),
		text("source", im.Source, MaxDescriptionLen))
}

var sha256Re = regexp.MustCompile(`^[0-9a-f]{64}$`)
