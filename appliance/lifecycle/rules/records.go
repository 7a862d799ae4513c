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
