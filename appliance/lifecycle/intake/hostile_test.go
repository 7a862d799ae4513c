package intake

import (
	"errors"
	"kiln/deploy/lab/testkit"
	"strings"
	"testing"
)

var hostile = testkit.HostileText

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
