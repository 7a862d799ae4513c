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
