package intake

import (
	"errors"
	"strings"
	"testing"
)

// hostile are values that must never be stored as a name or free text (the
// same values as rules_test.go, which tests the rules themselves): they
// drive terminals (ESC, NUL, newlines), reorder what is shown (U+202E, the
// "Trojan Source" bidirectional controls) or are not text at all.
var hostile = map[string]string{
	"NUL":      "a\x00b",
	"ESC":      "esc\x1b[31mred",
	"newline":  "two\nlines",
	"CR":       "over\rwrite",
	"tab":      "a\tb",
	"DEL":      "a\x7fb",
	"C1 CSI":   "a\u009bb",
	"U+202E":   "rtl\u202eevil",
	"U+2066":   "iso\u2066late",
	"U+200F":   "rlm\u200fmark",
	"U+2028":   "line\u2028sep",
	"bad UTF8": "a\xffb",
}

// Import applies the same rules: every hostile name and free-text value is
// a bad row naming its column.
func TestImportRefusesHostileText(t *testing.T) {
	for name, v := range hostile {
		if strings.ContainsAny(v, "\n\r") {
			continue // a raw newline ends the CSV row; the JSON case below covers it
		}
		for _, col := range []string{"name", "serial", "vendor", "site", "rack"} {
			cols := map[string]string{"name": "n1", "serial": "S1", "vendor": "Dell", "site": "s", "rack": "r"}
			cols[col] = v
			csv := "name,serial,vendor,site,rack,macs\n" + cols["name"] + "," + cols["serial"] + "," + cols["vendor"] + "," +
				cols["site"] + "," + cols["rack"] + ",52:54:00:00:00:01\n"
			_, err := Parse(strings.NewReader(csv), FormatCSV)
			var rows *ErrRows
			if !errors.As(err, &rows) || rows.Rows[0].Field != col {
				t.Errorf("%s in %s: %v", name, col, err)
			}
		}
	}
	js := `[{"name":"two\nlines","macs":["52:54:00:00:00:01"]}]`
	_, err := Parse(strings.NewReader(js), FormatJSON)
	var rows *ErrRows
	if !errors.As(err, &rows) || rows.Rows[0].Field != "name" {
		t.Fatalf("JSON name with newline: %v", err)
	}
}
