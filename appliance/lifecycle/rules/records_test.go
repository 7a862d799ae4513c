package rules

import (
	"errors"
	"strings"
	"testing"

	"kiln/store"
)

// TestCheckSiteAndRack: the site and rack field rules, each refusal naming
// its JSON field as a *FieldError.
func TestCheckSiteAndRack(t *testing.T) {
	long := strings.Repeat("x", MaxTextLen+1)
	for _, tc := range []struct {
		name  string
		err   error
		field string // "" = accepted
	}{
		{"site ok", CheckSite(store.Site{Meta: store.Meta{ID: "hall-1"}, Name: "Hall 1", Description: "ground floor"}), ""},
		{"site store-chosen id", CheckSite(store.Site{Name: "Hall 1"}), ""},
		{"site blank name", CheckSite(store.Site{Name: "  "}), "name"},
		{"site bad id", CheckSite(store.Site{Meta: store.Meta{ID: "-x"}, Name: "n"}), "id"},
		{"site id too long", CheckSite(store.Site{Meta: store.Meta{ID: strings.Repeat("a", MaxIDLen+1)}, Name: "n"}), "id"},
		{"site long name", CheckSite(store.Site{Name: long}), "name"},
		{"site bidi description", CheckSite(store.Site{Name: "n", Description: "a\u202eb"}), "description"},
		{"rack ok", CheckRack(store.Rack{Meta: store.Meta{ID: "r01"}, Site: "hall-1", Name: "R01", Row: "A", Units: MaxRackUnit}), ""},
		{"rack no name", CheckRack(store.Rack{Site: "s"}), "name"},
		{"rack no site", CheckRack(store.Rack{Name: "r"}), "site"},
		{"rack units", CheckRack(store.Rack{Name: "r", Site: "s", Units: MaxRackUnit + 1}), "units"},
		{"rack negative units", CheckRack(store.Rack{Name: "r", Site: "s", Units: -1}), "units"},
		{"rack bad id", CheckRack(store.Rack{Meta: store.Meta{ID: "r 1"}, Name: "r", Site: "s"}), "id"},
		{"rack control row", CheckRack(store.Rack{Name: "r", Site: "s", Row: "a\x1b[2J"}), "row"},
	} {
		var fe *FieldError
		switch {
		case tc.field == "" && tc.err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, tc.err)
		case tc.field != "" && (!errors.As(tc.err, &fe) || fe.Field != tc.field):
			t.Errorf("%s: %v, want a *FieldError naming %q", tc.name, tc.err, tc.field)
		}
	}
}

// TestCheckBMCAndImage: the BMC enrolment and image upload rules, each
// refusal naming its field, and their normalisation (driver auto, SHA-256
// lower-cased, format raw).
func TestCheckBMCAndImage(t *testing.T) {
	b := store.BMC{Address: "10.0.0.5:623", Username: "admin"}
	if err := CheckBMC(&b, "pw"); err != nil || b.Driver != "auto" {
		t.Fatalf("good BMC: %v, driver %q (want auto)", err, b.Driver)
	}
	sum := strings.Repeat("AB", 32)
	im := store.Image{Name: "ubuntu-24.04.raw", SHA256: " " + sum + " ", Version: "1"}
	if err := CheckImage(&im); err != nil || im.SHA256 != strings.ToLower(sum) || im.Format != "raw" {
		t.Fatalf("good image: %v, sha %q format %q", err, im.SHA256, im.Format)
	}
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"bmc no address", CheckBMC(&store.BMC{Username: "u"}, "p"), "address"},
		{"bmc bad address", CheckBMC(&store.BMC{Address: "a b", Username: "u"}, "p"), "address"},
		{"bmc driver", CheckBMC(&store.BMC{Address: "h", Username: "u", Driver: "telnet"}, "p"), "driver"},
		{"bmc no user", CheckBMC(&store.BMC{Address: "h"}, "p"), "username"},
		{"bmc control user", CheckBMC(&store.BMC{Address: "h", Username: "a\x00"}, "p"), "username"},
		{"bmc no password", CheckBMC(&store.BMC{Address: "h", Username: "u"}, ""), "password"},
		{"image name", CheckImage(&store.Image{Name: "../etc/passwd"}), "name"},
		{"image sha", CheckImage(&store.Image{Name: "a", SHA256: "xyz"}), "sha256"},
		{"image size", CheckImage(&store.Image{Name: "a", Size: store.MaxImageSize + 1}), "size"},
		{"image format", CheckImage(&store.Image{Name: "a", Format: "qcow2"}), "format"},
		{"image gzip no sha", CheckImage(&store.Image{Name: "a", Format: "gzip", Size: 1}), "sha256"},
		{"image zstd no size", CheckImage(&store.Image{Name: "a", Format: "zstd", SHA256: strings.Repeat("0", 64)}), "size"},
		{"image id", CheckImage(&store.Image{Meta: store.Meta{ID: "_x"}, Name: "a"}), "id"},
		{"image version", CheckImage(&store.Image{Name: "a", Version: "v\u2028"}), "version"},
	} {
		var fe *FieldError
		if !errors.As(tc.err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a *FieldError naming %q", tc.name, tc.err, tc.field)
		}
	}
}
